"""`python -m llm_inference load`: an open-loop load on the continuous-batching engine, one run record per rate.

Per rate (or per trace) the load run of llm_inference/load_run.py with this module's `EngineTarget`: the requests
(warm-up first, then the counted ones), one measured window `steady`, the per-request table beside the record
(joulebench.requests_table) and the record's figures (llm_inference/load_plan.py: the window rules and what counts).
Latencies come from the steps' device stamps (serve_loop); the per-request energy from the step log
(serving_energy). Before the first rate's load, a controlled-split window (full-size prefill steps back to back,
then every row decoded together, each part long enough for its own energy bound).

The model is built once; the rows' cache and captured steps are set up once (`prepare`, outside every window)
and reused by every rate. Layout: one rate writes <out-dir>/run_record.json; a sweep <out-dir>/rate_<r>/.

Tensor parallelism (`--tensor-parallel N`, N torchrun processes): rank 0 is the load (arrivals, scheduler, windows,
meter, record) and its engine announces every call that changes the rows; the other ranks build their part of the
model and run those calls (ContinuousEngine.follow), nothing else. The node's sampler meters every GPU of the job.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch

from joulebench.launch import LaunchEnv
from joulebench.lifecycle import Lifecycle, Run
from joulebench.record import RunRecord
from joulebench.record_types import ControlledPlan, HardwareBlock, LoadMetrics, RequestEnergyBlock, RequestsBlock
from joulebench.requests_table import FILE_NAME, REQUEST_COLUMNS, RequestsTable, RequestStatus, StepKind
from joulebench.sizing import ASSUMED_UPDATE_S
from joulebench.torch_device import hardware_info
from joulebench.waits import StopCheck
from jpwr import WindowMeter
from llm_inference import shards, tensor_parallel, validation
from llm_inference.arrivals import Request
from llm_inference.continuous_engine import ContinuousEngine
from llm_inference.engine import DTYPES, build_model, request_prompt
from llm_inference.load_config import LoadConfig
from llm_inference.load_plan import COUNTER_READ_S, COUNTER_SETTLE_S, WORK_UNIT, Plan, endless_requests
from llm_inference.load_run import RateOutcome, drawn, run_rates
from llm_inference.presets import ModelPreset
from llm_inference.request_rows import RequestRow, counted_times, request_columns
from llm_inference.runner import BuiltModel, compact_engine, join
from llm_inference.scheduler import backlog_step_requests
from llm_inference.serve_loop import ServeLog, ServeLoop
from llm_inference.serving_energy import (
    CONTROLLED_WINDOW,
    RecordedRate,
    Sweep,
    controlled_part_seconds,
    in_process_counter,
    serving_energy,
    write_joint,
)
from llm_inference.tensor_parallel import TensorParallel
from llm_inference.window_rules import ArrivalWindow


def _log(text: str) -> None:
    print(f"[llm_inference] {text}", flush=True)


# ---- figures of one rate -----------------------------------------------------------------------------------
def step_figures(log: ServeLog) -> LoadMetrics:
    """The engine's own figures of the window: its steps, the rows a decode step occupied and computed on average
    (its row bucket: the empty rows below its top computed too), and the requests moved down per decode step."""
    first, last = log.window_steps or (0, 0)
    decode = [k for k in range(first, last) if log.step_kind[k] == StepKind.DECODE]
    occupied = sum(len(log.step_members[k]) for k in decode)
    computed = int(log.step_computed_rows[decode].sum())
    return {"mean_decode_rows": occupied / len(decode) if decode else None,
            "mean_computed_rows": computed / len(decode) if decode else None,
            "computed_rows_per_occupied_row": computed / occupied if occupied else None,
            "moved_requests_per_decode_step": int(log.step_moved[decode].sum()) / len(decode) if decode else None,
            "prefill_steps": sum(1 for k in range(first, last) if log.step_kind[k] == StepKind.PREFILL),
            "decode_steps": len(decode)}


def step_log(log: ServeLog) -> dict[str, np.ndarray]:
    """The loop's steps in the request table's form: stamps, kind, the rows computed, the requests moved before the
    step, and the members as CSR."""
    offsets, members, amounts = log.members()
    return {"t0_ns": log.step_t0_ns, "t1_ns": log.step_t1_ns, "kind": log.step_kind, "member_offsets": offsets,
            "member_request": members, "member_amount": amounts, "computed_rows": log.step_computed_rows,
            "moved_requests": log.step_moved}


def request_rows(log: ServeLog, served: dict[int, Request], counted: set[int]) -> list[RequestRow]:
    """Every drawn request as the engine's step log saw it (its output length known: done when it produced it)."""
    rows = []
    for i in sorted(served):
        produced = log.produced.get(i, 0)
        status = (RequestStatus.NOT_ADMITTED if i not in log.admitted_ns else
                  RequestStatus.DONE if produced >= served[i].output_tokens else RequestStatus.UNFINISHED)
        rows.append(RequestRow(i, log.arrival_ns.get(i), log.admitted_ns.get(i), log.first_token_ns.get(i),
                               log.finish_ns[i] if status is RequestStatus.DONE else None, served[i].input_tokens,
                               produced, served[i].warmup, i in counted, status))
    return rows


def requests_table(log: ServeLog, rows: list[RequestRow], controlled: tuple[ServeLog, ControlledPlan] | None
                   ) -> RequestsTable:
    """The per-request rows (energy columns NaN until the fit fills them), the step log, and the controlled-split
    window's log and plan where this rate ran it."""
    attrs = {"start_ns": log.start_ns, "window_ns": list(log.window) if log.window else None,
             "step_kinds": {kind.name.lower(): int(kind) for kind in StepKind},
             "member_amount": "prefill: the request's prompt tokens; decode: its attended KV tokens",
             "computed_rows": "decode: the rows the step computed (its row bucket); prefill: its requests",
             "moved_requests": "requests moved down (a cache row's filled part copied) right before the step",
             **({} if controlled is None else {CONTROLLED_WINDOW: controlled[1]})}
    return RequestsTable(request_columns(rows, log.start_ns), step_log(log), attrs,
                         {} if controlled is None else step_log(controlled[0]))


def controlled_requests(source: Iterator[Request], rows: int, sequence: int, prefill_over: Callable[[], bool]
                        ) -> Iterator[Request]:
    """The controlled window's requests, all arriving at once, numbered in order: prefill-only ones (one output
    token: each leaves its row at its prefill) from `source` until `prefill_over()`, then one per row whose output
    fills its row's cache (`sequence` positions), so that the decode part ends by its length, not by their output."""
    ids = itertools.count()
    for r in source:
        if prefill_over():
            break
        yield Request(next(ids), 0.0, r.input_tokens, 1, r.prompt_ids)
    for r in itertools.islice(source, rows):
        yield Request(next(ids), 0.0, r.input_tokens, sequence - r.input_tokens, r.prompt_ids)


class PartClock:
    """When a part of the controlled window began on the host's clock, and whether it has lasted its length (the
    host runs at most a few steps ahead of the device: a part lasts at least its length)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.began: float | None = None

    def start(self) -> None:
        if self.began is None:
            self.began = time.monotonic()

    def over(self) -> bool:
        return self.began is not None and time.monotonic() - self.began >= self.seconds


def _controlled_window(cfg: LoadConfig, engine: ContinuousEngine, meter: WindowMeter, shape: ModelPreset,
                       trace: list[Request] | None, part: tuple[float, str], stop: StopCheck,
                       say: Callable[[str], None]) -> tuple[ServeLog, ControlledPlan]:
    """Test (c)'s window, before the load (metered as window `controlled`), and its plan for the table: prefill and
    decode at separate times, each part at least `part` seconds long (serving_energy.controlled_part_seconds). Its
    prefill part: full-size prefill steps back to back (the scheduler's controlled rules), prefill-only requests
    until the part has lasted its length, then one request per row; its decode part: every row decoded together,
    no refills, until it has lasted its length (or the rows' cache is full). Requests drawn from the task, or the
    trace's cycled (all arriving at once). A stop request ends it early (the load then stops at once)."""
    _, sequence = validation.load_lengths(cfg, trace)
    source = (endless_requests(dataclasses.replace(cfg, seed=cfg.seed + 1), 0) if trace is None else
              (dataclasses.replace(r, id=k) for k, r in enumerate(itertools.cycle(trace))))
    prefill, decode = PartClock(part[0]), PartClock(part[0])

    def prefill_over() -> bool:
        prefill.start()
        return prefill.over()

    loop = ServeLoop(engine, cfg.max_concurrency, lambda r: request_prompt(r, shape.vocab_size, cfg.seed + 1),
                     log=say, controlled=True, admit_divisor=cfg.admit_divisor)

    def decode_over() -> str | None:
        if loop.steps and loop.steps[-1].kind is StepKind.DECODE:
            decode.start()
        return stop() or ("the decode part lasted its length" if decode.over() else None)

    requests = controlled_requests(source, cfg.max_concurrency, sequence, prefill_over)
    log = loop.run(requests, ArrivalWindow(0.0, math.inf), lambda: meter.begin("controlled", 0),
                   lambda tokens: meter.end("controlled", len(loop.steps), {WORK_UNIT: tokens}), decode_over, None)
    loop.leave()
    prefill_steps = int(np.count_nonzero(log.step_kind == StepKind.PREFILL))
    step = backlog_step_requests(cfg.max_concurrency, cfg.admit_divisor)
    say(f"controlled-split window: {prefill_steps} prefill steps (<= {step} requests each), then "
        f"{len(log.step_kind) - prefill_steps} decode steps of {cfg.max_concurrency} rows; parts >= {part[0]:.3g} s")
    return log, {"part_seconds_planned": part[0], "part_length_rule": part[1], "prefill_step_requests": step,
                 "decode_rows": cfg.max_concurrency}


class EngineTarget:
    """The in-process continuous-batching engine as a load target (llm_inference/load_run.py)."""

    def __init__(self, cfg: LoadConfig, model: BuiltModel[ContinuousEngine], shape: ModelPreset, precision: str,
                 hardware: HardwareBlock, trace: list[Request] | None) -> None:
        self.cfg, self.model, self.shape, self.precision, self.trace = cfg, model, shape, precision, trace
        self.device = model.device
        self.hardware: HardwareBlock | None = hardware
        self.sweep = Sweep()

    def config(self) -> dict[str, Any]:
        return {"precision": self.precision, "engine": "continuous"}

    def describe(self, config: dict[str, Any]) -> None:
        config["engine_detail"] = self.model.describe()

    def start(self, run: Run) -> None:
        self.model.get()

    def open_meter(self, run: Run, cfg: LoadConfig) -> WindowMeter:
        return run.open_meter(sync=self.model.get().sync, methods=cfg.energy_methods, read_every_s=COUNTER_READ_S)

    def limit_note(self) -> str:
        return f"{self.cfg.max_concurrency} rows (requests decoded together at most)"

    def serve(self, run: Run, plan: Plan, served: dict[int, Request], meter: WindowMeter,
              outcome: RateOutcome[ServeLog], say: Callable[[str], None]) -> RequestsBlock:
        cfg, engine = self.cfg, self.model.get()
        _, sequence = validation.load_lengths(cfg, self.trace)
        if engine.state is None or engine.state.rows != cfg.max_concurrency or engine.state.cache_positions < sequence:
            say(f"engine set-up: {engine.setup_plan(cfg.max_concurrency, sequence)} (outside every window)")
            run.record.config["engine_setup_s"] = engine.prepare(cfg.max_concurrency, sequence)
            say(f"engine set-up done in {run.record.config['engine_setup_s']:.1f} s")
        controlled = None
        if not self.sweep.earlier and self.sweep.controlled is None:
            part = controlled_part_seconds(outcome.update_period_s or ASSUMED_UPDATE_S,
                                           outcome.window_s or math.inf)
            controlled = _controlled_window(cfg, engine, meter, self.shape, self.trace, part, run.stop.local_reason,
                                            say)
        loop = ServeLoop(engine, cfg.max_concurrency, lambda r: request_prompt(r, self.shape.vocab_size, cfg.seed),
                         log=say, admit_divisor=cfg.admit_divisor)

        begun: list[int] = []  # the steps run before the window opened: its step count is the steps inside it

        def on_begin() -> None:
            begun.append(len(loop.steps))
            meter.begin("steady", len(loop.steps))

        def on_end(tokens: float) -> None:
            outcome.steady = meter.end("steady", len(loop.steps), {WORK_UNIT: tokens,
                                                                   "steps": len(loop.steps) - begun[0]})

        log = loop.run(drawn(plan, served), plan.rule, on_begin, on_end, run.stop.local_reason, plan.expected)
        run.step_times(None, "a load's engine steps differ by design (prefill or decode, changing batches)")
        time.sleep(COUNTER_SETTLE_S)  # the energy counter updates once more after the last step (the fit's span)
        counted = plan.rule.counted(log.admitted_ns, log.window, served)
        rows = request_rows(log, served, counted)
        outcome.detail = log
        outcome.rule, outcome.counted = plan.rule, counted
        outcome.times = counted_times(rows, log.start_ns)
        outcome.window_ns, outcome.stop_reason = log.window, log.stop_reason
        outcome.in_flight_at_end = log.in_flight_at_end
        table = outcome.table = requests_table(log, rows, controlled)
        return {"file": FILE_NAME, "rows": len(table), "counted": int(table.requests["counted"].sum()),
                "columns": list(REQUEST_COLUMNS), "steps": len(log.step_kind)}

    def check(self, run: Run, outcome: RateOutcome[ServeLog]) -> None:
        """The engine has no reasons of its own: a stop and a missing window are the load run's."""

    def figures(self, outcome: RateOutcome[ServeLog]) -> LoadMetrics:
        return {} if outcome.detail is None or outcome.steady is None else step_figures(outcome.detail)

    def energy(self, rate: RecordedRate) -> RequestEnergyBlock:
        return serving_energy(rate, in_process_counter(rate), self.sweep)

    def energy_unavailable(self) -> str | None:
        return None  # the engine runs on the metered device

    def ends_sweep(self, record: RunRecord) -> bool:
        return self.model.engine is None  # the model could not be built: no further rate can finish


def run(cfg: LoadConfig, shape: ModelPreset, trace: list[Request] | None, launch: LaunchEnv,
        device: torch.device) -> int:
    """Every rate (or the trace's requests); returns the exit code. Config, trace and launch are already
    validated."""
    precision = validation.resolve_precision(cfg.precision, device.type)
    tp, device = join(cfg.tensor_parallel, launch, device)
    try:
        if tp is not None:  # each process drew its own run id (and default directory): rank 0's name the run
            run_id, out_dir = tp.from_rank_zero((cfg.run_id, cfg.out_dir))
            cfg = dataclasses.replace(cfg, run_id=run_id, out_dir=out_dir)
        hardware = hardware_info(device, launch)
        validation.check_load_memory(cfg, shape, precision, hardware.get("device_memory_gib"), trace,
                                     "the device" if tp is None else "each rank's device")
        if tp is not None and tp.rank != 0:
            _engine(cfg, shape, precision, device, tp).follow(lambda: tp.from_rank_zero(None))
            return 0
        with Lifecycle("llm_inference", launch, cfg.exit_duration_mins, software_extra=("transformers",)) as life:
            model = BuiltModel(lambda: _engine(cfg, shape, precision, device, tp), shape, precision, device,
                               cfg.checkpoint)
            target = EngineTarget(cfg, model, shape, precision, hardware, trace)
            try:
                code = run_rates(life, cfg, target, trace, shape, _log)
                write_joint(target.sweep, _log)  # a sweep's rates fitted together (a single rate has no joint block)
                return code
            finally:
                if tp is not None:
                    tp.from_rank_zero(None)  # the other ranks' engines stop following
    finally:
        tensor_parallel.finish(tp)


def _engine(cfg: LoadConfig, shape: ModelPreset, precision: str, device: torch.device, tp: TensorParallel | None
            ) -> ContinuousEngine:
    """The continuous engine on transformers' weights, or on this rank's part of the model; rank 0 of a split model
    announces its calls to the other ranks."""
    if tp is None:
        model = build_model(shape, cfg.checkpoint, precision, "sdpa", device, cfg.seed)
        return compact_engine(ContinuousEngine, model, device, cfg.decode_tuning)
    engine = ContinuousEngine(shards.rank_model(shape, cfg.checkpoint, DTYPES[precision], device, cfg.seed, tp),
                              device, tuning=cfg.decode_tuning)
    if tp.rank == 0:
        engine.announce = tp.from_rank_zero
    return engine
