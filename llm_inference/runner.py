"""Run every (task, batch size) point of one invocation and write one run record per point.

Record layout: a single point writes <out-dir>/run_record.json (what JUBE jobs read); a sweep
writes <out-dir>/<task>_bs<N>/run_record.json, each point with its own in-process jpwr output
beside it, so `joulebench report <out-dir>` finds every record and its trace. The model is built once
and reused by all points. Work unit: `output_tokens` (generated tokens, padding never counted).

Tensor parallelism (`--tensor-parallel N`, N processes from torchrun on one node): every rank builds its part of
the model on its own GPU (llm_inference/shards.py) and runs the same calls; rank 0 decides when a window ends
and every rank acts on it; the node's sampler meters the job's GPUs and global rank 0 writes the record, whose
`per_rank` block says what one rank holds and admits (its batch and KV cache).

Status (joulebench.lifecycle, as in every driver): an exception gives FAILED for the point it happened in
(record still written; the next points still run, so one batch size that does not fit loses only its own
point); SIGTERM or SIGUSR1 ends the point at its next call boundary as TIMEOUT and ends the sweep. The exit
code is the first point's that did not end OK (joulebench.record.EXIT_CODES).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

import torch

from joulebench.figures import work_devices
from joulebench.latents import steady_latents
from joulebench.launch import LaunchEnv
from joulebench.lifecycle import Lifecycle, sweep
from joulebench.peaks import peak_flops
from joulebench.record import RunRecord, steady_metrics
from joulebench.record_types import HardwareBlock, InferenceRunMetrics
from joulebench.sizing import ASSUMED_UPDATE_S, WindowLength, window_length
from joulebench.torch_device import hardware_info
from jpwr import IdleBaseline, WindowMeter
from jpwr.output import readable
from jpwr.trace import TraceData, load_trace
from llm_inference import memory, metrics, shards, tensor_parallel, validation
from llm_inference.config import CPU_WINDOW_S, InferenceConfig
from llm_inference.continuous_engine import ContinuousEngine
from llm_inference.decode_choice import DEFAULT_OBJECTIVE, meter_probe
from llm_inference.engine import DTYPES, Engine, build_model, make_inputs
from llm_inference.hf_engine import HFEngine
from llm_inference.measure import PointWindows, own_decision, run_point
from llm_inference.presets import ModelPreset
from llm_inference.static_engine import StaticEngine
from llm_inference.tasks import TASKS, draw_batches
from llm_inference.tensor_parallel import TensorParallel

WORK_UNIT = "output_tokens"
SUMMARY_EXTRA = ("batch_size", "requests_per_s", "energy_per_output_token_j", "energy_per_request_j",
                 "decode_energy_per_token_j", "decode_energy_per_token_error_bound_j", "ttft_median_s",
                 "per_token_latency_median_s", "utilization_gpu")
WARMUP_NOTE = "the warmup window (first prefill and generate calls) is excluded from every figure"


def _log(text: str) -> None:
    print(f"[llm_inference] {text}", flush=True)


@dataclasses.dataclass(frozen=True)
class Point:
    task: str
    batch_size: int
    out_dir: Path
    run_id: str


def plan_points(cfg: InferenceConfig) -> list[Point]:
    base = cfg.run_id
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
                   latents_reason: str | None, estimate_gib: float) -> InferenceRunMetrics:
    result: InferenceRunMetrics = {"work_unit": WORK_UNIT}
    devices = work_devices(record)
    if point is not None:
        peak = peak_flops(str(record.hardware.get("device_name", "")), precision)
        result = {**steady_metrics(point.steady, work_unit=WORK_UNIT, devices=devices,
                                   flops_per_unit=_flops_per_output_token(shape, point), peak_flops_per_device=peak)}
        result.update(metrics.rate_metrics(point))
        result.update(metrics.latency_metrics(point.timings))
        result.update(metrics.energy_metrics(point))
        result.update({"prefill_passes": point.prefill_passes, "steady_passes": point.steady_passes,
                       "warmup_duration_s": point.warmup.duration_s, "engine_setup_s": point.setup_s})
    steady = latents.get("steady", {})
    used = steady.get("memory_used_bytes")
    sm = steady.get("sm_clock_hz")
    result.update({
        "batch_size": batch_size, "global_batch_size": batch_size, "devices": devices,
        "parameters": shape.parameter_count(),
        "flops_formula": "2 * parameters * (input + decode tokens) / output tokens (forward only, no attention term)",
        "warmup_note": WARMUP_NOTE, "latents": latents or None, "latents_unavailable_reason": latents_reason,
        "utilization_gpu": steady.get("utilization_gpu"), "memory_used_gib": None if used is None else used / 1024**3,
        "sm_clock_mhz": None if sm is None else sm / 1e6, "memory_estimate_gib": estimate_gib,
        "peak_memory_allocated_gib": torch.cuda.max_memory_allocated() / 1024**3 if device.type == "cuda" else None,
    })
    return result


def window_seconds(steady_seconds: float | None, meter: WindowMeter, device: torch.device) -> WindowLength:
    """How long a measured window runs: --steady-seconds, the CPU default, or jpwr's bound rule."""
    if steady_seconds is None and device.type == "cpu":
        return WindowLength(CPU_WINDOW_S, "cpu default", ASSUMED_UPDATE_S, "assumed (CPU run)", None, None)
    return window_length(meter.live(span_s=2.0), steady_seconds)


class Described(Protocol):
    name: str

    def describe(self) -> dict[str, object]: ...


EngineT = TypeVar("EngineT", bound=Described)


class BuiltModel(Generic[EngineT]):
    """The engine, built once, inside the first point's run: a build that fails is that point's FAILED record."""

    def __init__(self, make: Callable[[], EngineT], shape: ModelPreset, precision: str, device: torch.device,
                 checkpoint: str | None) -> None:
        self.make, self.shape, self.precision, self.device, self.checkpoint = make, shape, precision, device, checkpoint
        self.engine: EngineT | None = None
        self.build_s: float | None = None

    def get(self) -> EngineT:
        if self.engine is None:
            started = time.monotonic()
            self.engine = self.make()
            self.build_s = time.monotonic() - started
            _log(f"model {self.shape.name} ({self.shape.parameter_count() / 1e9:.2f}B parameters, {self.precision}, "
                 f"{'checkpoint' if self.checkpoint else 'random weights'}) built on {self.device} for engine "
                 f"{self.engine.name} in {self.build_s:.1f} s")
        return self.engine

    def describe(self) -> dict[str, Any] | None:
        return None if self.engine is None else {**self.engine.describe(), "build_s": self.build_s}


def per_rank(cfg: InferenceConfig, shape: ModelPreset, precision: str, batch_size: int,
             memory_gib: float | None) -> dict[str, Any]:
    """What one rank holds and admits (the whole device at --tensor-parallel 1): its memory estimate at this batch
    size, its KV cache, and the largest power-of-two batch its memory admits (n/a where the memory is unknown).
    Every rank holds every row (the heads are split, not the rows): a rank's batch is the job's."""
    estimate = validation.run_estimate(cfg, shape, precision, batch_size)
    admitted = None if memory_gib is None else memory.largest_fitting_batch(
        lambda n: validation.run_estimate(cfg, shape, precision, n).total_gib, memory_gib)
    return {"tensor_parallel": cfg.tensor_parallel, "heads": shape.num_attention_heads // cfg.tensor_parallel,
            "kv_heads": shape.num_key_value_heads // cfg.tensor_parallel, "memory_estimate_gib": estimate.total_gib,
            "weights_gib": estimate.weights_gib, "kv_cache_gib": estimate.kv_cache_gib, "admitted_batch": admitted}


def _run_one(life: Lifecycle, cfg: InferenceConfig, spec: Point, model: BuiltModel[Engine], shape: ModelPreset,
             precision: str, device: torch.device, hardware: HardwareBlock,
             idle: IdleBaseline | None, tp: TensorParallel | None) -> tuple[RunRecord, IdleBaseline | None]:
    """One point, one record: the idle baseline is measured before the first point and reused by the others."""
    task = TASKS[spec.task]
    weights = "random (seeded)" if tp is None else "random (seeded per block, the same at every tensor-parallel size)"
    config = {**cfg.to_dict(), "model": cfg.preset if cfg.checkpoint is None else shape.name, "task": spec.task,
              "batch_size": spec.batch_size, "precision": precision, "out_dir": str(spec.out_dir),
              "weights": "checkpoint" if cfg.checkpoint else weights, "model_source": shape.source}
    batches = draw_batches(task, spec.batch_size, cfg.num_batches, cfg.seed, cfg.output_length)
    config["batches"] = [{"input_lengths": list(b.input_lengths), "output_length": b.output_length} for b in batches]
    memory_gib = hardware.get("device_memory_gib")
    config["per_rank"] = per_rank(cfg, shape, precision, spec.batch_size,
                                  memory_gib if isinstance(memory_gib, float) else None)
    estimate = config["per_rank"]["memory_estimate_gib"]
    gather = None if tp is None else tp.gather_objects
    stop = life.stop.local_reason if tp is None else lambda: tp.any_reason(life.stop.local_reason())
    point: PointWindows | None = None

    def point_metrics(record: RunRecord) -> InferenceRunMetrics:
        latents, reason = _trace_latents(spec.out_dir / "jpwr") if cfg.energy_methods else ({}, None)
        if not cfg.energy_methods:
            reason = "no in-process sampler; `joulebench report` reads the latents from a trace beside the record"
        record.config["engine_detail"] = model.describe()
        return _point_metrics(record, point, shape, precision, spec.batch_size, device, latents, reason, estimate)

    with life.run(spec.run_id, spec.out_dir, config, metrics=point_metrics, gather=gather, hardware=hardware,
                  log_to=cfg.log_to) as run:
        engine = model.get()
        meter = run.open_meter(sync=engine.sync, methods=cfg.energy_methods)
        if isinstance(engine, StaticEngine):  # this run's sampler meters each decode variant's replays
            engine.power_probe = meter_probe(meter)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        inputs = [make_inputs(b, shape.vocab_size, cfg.seed + i, device) for i, b in enumerate(batches)]
        idle = run.idle_baseline(cfg.idle_baseline, device.type == "cuda", gather, reuse=idle)
        window_s = window_seconds(cfg.steady_seconds, meter, device)
        run.record.meter["steady_seconds"] = window_s.to_dict()
        point = run_point(engine, meter, batches, inputs, cfg.warmup_batches, window_s.seconds, stop,
                          own_decision if tp is None else tp.from_rank_zero)
        run.step_times(point.pass_times_s(), "passes over the point's batches (the same work each)")
    return run.record, idle


def make_engine(cfg: InferenceConfig, shape: ModelPreset, precision: str, device: torch.device,
                tp: TensorParallel | None) -> Engine:
    """The transformers model, used by `hf` as it is and by `static` as the source of its weights; split over
    ranks, the static engine on this rank's part, built directly on its GPU."""
    if tp is not None:
        engine = StaticEngine(shards.rank_model(shape, cfg.checkpoint, DTYPES[precision], device, cfg.seed, tp),
                              device, tuning=cfg.decode_tuning)
    else:
        model = build_model(shape, cfg.checkpoint, precision, cfg.attention, device, cfg.seed)
        if cfg.engine == "hf":
            return HFEngine(model, device)
        engine = compact_engine(StaticEngine, model, device, cfg.decode_tuning)
    engine.objective = cfg.objective or DEFAULT_OBJECTIVE
    return engine


CompactT = TypeVar("CompactT", StaticEngine, ContinuousEngine)


def compact_engine(kind: type[CompactT], model: torch.nn.Module, device: torch.device, tuning: str) -> CompactT:
    """An engine on compact model code, its weights taken from the transformers model, which is then dropped."""
    engine = kind.from_transformers(model, device, tuning)
    del model  # frees the separate Q/K/V and gate/up matrices (fused copies in the engine; the rest is shared)
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return engine


def shown(metrics: Mapping[str, Any], key: str, scale: float = 1.0) -> str:
    """A figure for a progress line, for people (13686 tokens/s, not 1.369e+04), n/a where it is missing."""
    value = metrics.get(key)
    return readable(None if value is None else value * scale)


def _progress(record: RunRecord) -> str:
    m = record.metrics

    def show(key: str, scale: float = 1.0) -> str:
        return shown(m, key, scale)

    return (f"{record.config['task']} bs={record.config['batch_size']}: {record.status}, "
            f"{show('output_tokens_per_s')} tokens/s, {show('requests_per_s')} req/s, "
            f"{show('energy_per_output_token_j')} J/token (decode {show('decode_energy_per_token_j')}), "
            f"TTFT {show('ttft_median_s', 1e3)} ms, {show('per_token_latency_median_s', 1e3)} ms/token")


def join(ranks: int, launch: LaunchEnv, device: torch.device) -> tuple[TensorParallel | None, torch.device]:
    """This process's tensor-parallel place and device: its node-local GPU (N dividing the GPUs the node shows),
    or the CPU over gloo; (None, device) for one process."""
    if ranks == 1:
        if device.type == "cuda":
            torch.cuda.set_device(0)
        return None, device
    if device.type == "cuda":
        validation.check_node_devices(ranks, torch.cuda.device_count())
        device = torch.device("cuda", launch.local_rank)
        torch.cuda.set_device(device)
    return tensor_parallel.start(launch, device), device


def run(cfg: InferenceConfig, shape: ModelPreset, launch: LaunchEnv, device: torch.device) -> int:
    """All points; returns the exit code. Config and launch are already validated."""
    precision = validation.resolve_precision(cfg.precision, device.type)
    tp, device = join(cfg.tensor_parallel, launch, device)
    if tp is not None:  # each process drew its own run id (and default directory): rank 0's name the run
        run_id, out_dir = tp.from_rank_zero((cfg.run_id, cfg.out_dir))
        cfg = dataclasses.replace(cfg, run_id=run_id, out_dir=out_dir)
    try:
        return _sweep(cfg, shape, launch, device, precision, tp)
    finally:
        tensor_parallel.finish(tp)


def _sweep(cfg: InferenceConfig, shape: ModelPreset, launch: LaunchEnv, device: torch.device, precision: str,
           tp: TensorParallel | None) -> int:
    hardware = hardware_info(device, launch)
    validation.check_memory(cfg, shape, precision, hardware.get("device_memory_gib"),
                            "the device" if tp is None else "each rank's device")
    with Lifecycle("llm_inference", launch, cfg.exit_duration_mins, software_extra=("transformers",)) as life:
        model = BuiltModel(lambda: make_engine(cfg, shape, precision, device, tp), shape, precision, device,
                           cfg.checkpoint)

        def one(spec: Point, idle: IdleBaseline | None, _say: Callable[[str], None]
                ) -> tuple[RunRecord, IdleBaseline | None]:
            return _run_one(life, cfg, spec, model, shape, precision, device, hardware, idle, tp)

        def ends_sweep(record: RunRecord) -> bool:
            if model.engine is None:
                return True  # the model could not be built: no further point can finish
            if record.status == "FAILED" and device.type == "cuda":
                torch.cuda.empty_cache()  # e.g. out of memory at a large batch: the smaller points stay valid
            return False

        return sweep(life, plan_points(cfg), lambda spec: f"{spec.task} bs={spec.batch_size}", one,
                     _progress, _log, SUMMARY_EXTRA, ends_sweep)
