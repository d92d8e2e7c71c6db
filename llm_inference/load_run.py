"""One load run, the same for both targets: every rate (or a trace) of `python -m llm_inference load`, one run
record each, against the in-process engine (llm_inference/load.py) or an HTTP server (llm_inference/http_load.py).

Per rate: the target starts (the engine is built, the server started and primed: once per sweep), the meter opens,
the idle baseline is measured (first rate) or reused, the window length is sized, the rate is planned
(llm_inference/load_plan.py), the target serves the plan's requests with one measured window `steady`, the
per-request table is written beside the record, and the load's end is judged: a stop request is TIMEOUT, a load
that never opened its window FAILED. Only what differs between the targets is the target's (`LoadTarget`): what it
serves with, its own figures and its per-request energy. What the serving found is a `RateOutcome`, which the
record's metrics read after the body ended, also after a failure (every field keeps its default until set).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

import torch

from joulebench.figures import work_devices
from joulebench.lifecycle import Lifecycle, Run, RunFailed, StopRequested, sweep
from joulebench.record import RunRecord
from joulebench.record_types import HardwareBlock, LoadMetrics, RequestEnergyBlock, RequestsBlock
from joulebench.requests_table import RequestsTable, save_requests
from jpwr import IdleBaseline, Window, WindowMeter
from llm_inference.arrivals import Request
from llm_inference.load_config import LoadConfig, rate_label
from llm_inference.load_plan import (
    NO_WINDOW,
    SUMMARY_EXTRA,
    Plan,
    Served,
    load_metrics,
    plan_rate,
    plan_trace,
    progress_line,
    rate_paths,
)
from llm_inference.presets import ModelPreset
from llm_inference.request_metrics import RequestTimes
from llm_inference.runner import window_seconds
from llm_inference.serving_energy import RecordedRate, attach_energy
from llm_inference.window_rules import WindowRule

DetailT = TypeVar("DetailT")


@dataclasses.dataclass
class RateOutcome(Generic[DetailT]):
    """What one rate's serving found. `detail`: the target's own results (its step log, or what the client saw)."""

    label: str
    out_dir: Path
    rule: WindowRule | None = None  # set once the load ended: the figures need a finished load
    steady: Window | None = None  # the measured window, once it closed
    counted: set[int] = dataclasses.field(default_factory=set)  # the window's counted requests
    times: list[RequestTimes] = dataclasses.field(default_factory=list)  # the counted requests that finished
    table: RequestsTable | None = None
    update_period_s: float | None = None  # the energy counter's, as the window's length was sized with
    window_s: float | None = None  # the measured window's planned length (the controlled window's parts' cap)
    window_ns: tuple[int, int] | None = None  # the window's edges, where it opened and closed
    stop_reason: str | None = None  # a stop request ended the load
    in_flight_at_end: int = 0
    detail: DetailT | None = None


class LoadTarget(Protocol[DetailT]):
    """What differs between serving a load in process and sending it to a server."""

    device: torch.device  # picks the warm-up and window defaults, and whether the idle baseline is an accelerator's
    hardware: HardwareBlock | None  # the record's hardware block where the target knows it

    def config(self) -> dict[str, Any]:
        """The target's entries in the record's config (which engine, its precision)."""
        ...

    def describe(self, config: dict[str, Any]) -> None:
        """What the target adds to the record's config once the rate ended (the engine's detail, the server)."""
        ...

    def start(self, run: Run) -> None:
        """Before the meter opens: the engine built, the server started and answering (once per sweep)."""
        ...

    def open_meter(self, run: Run, cfg: LoadConfig) -> WindowMeter:
        ...

    def limit_note(self) -> str:
        """How many requests run at once, for the rate's first line."""
        ...

    def serve(self, run: Run, plan: Plan, served: dict[int, Request], meter: WindowMeter,
              outcome: RateOutcome[DetailT], say: Callable[[str], None]) -> RequestsBlock:
        """Serve the plan's requests (each goes into `served` as it is drawn) with the window `steady`; fill
        `outcome`; return the record's `requests` block."""
        ...

    def check(self, run: Run, outcome: RateOutcome[DetailT]) -> None:
        """After the table is written: the target's own reasons why the rate failed (raise) or warnings."""
        ...

    def figures(self, outcome: RateOutcome[DetailT]) -> LoadMetrics:
        """The target's own figures (also of a rate that failed: what it knows then)."""
        ...

    def energy(self, rate: RecordedRate) -> RequestEnergyBlock:
        """The record's per-request `energy` block of the rate as it saved itself (fills its table's energy
        columns)."""
        ...

    def energy_unavailable(self) -> str | None:
        """Why the target has no per-request energy whatever the window measured (None: it may have)."""
        ...

    def ends_sweep(self, record: RunRecord) -> bool:
        """No further rate can finish after this one (the model could not be built, the server is gone)."""
        ...


def _served(outcome: RateOutcome[DetailT]) -> Served | None:
    """The table's arrivals, admissions and finishes for the served rate and the overload note (None without a
    table)."""
    table = outcome.table
    if table is None:
        return None
    return Served(int(table.attrs["start_ns"]), table.requests["arrival_s"], table.requests["admitted_s"],
                  table.requests["finish_s"], outcome.update_period_s)


def _request_energy(target: LoadTarget[DetailT], outcome: RateOutcome[DetailT], record: RunRecord
                    ) -> RequestEnergyBlock:
    """The per-request energy block, fitted only where the window's own energy was measured: a record never
    carries a per-request split of energy its headline calls unmeasured (a run that failed before its energy
    was attached)."""
    assert outcome.steady is not None
    reason = target.energy_unavailable()
    if reason:
        return {"unavailable_reason": reason}
    if outcome.steady.energy is None or outcome.steady.energy.energy_j is None:
        why = outcome.steady.energy.unavailable_reason if outcome.steady.energy else None
        return {"unavailable_reason": f"the window's energy is n/a ({why or f'run {record.status}'}): no "
                                      "per-request split of it"}
    assert outcome.table is not None
    return target.energy(RecordedRate.of(record, outcome.table, outcome.out_dir))


def _rate_metrics(cfg: LoadConfig, rate: float | None, target: LoadTarget[DetailT], outcome: RateOutcome[DetailT],
                  record: RunRecord) -> LoadMetrics:
    """The record's figures of one rate (its metrics callback)."""
    target.describe(record.config)
    result = load_metrics(cfg, rate, outcome.steady, outcome.times, outcome.counted, outcome.rule, _served(outcome),
                          devices=work_devices(record))
    result.update(target.figures(outcome))
    if outcome.table is not None:
        if outcome.steady is None:
            outcome.table.attrs["energy_unavailable_reason"] = "no measured window"
        else:
            result.update(attach_energy(record, outcome.table, _request_energy(target, outcome, record)))
        save_requests(outcome.out_dir, outcome.table, record)
    return result


def run_rate(life: Lifecycle, cfg: LoadConfig, target: LoadTarget[DetailT], rate: float | None,
             trace: list[Request] | None, shape: ModelPreset, idle: IdleBaseline | None, single: bool,
             say: Callable[[str], None]) -> tuple[RunRecord, IdleBaseline | None]:
    """One rate (`rate`; None: the trace's requests), one record; returns it and the idle baseline."""
    label, out_dir, run_id = rate_paths(cfg, rate, single)
    config = {**cfg.to_dict(), "rate": label, "model": cfg.preset if cfg.checkpoint is None else shape.name,
              **target.config(), "weights": "checkpoint" if cfg.checkpoint else "random (seeded)",
              "model_source": shape.source, "out_dir": str(out_dir)}
    outcome: RateOutcome[DetailT] = RateOutcome(label, out_dir)
    with life.run(run_id, out_dir, config, metrics=lambda record: _rate_metrics(cfg, rate, target, outcome, record),
                  hardware=target.hardware, log_to=cfg.log_to) as run:
        target.start(run)
        meter = target.open_meter(run, cfg)
        idle = run.idle_baseline(cfg.idle_baseline, target.device.type == "cuda", reuse=idle)
        window = window_seconds(cfg.steady_seconds, meter, target.device)
        run.record.meter["steady_seconds"] = window.to_dict()
        outcome.update_period_s, outcome.window_s = window.update_period_s, window.seconds
        plan = plan_trace(trace, cfg.warmup_requests or 0) if trace is not None else \
            plan_rate(cfg, rate or math.inf, window.seconds, target.device)
        say(f"rate {label}: {plan.note}; {target.limit_note()}")
        run.record.requests = target.serve(run, plan, {}, meter, outcome, say)
        assert outcome.table is not None, "a target's serve() fills the table"
        save_requests(out_dir, outcome.table, run.record)
        target.check(run, outcome)
        if outcome.stop_reason:
            raise StopRequested(f"{outcome.stop_reason}: the load stopped with {outcome.in_flight_at_end} requests "
                                "in flight")
        if outcome.window_ns is None:
            raise RunFailed(NO_WINDOW)
    return run.record, idle


def drawn(plan: Plan, served: dict[int, Request]) -> Iterator[Request]:
    """The plan's requests, each kept in `served` as the load draws it (an endless queue is drawn as needed)."""
    for request in plan.requests:
        served[request.id] = request
        yield request


def run_rates(life: Lifecycle, cfg: LoadConfig, target: LoadTarget[DetailT], trace: list[Request] | None,
              shape: ModelPreset, log: Callable[[str], None], where: str = "") -> int:
    """Every rate of the sweep (or the trace) against `target`; returns the exit code. `where`: the heartbeat's
    words for the target."""
    rates: list[float | None] = [None] if trace is not None else list(cfg.rates)

    def one(rate: float | None, idle: IdleBaseline | None, say: Callable[[str], None]
            ) -> tuple[RunRecord, IdleBaseline | None]:
        return run_rate(life, cfg, target, rate, trace, shape, idle, len(rates) == 1, say)

    return sweep(life, rates, lambda rate: f"rate {'trace' if rate is None else rate_label(rate)}{where}", one,
                 progress_line, log, SUMMARY_EXTRA, target.ends_sweep)
