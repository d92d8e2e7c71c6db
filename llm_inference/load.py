"""`python -m llm_inference load`: an open-loop load on the continuous-batching engine, one run record per rate.

Per rate (or per trace): the requests (warm-up first, then the counted ones), one measured window `steady`, the
per-request table beside the record (joulebench.requests_table) and the record's figures:

* finite rates and traces, MLPerf's rule: the window runs from the first counted arrival to the last; the
  requests arriving inside it count for latencies (they finish after it if they must: the loop drains them);
  a request in flight at an edge contributes only the tokens it produced inside the window;
* `--rate max`: the window starts at the first moment every slot is busy (warm-up requests done) and lasts
  the window length; admission stops at its end (the queue "empties") and the running requests drain.
  Counted for latencies: the requests admitted inside it.
J/output token = the window's energy / the output tokens produced inside it. Latencies come from the steps'
device stamps (serve_loop), SLO goodput from request_metrics.

The model is built once; the slots' cache and captured steps are set up once (`prepare`, outside every window)
and reused by every rate. Layout: one rate writes <out-dir>/run_record.json; a sweep <out-dir>/rate_<r>/.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from joulebench.launch import LaunchEnv
from joulebench.lifecycle import Lifecycle, RunFailed, StopRequested
from joulebench.progress import Heartbeat
from joulebench.record import RunRecord, steady_metrics
from joulebench.requests_table import FILE_NAME, REQUEST_COLUMNS, STATUSES, RequestsTable, save_requests
from joulebench.torch_device import hardware_info
from jpwr import IdleBaseline, Window, WindowMeter
from llm_inference import request_metrics, validation
from llm_inference.arrivals import Request, arrival_times, draw_requests
from llm_inference.continuous_engine import ContinuousEngine
from llm_inference.engine import build_model, request_prompt
from llm_inference.load_config import WARMUP_ARRIVAL_S, LoadConfig, rate_label
from llm_inference.presets import ModelPreset
from llm_inference.runner import BuiltModel, compact_engine, shown, window_seconds
from llm_inference.serve_loop import DECODE, PREFILL, ArrivalWindow, SaturatedWindow, ServeLog, ServeLoop, WindowRule
from llm_inference.serving_energy import Sweep, serving_energy
from llm_inference.tasks import TASKS

WORK_UNIT = "output_tokens"
SUMMARY_EXTRA = ("rate", "max_concurrency", "requests_per_s", "energy_per_output_token_j", "ttft_p90_s",
                 "tpot_p90_s", "goodput_requests_per_s")
CPU_WARMUP_ARRIVAL_S = 1.0
# The per-request fit's segments are bounded by the energy counter's updates (H100: ~20-100 ms): an in-process
# sampler reads it at least twice per update (an NVML counter read costs ~4 ms of the sampler's own thread).
COUNTER_READ_S = 0.05
COUNTER_SETTLE_S = 0.3  # idle after the load: the counter's next update (H100: <= 100 ms) covers the last step
MAX_CHUNK = 4096  # `--rate max` draws its endless queue in chunks of this many requests
NO_WINDOW = ("the load ended before its window opened (no moment with every slot busy after the warm-up requests, or "
             "no counted arrival): raise --requests or lower --max-concurrency")


def _log(text: str) -> None:
    print(f"[llm_inference] {text}", flush=True)


class Plan:
    """One rate's requests and window rule; counted requests are the ones that are not warm-up requests."""

    def __init__(self, requests: Iterator[Request], rule: WindowRule, expected: int | None, note: str) -> None:
        self.requests, self.rule, self.expected, self.note = requests, rule, expected, note


def _warmup_count(cfg: LoadConfig, rate: float, device: torch.device) -> int:
    if cfg.warmup_requests is not None:
        return cfg.warmup_requests
    if math.isinf(rate):
        return cfg.max_concurrency
    return math.ceil(rate * (WARMUP_ARRIVAL_S if device.type == "cuda" else CPU_WARMUP_ARRIVAL_S))


def plan_rate(cfg: LoadConfig, rate: float, window_s: float, device: torch.device) -> Plan:
    """Drawn requests at `rate` (warm-up, then counted) and when the window opens and closes."""
    task = TASKS[cfg.task]
    warmup = _warmup_count(cfg, rate, device)
    if math.isinf(rate):
        if cfg.requests is not None:
            items = draw_requests(task, np.zeros(warmup + cfg.requests), cfg.seed, cfg.output_length, warmup)
            return Plan(iter(items), SaturatedWindow(None), len(items), f"{cfg.requests} counted requests queued")
        return Plan(_endless(cfg, warmup), SaturatedWindow(window_s), None,
                    f"window of {window_s:.3g} s with every slot busy")
    counted = cfg.requests or math.ceil(rate * window_s) + 1
    times = arrival_times(cfg.arrivals, rate, warmup + counted, cfg.seed)
    items = draw_requests(task, times, cfg.seed, cfg.output_length, warmup)
    note = f"{warmup} warm-up and {counted} counted {cfg.arrivals} arrivals at {rate:g}/s"
    return Plan(iter(items), ArrivalWindow(float(times[warmup]), float(times[-1])), len(items), note)


def _endless(cfg: LoadConfig, warmup: int) -> Iterator[Request]:
    """`--rate max` without --requests: requests drawn on demand, all arriving at the start."""
    task = TASKS[cfg.task]
    for chunk in itertools.count():
        draw = draw_requests(task, np.zeros(MAX_CHUNK), cfg.seed + chunk, cfg.output_length,
                             min(MAX_CHUNK, max(0, warmup - chunk * MAX_CHUNK)))
        for r in draw:
            yield Request(r.id + chunk * MAX_CHUNK, 0.0, r.input_tokens, r.output_tokens, None, r.warmup)


def plan_trace(requests: list[Request], warmup: int) -> Plan:
    flagged = [Request(r.id, r.arrival_s, r.input_tokens, r.output_tokens, r.prompt_ids, r.id < warmup)
               for r in requests]
    first = flagged[min(warmup, len(flagged) - 1)].arrival_s
    return Plan(iter(flagged), ArrivalWindow(first, flagged[-1].arrival_s), len(flagged),
                f"trace of {len(flagged)} requests ({warmup} warm-up)")


# ---- figures of one rate -----------------------------------------------------------------------------------
def request_times(log: ServeLog, served: dict[int, Request]) -> list[request_metrics.RequestTimes]:
    """Finished requests' times in seconds from the load's start (unfinished ones have no latencies)."""
    def s(ns: int) -> float:
        return (ns - log.start_ns) / 1e9

    return [request_metrics.RequestTimes(i, s(log.arrival_ns[i]), s(log.admitted_ns[i]), s(log.first_token_ns[i]),
                                         s(log.finish_ns[i]), r.input_tokens, r.output_tokens, r.warmup)
            for i, r in served.items() if log.produced.get(i, 0) >= r.output_tokens]


def counted_ids(admitted_ns: Mapping[int, int], window: tuple[int, int] | None, served: dict[int, Request],
                rule: WindowRule) -> set[int]:
    """MLPerf's rule for finite rates (non-warm-up arrivals, all inside the window by construction); at `max`,
    the requests admitted (an engine's prefill, a server's request sent) inside the window."""
    if isinstance(rule, SaturatedWindow):
        if window is None:
            return set()
        w0, w1 = window
        return {i for i, t in admitted_ns.items() if w0 <= t < w1 and not served[i].warmup}
    return {i for i, r in served.items() if not r.warmup}


def rate_paths(cfg: LoadConfig, rate: float | None, single: bool) -> tuple[str, Path, str]:
    """A rate's label, record directory and run id: one rate (or a trace) writes to --out-dir itself, a sweep's
    rates to rate_<label>/ with the run id suffixed."""
    label = "trace" if rate is None else rate_label(rate)
    if single:
        return label, Path(cfg.out_dir), cfg.run_id
    return label, Path(cfg.out_dir) / f"rate_{label}", f"{cfg.run_id}-rate{label}"


def request_energy_figures(energy: dict[str, Any]) -> dict[str, float | None]:
    """The record's J/request p50/p90 from its `requests.energy` block (None where the block has none)."""
    quantiles = energy.get("energy_per_request_j") or {}
    return {"energy_per_request_p50_j": quantiles.get("p50"), "energy_per_request_p90_j": quantiles.get("p90")}


def load_metrics(cfg: LoadConfig, rate: float | None, steady: Window | None,
                 times: list[request_metrics.RequestTimes], counted: set[int], rule: WindowRule | None
                 ) -> dict[str, Any]:
    """The record's figures of one rate, for the engine and a server alike. `times`: the counted requests that
    finished (of `counted`, the window's counted requests)."""
    result: dict[str, Any] = {"work_unit": WORK_UNIT, "rate": "trace" if rate is None else rate_label(rate),
                              "max_concurrency": cfg.max_concurrency, "task": cfg.task}
    if steady is None or rule is None:
        return result
    result.update(steady_metrics(steady, work_unit=WORK_UNIT, devices=1))
    slo_ttft = None if cfg.slo_ttft_ms is None else cfg.slo_ttft_ms / 1e3
    slo_tpot = None if cfg.slo_tpot_ms is None else cfg.slo_tpot_ms / 1e3
    summary = request_metrics.latency_summary(times, slo_ttft, slo_tpot, steady.duration_s)
    energy = steady.energy
    joules = energy.energy_j if energy else None
    tokens = steady.work.get(WORK_UNIT)
    result.update(summary)
    result.update(
        requests_counted=len(counted), requests_finished=len(times),
        requests_per_s=len(counted) / steady.duration_s if steady.duration_s > 0 else None,
        energy_per_output_token_j=joules / tokens if joules is not None and tokens else None,
        energy_per_output_token_error_bound_j=(energy.error_bound_j / tokens
                                               if energy and energy.error_bound_j is not None and tokens else None),
        slo_ttft_ms=cfg.slo_ttft_ms, slo_tpot_ms=cfg.slo_tpot_ms,
        window_rule=("every slot busy (rate max)" if isinstance(rule, SaturatedWindow)
                     else "first to last counted arrival (MLPerf)"))
    return result


def step_figures(log: ServeLog) -> dict[str, Any]:
    """The engine's own figures of the window: its steps and the rows a decode step ran on average."""
    first, last = log.window_steps or (0, 0)
    decode_rows = [len(log.step_members[k]) for k in range(first, last) if log.step_kind[k] == DECODE]
    return {"mean_decode_rows": float(np.mean(decode_rows)) if decode_rows else None,
            "prefill_steps": sum(1 for k in range(first, last) if log.step_kind[k] == PREFILL),
            "decode_steps": len(decode_rows)}


def requests_table(log: ServeLog, served: dict[int, Request], counted: set[int]) -> RequestsTable:
    """The per-request rows (energy columns NaN until the fit fills them) and the step log."""
    ids = sorted(served)
    nan = float("nan")

    def seconds(times: dict[int, int]) -> np.ndarray:
        return np.array([(times[i] - log.start_ns) / 1e9 if i in times else nan for i in ids])

    produced = np.array([log.produced.get(i, 0) for i in ids], dtype=np.int64)
    status = [STATUSES.index("not_admitted") if i not in log.admitted_ns else
              STATUSES.index("done") if produced[k] >= served[i].output_tokens else STATUSES.index("unfinished")
              for k, i in enumerate(ids)]
    columns: dict[str, np.ndarray] = {
        "id": np.array(ids, dtype=np.int64), "arrival_s": seconds(log.arrival_ns),
        "admitted_s": seconds(log.admitted_ns), "first_token_s": seconds(log.first_token_ns),
        "finish_s": np.array([(log.finish_ns[i] - log.start_ns) / 1e9 if status[k] == 0 else nan
                              for k, i in enumerate(ids)]),
        "input_tokens": np.array([served[i].input_tokens for i in ids], dtype=np.int64), "output_tokens": produced,
        "warmup": np.array([served[i].warmup for i in ids], dtype=np.int8),
        "counted": np.array([i in counted for i in ids], dtype=np.int8), "status": np.array(status, dtype=np.int8)}
    for name in REQUEST_COLUMNS:
        columns.setdefault(name, np.full(len(ids), nan))
    offsets, members, amounts = log.members()
    steps = {"t0_ns": log.step_t0_ns, "t1_ns": log.step_t1_ns, "kind": log.step_kind, "member_offsets": offsets,
             "member_request": members, "member_amount": amounts}
    attrs = {"start_ns": log.start_ns, "window_ns": list(log.window) if log.window else None,
             "step_kinds": {"prefill": PREFILL, "decode": DECODE},
             "member_amount": "prefill: the request's prompt tokens; decode: its attended KV tokens"}
    return RequestsTable(columns, steps, attrs)


# ---- one rate, one record ------------------------------------------------------------------------------
def _controlled_window(cfg: LoadConfig, engine: ContinuousEngine, meter: WindowMeter, shape: ModelPreset,
                       trace: list[Request] | None, say: Callable[[str], None]) -> ServeLog:
    """Test (c)'s window, before the load: every slot admitted at once and decoded to the end, no refills, so
    prefill and decode run at separate times (metered as window `controlled`). Requests drawn from the task, or
    a trace's first ones (all arriving at once)."""
    if trace is None:
        items = draw_requests(TASKS[cfg.task], np.zeros(cfg.max_concurrency), cfg.seed + 1, cfg.output_length)
    else:
        items = [Request(k, 0.0, r.input_tokens, r.output_tokens, r.prompt_ids)
                 for k, r in enumerate(trace[:cfg.max_concurrency])]
    loop = ServeLoop(engine, cfg.max_concurrency, lambda r: request_prompt(r, shape.vocab_size, cfg.seed + 1),
                     log=say, admit_all=True)
    log = loop.run(iter(items), ArrivalWindow(0.0, math.inf), lambda: meter.begin("controlled", 0),
                   lambda tokens: meter.end("controlled", len(loop.steps), {WORK_UNIT: tokens}), lambda: None,
                   len(items))
    say(f"controlled-split window: {len(items)} requests admitted at once, no refills")
    return log


def _run_rate(life: Lifecycle, cfg: LoadConfig, rate: float | None, trace: list[Request] | None,
              model: BuiltModel[ContinuousEngine], shape: ModelPreset, precision: str, device: torch.device,
              hardware: dict[str, object], idle: IdleBaseline | None, single: bool, sweep: Sweep,
              say: Callable[[str], None]) -> tuple[RunRecord, IdleBaseline | None]:
    label, out_dir, run_id = rate_paths(cfg, rate, single)
    config = {**cfg.to_dict(), "rate": label, "model": cfg.preset if cfg.checkpoint is None else shape.name,
              "precision": precision, "out_dir": str(out_dir), "engine": "continuous",
              "weights": "checkpoint" if cfg.checkpoint else "random (seeded)", "model_source": shape.source}
    state: dict[str, Any] = {}

    def metrics(record: RunRecord) -> dict[str, Any]:
        record.config["engine_detail"] = model.describe()
        times = state.get("times", [])
        result = load_metrics(cfg, rate, state.get("steady"), times, state.get("counted", set()), state.get("rule"))
        if "log" in state and state.get("steady") is not None:
            result.update(step_figures(state["log"]))
        if "table" in state and state.get("steady") is not None:
            energy = serving_energy(label, state["log"], state["steady"], {t.id for t in times},
                                    None if idle is None else idle.power_w, out_dir / "jpwr", state["table"], sweep,
                                    state.get("controlled"))
            record.requests = {**(record.requests or {}), "energy": energy}
            save_requests(out_dir, state["table"], record)
            result.update(request_energy_figures(energy))
        return result

    with life.run(run_id, out_dir, config, metrics=metrics, hardware=hardware, log_to=cfg.log_to) as run:
        engine = model.get()
        meter = run.open_meter(sync=engine.sync, methods=cfg.energy_methods, read_every_s=COUNTER_READ_S)
        idle = run.idle_baseline(cfg.idle_baseline, device.type == "cuda", reuse=idle)
        window = window_seconds(cfg.steady_seconds, meter, device)
        run.record.meter["steady_seconds"] = window.to_dict()
        plan = plan_trace(trace, cfg.warmup_requests or 0) if trace is not None else \
            plan_rate(cfg, rate or math.inf, window.seconds, device)
        _log(f"rate {label}: {plan.note}; {cfg.max_concurrency} slots")
        _, sequence = validation.load_lengths(cfg, trace)
        if engine.state is None or engine.state.slots != cfg.max_concurrency or engine.state.cache_slots < sequence:
            run.record.config["engine_setup_s"] = engine.prepare(cfg.max_concurrency, sequence)
        if not sweep.earlier and sweep.controlled is None:
            state["controlled"] = _controlled_window(cfg, engine, meter, shape, trace, say)
        served: dict[int, Request] = {}

        def source() -> Iterator[Request]:
            for r in plan.requests:
                served[r.id] = r
                yield r

        loop = ServeLoop(engine, cfg.max_concurrency, lambda r: request_prompt(r, shape.vocab_size, cfg.seed),
                         log=say)

        def on_end(tokens: int) -> None:
            state["steady"] = meter.end("steady", len(loop.steps), {WORK_UNIT: tokens, "steps": len(loop.steps)})

        log = loop.run(source(), plan.rule, lambda: meter.begin("steady", 0), on_end, life.stop.local_reason,
                       plan.expected)
        run.step_times(None, "a load's engine steps differ by design (prefill or decode, changing batches)")
        time.sleep(COUNTER_SETTLE_S)  # the energy counter updates once more after the last step (the fit's span)
        counted = counted_ids(log.admitted_ns, log.window, served, plan.rule)
        state.update(log=log, rule=plan.rule, counted=counted,
                     times=[t for t in request_times(log, served) if t.id in counted])
        table = state["table"] = requests_table(log, served, counted)
        run.record.requests = {"file": FILE_NAME, "rows": len(table), "counted": int(table.requests["counted"].sum()),
                               "columns": list(REQUEST_COLUMNS), "steps": len(log.step_kind)}
        save_requests(out_dir, table, run.record)
        if log.window is None and not log.stop_reason:
            raise RunFailed(NO_WINDOW)
        if log.stop_reason:
            raise StopRequested(f"{log.stop_reason}: the load stopped with {len(loop.running)} requests in flight")
    return run.record, idle


def progress_line(record: RunRecord) -> str:
    m = record.metrics
    return (f"rate {m.get('rate')}: {record.status}, {shown(m, 'output_tokens_per_s')} tokens/s, "
            f"{shown(m, 'requests_per_s')} req/s, {shown(m, 'energy_per_output_token_j')} J/token, p90 TTFT "
            f"{shown(m, 'ttft_p90_s', 1e3)} ms, p90 TPOT {shown(m, 'tpot_p90_s', 1e3)} ms, goodput "
            f"{shown(m, 'goodput_requests_per_s')} req/s")


def run(cfg: LoadConfig, shape: ModelPreset, trace: list[Request] | None, launch: LaunchEnv,
        device: torch.device) -> int:
    """Every rate (or the trace's requests); returns the exit code. Config, trace and launch are already
    validated."""
    precision = validation.resolve_precision(cfg.precision, device.type)
    hardware = hardware_info(device, launch)
    validation.check_load_memory(cfg, shape, precision, hardware.get("device_memory_gib"), trace)
    if device.type == "cuda":
        torch.cuda.set_device(0)

    def make() -> ContinuousEngine:
        model = build_model(shape, cfg.checkpoint, precision, "sdpa", device, cfg.seed)
        return compact_engine(ContinuousEngine, model, device, cfg.decode_tuning)

    with (Lifecycle("llm_inference", launch, cfg.exit_duration_mins, software_extra=("transformers",)) as life,
          Heartbeat(_log) as beat):
        model = BuiltModel(make, shape, precision, device, cfg.checkpoint)
        idle: IdleBaseline | None = None
        sweep = Sweep()
        rates: list[float | None] = [None] if trace is not None else list(cfg.rates)
        for n, rate in enumerate(rates, start=1):
            beat.begin(f"rate {'trace' if rate is None else rate} ({n} of {len(rates)})")
            record, idle = _run_rate(life, cfg, rate, trace, model, shape, precision, device, hardware, idle,
                                     len(rates) == 1, sweep, beat.say)
            beat.say(progress_line(record))
            if record.status == "TIMEOUT" or model.engine is None:
                break  # the job is being stopped, or the model could not be built: no further rate can finish
        return life.exit_code(SUMMARY_EXTRA)
