"""Run every (task, batch size) point of one invocation and write one run record per point.

Record layout: a single point writes <out-dir>/run_record.json (what JUBE jobs read); a sweep
writes <out-dir>/<task>_bs<N>/run_record.json, each point with its own in-process jpwr output
beside it, so `joulebench report <out-dir>` finds every record and its trace. The model is built once
and reused by all points. Work unit: `output_tokens` (generated tokens, padding never counted).

Status: an exception gives FAILED for the point it happened in (record still written; the next
points still run, so one batch size that does not fit loses only its own point); SIGTERM (Slurm's
time limit) gives TIMEOUT and ends the sweep. The exit code is 1 when any point was not OK.
"""

from __future__ import annotations

import dataclasses
import signal
import sys
import time
import traceback
import uuid
from pathlib import Path
from typing import Any

import torch

from joulebench.latents import steady_latents
from joulebench.launch import LaunchEnv
from joulebench.peaks import peak_flops
from joulebench.record import RunRecord, software_versions, steady_metrics, summary_line, write_run_record
from joulebench.sizing import ASSUMED_UPDATE_S, WindowLength, window_length
from joulebench.torch_device import hardware_info
from jpwr import IdleBaseline, TraceData, WindowMeter, load_trace
from llm_inference import memory, metrics, validation
from llm_inference.config import CPU_WINDOW_S, InferenceConfig
from llm_inference.engine import Engine, build_model, make_inputs
from llm_inference.hf_engine import HFEngine
from llm_inference.measure import PointWindows, run_point
from llm_inference.presets import ModelPreset
from llm_inference.static_engine import StaticEngine
from llm_inference.tasks import TASKS, draw_batches, longest_sequence

WORK_UNIT = "output_tokens"
SUMMARY_EXTRA = ("batch_size", "requests_per_s", "energy_per_output_token_j", "energy_per_request_j",
                 "decode_energy_per_token_j", "decode_energy_per_token_error_bound_j", "ttft_median_s",
                 "per_token_latency_median_s", "utilization_gpu")
WARMUP_NOTE = "the warmup window (first prefill and generate calls) is excluded from every figure"


class Stopped(Exception):
    """SIGTERM arrived (Slurm time limit or cancellation)."""


def _on_sigterm(signum: int, _frame: object) -> None:
    raise Stopped(f"{signal.Signals(signum).name} received (Slurm time limit or job cancelled)")


def _log(text: str) -> None:
    print(f"[llm_inference] {text}", flush=True)


@dataclasses.dataclass(frozen=True)
class Point:
    task: str
    batch_size: int
    out_dir: Path
    run_id: str


def plan_points(cfg: InferenceConfig) -> list[Point]:
    base = cfg.run_id or f"inf-{cfg.preset}-{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:6]}"
    single = len(cfg.points) == 1
    return [Point(task, size, Path(cfg.out_dir) if single else Path(cfg.out_dir) / f"{task}_bs{size}",
                  base if single else f"{base}-{task}-bs{size}") for task, size in cfg.points]


def _trace_latents(jpwr_dir: Path) -> tuple[dict[str, dict[str, float]], str | None]:
    """Latent metrics per window from the in-process sampler's trace (written when it stopped)."""
    nodes = sorted(p.parent for p in jpwr_dir.glob("*/trace.h5"))
    if not nodes:
        return {}, ("no in-process jpwr trace (under an external sampler the trace is written when it stops; "
                    "`joulebench report` reads it from beside the record)")
    traces: list[TraceData] = [load_trace(node) for node in nodes]
    return {name: steady_latents(traces, name) for name in ("prefill", "steady")}, None


def _flops_per_output_token(shape: ModelPreset, point: PointWindows) -> float | None:
    """Forward FLOPs (2 per weight per processed token, attention scores not counted) per output token."""
    work = point.steady.work
    processed = work.get("input_tokens", 0) + work.get("decode_tokens", 0)
    return 2.0 * shape.parameter_count() * processed / work["output_tokens"] if work.get("output_tokens") else None


def _point_metrics(record: RunRecord, point: PointWindows | None, shape: ModelPreset, precision: str,
                   batch_size: int, device: torch.device, latents: dict[str, dict[str, float]],
                   latents_reason: str | None, estimate_gib: float) -> dict[str, Any]:
    result: dict[str, Any] = {"work_unit": WORK_UNIT}
    if point is not None:
        peak = peak_flops(str(record.hardware.get("device_name", "")), precision)
        result = steady_metrics(point.steady, work_unit=WORK_UNIT, devices=1,
                                flops_per_unit=_flops_per_output_token(shape, point), peak_flops_per_device=peak)
        result.update(metrics.rate_metrics(point))
        result.update(metrics.latency_metrics(point.timings))
        result.update(metrics.energy_metrics(point))
        result.update(prefill_passes=point.prefill_passes, steady_passes=point.steady_passes,
                      warmup_duration_s=point.warmup.duration_s, engine_setup_s=point.setup_s)
    steady = latents.get("steady", {})
    used = steady.get("memory_used_bytes")
    sm = steady.get("sm_clock_hz")
    result.update(
        batch_size=batch_size, global_batch_size=batch_size, devices=1, parameters=shape.parameter_count(),
        flops_formula="2 * parameters * (input + decode tokens) / output tokens (forward only, no attention term)",
        warmup_note=WARMUP_NOTE, latents=latents or None, latents_unavailable_reason=latents_reason,
        utilization_gpu=steady.get("utilization_gpu"), memory_used_gib=None if used is None else used / 1024**3,
        sm_clock_mhz=None if sm is None else sm / 1e6, memory_estimate_gib=estimate_gib,
        peak_memory_allocated_gib=torch.cuda.max_memory_allocated() / 1024**3 if device.type == "cuda" else None,
    )
    return result


def _window_seconds(cfg: InferenceConfig, meter: WindowMeter, device: torch.device) -> WindowLength:
    """How long the prefill and steady windows run: --steady-seconds, the CPU default, or jpwr's bound rule."""
    if cfg.steady_seconds is None and device.type == "cpu":
        return WindowLength(CPU_WINDOW_S, "cpu default", ASSUMED_UPDATE_S, "assumed (CPU run)", None, None)
    return window_length(meter.live(span_s=2.0), cfg.steady_seconds)


def _idle_baseline(cfg: InferenceConfig, meter: WindowMeter, device: torch.device,
                   first: IdleBaseline | None) -> IdleBaseline:
    """The run's idle power: measured once, before the first point (cooldown, then an `idle` window), and
    reused by the later points, so every window's energy splits into idle and dynamic parts alike."""
    if first is None:
        return meter.take_idle_baseline(cfg.idle_baseline, device.type == "cuda")
    meter.idle = first
    return first


def _run_one(cfg: InferenceConfig, spec: Point, engine: Engine, build_s: float, shape: ModelPreset,
             precision: str, launch: LaunchEnv, device: torch.device, hardware: dict[str, object],
             idle: IdleBaseline | None) -> tuple[RunRecord, IdleBaseline | None]:
    task = TASKS[spec.task]
    config = {**cfg.to_dict(), "model": cfg.preset if cfg.checkpoint is None else shape.name, "task": spec.task,
              "batch_size": spec.batch_size, "precision": precision, "out_dir": str(spec.out_dir),
              "weights": "checkpoint" if cfg.checkpoint else "random (seeded)", "model_source": shape.source}
    record = RunRecord(benchmark="llm_inference", run_id=spec.run_id, config=config, launch=launch.to_dict(),
                       hardware=dict(hardware), software=software_versions(extra=("transformers",)))
    batches = draw_batches(task, spec.batch_size, cfg.num_batches, cfg.seed, cfg.output_length)
    record.config["batches"] = [{"input_lengths": list(b.input_lengths), "output_length": b.output_length}
                                for b in batches]
    estimate = memory.estimate_memory(shape, precision, spec.batch_size, task.input_length.high,
                                      longest_sequence(task, cfg.output_length), cfg.engine).total_gib
    meter = WindowMeter.open(launch, sync=engine.sync, methods=cfg.energy_methods, out_dir=spec.out_dir / "jpwr")
    point: PointWindows | None = None
    try:
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        inputs = [make_inputs(b, shape.vocab_size, cfg.seed + i, device) for i, b in enumerate(batches)]
        measured_here = idle is None
        idle = _idle_baseline(cfg, meter, device, idle)
        record.meter["idle_baseline"] = {**idle.to_dict(), "measured": "before this point" if measured_here else
                                         "before the first point of this invocation"}
        window_s = _window_seconds(cfg, meter, device)
        record.meter["steady_seconds"] = window_s.to_dict()
        point = run_point(engine, meter, batches, inputs, cfg.warmup_batches, window_s.seconds)
        meter.attach_energy()  # energy and its idle/dynamic split on every window (single process)
        record.windows = meter.windows
    except BaseException as exc:
        record.status = "TIMEOUT" if isinstance(exc, Stopped) else "FAILED"
        record.status_reason = f"{type(exc).__name__}: {exc}"
        record.windows = meter.windows
        traceback.print_exc()
    finally:
        has_sampler = meter.has_sampler
        meter.close()
    latents, reason = _trace_latents(spec.out_dir / "jpwr") if cfg.energy_methods else ({}, None)
    if not cfg.energy_methods:
        reason = "no in-process sampler; `joulebench report` reads the latents from a trace beside the record"
    record.metrics = _point_metrics(record, point, shape, precision, spec.batch_size, device, latents, reason,
                                    estimate)
    record.config["engine_detail"] = {**engine.describe(), "build_s": build_s}
    record.meter.update({"sampler": has_sampler, "energy_methods": cfg.energy_methods,
                         "in_process_out_dir": str(spec.out_dir / "jpwr") if cfg.energy_methods else None})
    write_run_record(spec.out_dir / "run_record.json", record)
    return record, idle


def _make_engine(cfg: InferenceConfig, shape: ModelPreset, precision: str, device: torch.device) -> Engine:
    """The transformers model, used by `hf` as it is and by `static` as the source of its weights."""
    model = build_model(shape, cfg.checkpoint, precision, cfg.attention, device, cfg.seed)
    if cfg.engine == "hf":
        return HFEngine(model, device)
    engine = StaticEngine.from_transformers(model, device)
    del model  # frees the separate Q/K/V and gate/up matrices (fused copies in the engine; the rest is shared)
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return engine


def _progress(record: RunRecord) -> str:
    m = record.metrics

    def show(key: str, scale: float = 1.0, digits: int = 4) -> str:
        value = m.get(key)
        return "n/a" if value is None else f"{value * scale:.{digits}g}"

    return (f"{record.config['task']} bs={record.config['batch_size']}: {record.status}, "
            f"{show('output_tokens_per_s')} tokens/s, {show('requests_per_s')} req/s, "
            f"{show('energy_per_output_token_j')} J/token (decode {show('decode_energy_per_token_j')}), "
            f"TTFT {show('ttft_median_s', 1e3)} ms, {show('per_token_latency_median_s', 1e3)} ms/token")


def run(cfg: InferenceConfig, shape: ModelPreset, launch: LaunchEnv, device: torch.device) -> int:
    """All points; returns the exit code. Config and launch are already validated."""
    signal.signal(signal.SIGTERM, _on_sigterm)
    precision = validation.resolve_precision(cfg.precision, device.type)
    hardware = hardware_info(device, launch)
    validation.check_memory(cfg, shape, precision, hardware.get("device_memory_gib"))  # type: ignore[arg-type]
    if device.type == "cuda":
        torch.cuda.set_device(0)
    started = time.monotonic()
    engine = _make_engine(cfg, shape, precision, device)
    build_s = time.monotonic() - started
    _log(f"model {shape.name} ({shape.parameter_count() / 1e9:.2f}B parameters, {precision}, "
         f"{'checkpoint' if cfg.checkpoint else 'random weights'}) built on {device} for engine {engine.name} in "
         f"{build_s:.1f} s")
    records = []
    idle: IdleBaseline | None = None
    for spec in plan_points(cfg):
        record, idle = _run_one(cfg, spec, engine, build_s, shape, precision, launch, device, hardware, idle)
        records.append(record)
        _log(_progress(record))
        if record.status == "TIMEOUT":
            break  # the job is being stopped: no further point can finish
        if record.status == "FAILED" and device.type == "cuda":
            torch.cuda.empty_cache()  # e.g. out of memory at a large batch: the smaller points stay valid
    for record in records:
        print(summary_line(record, SUMMARY_EXTRA), flush=True)
    sys.stdout.flush()
    return 0 if all(r.status == "OK" for r in records) else 1
