"""Per-request energy of a load run and the tests of its model, from the record, its request table and a trace.

The fit (joulebench.request_energy) runs on the whole load of the rate, from its first step to its last: the ramp
(warm-up requests filling the rows) and the drain vary the rows per step, which one saturated window does not (at
`--rate max` every step decodes all rows, so a fixed cost per step and a cost per row cannot be told apart there,
and a fit on that window alone cannot predict a rate at a few rows). Each request's parts are taken over its whole
lifetime; the window's own energy is split the same way for the remainder diagnostic. The checks, recorded with
the figures (docs/attribution.md):
(a) cross-rate: this rate's coefficients predict every earlier rate's window energy, and theirs predict this one's;
(b) held-out halves of the fitted span (the fit's folds);
(c) the controlled-split window (all rows admitted at once, no refills) run once, before the first rate's load:
    the fitted prefill and decode parts against the counter's energy of their intervals, less idle;
the in-sample remainder of the window is reported with its bound as a diagnostic, not as a test. Each step carries
the card's state where the trace recorded it (`Counter.state`: SM clock, power-capped share), so the fits try the
clock term (joulebench.clock_term) and every check records its two sides' conditions.

Everything the fit reads is what the rate saved (`RecordedRate`: the record's window and idle power, the request
table with the step log, or a server's chunk times, and the controlled-split window's step log): the driver fits
from it right after the rate with its in-process trace, and `python -m llm_inference request-energy`
(llm_inference/recorded_energy.py) fits from the same files once an external sampler wrote its trace (`jpwr serve`
writes it when it stops, after the driver: a JUBE job runs the command then). One function, one seed: both get the
same block from the same files and trace.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Collection, Mapping
from functools import partial
from pathlib import Path
from typing import NamedTuple, TypeVar

import numpy as np

from joulebench.cap_term import CapTrial
from joulebench.card_state import CardState, check_fields
from joulebench.clock_term import TermTrial
from joulebench.joint_energy import MIN_RATES, JointFit, RateWindow, fit_joint, fitted_rates
from joulebench.lifecycle import amend_written_record
from joulebench.record import RunRecord
from joulebench.record_shape import checked_block
from joulebench.record_types import (
    ControlledPart,
    ControlledPartCheck,
    ControlledPlan,
    ControlledWindowBlock,
    CrossRateCheck,
    HeldOutHalfCheck,
    LoadMetrics,
    RequestEnergyBlock,
    RequestsBlock,
)
from joulebench.request_energy import (
    COLUMNS,
    SPLIT_SLACK,
    HeldOutWindow,
    RequestEnergyFit,
    RequestParts,
    WorkLog,
    controlled_split_check,
    cross_check,
    fit_with_cap_trial,
    fit_with_clock_trial,
    measured_energy,
    request_parts,
    work_conditions,
)
from joulebench.requests_table import RequestsTable, RequestStatus, StepKind
from joulebench.segment_fit import Segments, counter_knots, window_segments
from jpwr import JpwrError
from jpwr.estimator import planned_bound_j
from jpwr.trace import SEGMENT_DIR, TRACE_FILE, Knots, accelerator_domains, load_trace
from llm_inference import client_estimate

METHOD = ("counter-segment fit: E = idle power x seconds + a x prefill tokens + e x prefill steps + b x decode steps + "
          "c x row-steps + d x attended KV tokens, NNLS, block bootstrap (joulebench.request_energy)")
JOINT_METHOD = ("the same model fitted over every rate of the sweep at once, a..e shared, idle power per rate, blocks "
                "drawn per rate (joulebench.joint_energy)")
NO_TRACE = ("no in-process trace beside the record: under an external sampler the trace is written when it stops, "
            "after the driver; `python -m llm_inference request-energy --run DIR` fits it then (JUBE jobs do)")
STEADY = "steady"  # the rate's measured window
IN_PROCESS_TRACE = "jpwr"  # beside the record: the in-process sampler's <node>/trace.h5 (joulebench.lifecycle)


@dataclasses.dataclass(frozen=True)
class RecordedRate:
    """One rate of a load as it saved itself: what its per-request fit reads, in the driver right after the rate and
    in a later process from the record and `requests.h5` alike."""

    label: str
    record_dir: Path
    table: RequestsTable
    window_ns: tuple[int, int]  # the measured window's edges
    idle_w: float | None  # the idle baseline's power (None: not measured)
    outside_job: tuple[str, ...]  # domains a whole-node request metered beside the job's: never the fitted device

    @classmethod
    def of(cls, record: RunRecord, table: RequestsTable, record_dir: Path) -> RecordedRate:
        """From a record whose measured window closed."""
        steady = record.window(STEADY)
        assert steady is not None, "a per-request fit needs the measured window"
        idle = record.meter.get("idle_baseline")
        return cls(str(record.config["rate"]), record_dir, table, (steady.t_start_ns, steady.t_end_ns),
                   idle.get("power_w") if isinstance(idle, dict) else None,
                   tuple(d.domain for d in steady.energy.outside_job) if steady.energy else ())


def steps_work_log(steps: Mapping[str, np.ndarray]) -> WorkLog:
    """A step log in the request table's form (`RequestsTable.steps`: kind, t0_ns, t1_ns and the members as CSR)
    as the fit's work log (members' amounts: prompt tokens in prefills, KV tokens in decodes)."""
    offsets, amounts, step_kind = steps["member_offsets"], steps["member_amount"], np.asarray(steps["kind"])
    counts = np.diff(offsets)
    kind = np.repeat(step_kind, counts)
    per_step = np.add.reduceat(amounts, offsets[:-1]) if len(amounts) else np.zeros(0, np.int64)
    per_step = np.where(counts > 0, per_step, 0)
    prefill = step_kind == StepKind.PREFILL
    return WorkLog.of_steps(
        t0_ns=np.asarray(steps["t0_ns"]), t1_ns=np.asarray(steps["t1_ns"]),
        prefill_tokens=np.where(prefill, per_step, 0), decode_rows=np.where(step_kind == StepKind.DECODE, counts, 0),
        kv_tokens=np.where(prefill, 0, per_step), member_offsets=offsets, member_request=steps["member_request"],
        member_prefill_tokens=np.where(kind == StepKind.PREFILL, amounts, 0),
        member_kv_tokens=np.where(kind == StepKind.DECODE, amounts, 0))


def arrivals_ns(table: RequestsTable) -> dict[int, int]:
    """Each arrived request's arrival on the node's clock (ns), from the table's seconds since its start: exact, as
    those are whole nanoseconds, which float64 holds to the nanosecond for days."""
    start = int(table.attrs["start_ns"])
    return {int(i): start + round(float(s) * 1e9) for i, s in zip(table.requests["id"], table.requests["arrival_s"],
                                                                    strict=True) if math.isfinite(s)}


def finished_ids(table: RequestsTable) -> set[int]:
    """The counted requests that finished (their whole-lifetime energy gives the per-request figures)."""
    rows = table.requests
    done = (rows["counted"] == 1) & (rows["status"] == RequestStatus.DONE) & np.isfinite(rows["finish_s"])
    return {int(i) for i in rows["id"][done]}


def engine_lifetimes(steps: Mapping[str, np.ndarray], arrival_ns: Mapping[int, int]) -> np.ndarray:
    """(id, arrival, end of its last step) of every request the engine admitted, by id: the time it shares idle
    power over."""
    members = np.asarray(steps["member_request"])
    step_of = np.repeat(np.arange(len(steps["t1_ns"])), np.diff(steps["member_offsets"]))
    ids, from_end = np.unique(members[::-1], return_index=True)
    ends = np.asarray(steps["t1_ns"])[step_of[len(members) - 1 - from_end]]
    return np.array([(int(i), arrival_ns[int(i)], int(t)) for i, t in zip(ids, ends, strict=True)],
                    dtype=np.int64).reshape(-1, 3)


def client_streams(table: RequestsTable, arrival_ns: Mapping[int, int]) -> list[client_estimate.ClientStream]:
    """What the client saw of each request that streamed output, from a server load's table (its `steps` hold the
    chunks' arrival times): sent at arrival, its output tokens spread evenly over its chunks."""
    rows, steps = table.requests, table.steps
    inputs = dict(zip(rows["id"].tolist(), rows["input_tokens"].tolist(), strict=True))
    outputs = dict(zip(rows["id"].tolist(), rows["output_tokens"].tolist(), strict=True))
    offsets = steps["chunk_offsets"]
    streams = []
    for k, i in enumerate(steps["request"].tolist()):
        chunks = np.asarray(steps["chunk_ns"][offsets[k]:offsets[k + 1]], dtype=np.int64)
        if len(chunks):
            streams.append(client_estimate.ClientStream(i, arrival_ns[i], inputs[i], chunks,
                                                        np.full(len(chunks), outputs[i] / len(chunks))))
    return streams


@dataclasses.dataclass
class Measured:
    """One window's material for the checks of later rates: its work, its counter, its edges and its fit."""

    label: str
    log: WorkLog
    knots: list[Knots]
    t0_ns: float
    t1_ns: float
    fit: RequestEnergyFit | None
    joint: JointMaterial | None = None  # what the sweep's joint fit needs of it (an engine's fitted rate)


@dataclasses.dataclass
class JointMaterial:
    """A fitted rate's part in the sweep's joint fit: its span and idle power, its record and its requests."""

    span: tuple[float, float]
    idle_w: float | None
    record_dir: Path
    lifetimes: np.ndarray
    finished: set[int]


CONTROLLED_WINDOW = "controlled_window"  # the table attribute (and energy block key) describing that window
CONTROLLED_BOUND_SHARE = 0.5  # each part's planned bound: at most this share of test (c)'s tolerance


def controlled_part_seconds(update_period_s: float, window_s: float) -> tuple[float, str]:
    """How long each part of the controlled-split window runs at least, and why: until its planned bound
    (jpwr.planned_bound_j: about two counter periods of its power, twice what the H100's stated bounds came to) is at
    most CONTROLLED_BOUND_SHARE of test (c)'s tolerance (SPLIT_SLACK) of its energy, 80 counter periods (8 s at
    100 ms); never longer than the rate's own measured window (a CPU run's, or a shorter --steady-seconds)."""
    fraction = SPLIT_SLACK * CONTROLLED_BOUND_SHARE
    bound_s = planned_bound_j(1.0, update_period_s) / fraction
    if bound_s <= window_s:
        return bound_s, (f"planned bound <= {fraction:.1%} of the part's energy (half the check's {SPLIT_SLACK:.0%}) "
                         f"with a {update_period_s * 1e3:.0f} ms counter")
    return window_s, (f"the rate's measured window ({window_s:.3g} s); a planned bound <= {fraction:.1%} needs "
                      f"{bound_s:.3g} s")


@dataclasses.dataclass
class Controlled:
    """The controlled-split window: its work, counter and the prefill and decode intervals; `plan`: how its parts'
    length was chosen (the table's CONTROLLED_WINDOW attribute; empty in a table from before it)."""

    log: WorkLog
    knots: list[Knots]
    prefill: tuple[float, float]
    decode: tuple[float, float]
    plan: ControlledPlan = dataclasses.field(default_factory=lambda: ControlledPlan())

    def describe(self) -> ControlledWindowBlock:
        """The window as measured, whatever a fit predicts of it: its plan, and per part its length, steps, counter
        energy with its own bound, and the card state and step sizes its work ran at (card_state.Conditions)."""
        segments = window_segments(self.knots, -np.inf, np.inf)
        return {**self.plan, "prefill": self._part(segments, *self.prefill),
                "decode": self._part(segments, *self.decode)}

    def _part(self, segments: Segments, t0: float, t1: float) -> ControlledPart:
        part: ControlledPart = {"seconds": (t1 - t0) / 1e9,
                                "steps": int(np.count_nonzero(self.log.fractions(t0, t1) > 0)),
                                **work_conditions([(self.log, t0, t1)]).to_dict()}
        try:
            energy, bound = measured_energy(segments, t0, t1)
        except JpwrError as exc:
            part["energy_unavailable_reason"] = str(exc)
        else:
            part.update({"energy_j": energy, "bound_j": bound,
                         "bound_fraction": bound / energy if energy > 0 else None})
        return part


def controlled_intervals(steps: Mapping[str, np.ndarray]) -> tuple[tuple[float, float], tuple[float, float]]:
    kind, t0, t1 = np.asarray(steps["kind"]), np.asarray(steps["t0_ns"]), np.asarray(steps["t1_ns"])
    prefill, decode = kind == StepKind.PREFILL, kind == StepKind.DECODE
    return ((float(t0[prefill].min()), float(t1[prefill].max())), (float(t0[decode].min()), float(t1[decode].max())))


class Counter(NamedTuple):
    """The fitted device's energy-counter knots in a trace and its card state (None: no SM clock recorded), or
    why there are none (`reason`)."""

    knots: list[Knots]
    reason: str | None
    state: CardState | None = None


def with_card_state(log: WorkLog, counter: Counter) -> WorkLog:
    """Each step of `log` with the card state of the counter segment it ran in (as it is, where none recorded)."""
    if counter.state is None:
        return log
    return log.with_state(*counter.state.at_steps(window_segments(counter.knots, -np.inf, np.inf), log.t0_ns,
                                                  log.t1_ns))


def in_process_counter(rate: RecordedRate) -> Counter:
    """The counter knots of the rate's in-process trace (the driver's fit), or why there are none."""
    return trace_knots(rate.record_dir / IN_PROCESS_TRACE, rate.outside_job)


def trace_knots(trace_dir: Path, outside_job: Collection[str] = (), missing: str = NO_TRACE) -> Counter:
    """The energy-counter knots of the first accelerator of the trace under `trace_dir` (<node>/trace.h5, or the
    segments of a sampler that never assembled it) that is the job's (`outside_job`: those a whole-node request
    metered beside it), or why there are none (`missing`: no trace there)."""
    nodes = sorted({p.parent for name in (TRACE_FILE, SEGMENT_DIR) for p in trace_dir.glob(f"*/{name}")})
    if not nodes:
        return Counter([], missing)
    trace = load_trace(nodes[0])
    devices = sorted((d for d in accelerator_domains(trace.domains) if d.id not in outside_job),
                     key=lambda d: (d.index is None, d.index or 0, d.id))
    if not devices:
        return Counter([], "the trace holds no accelerator of the job")
    knots = counter_knots(trace, devices[0])
    if not knots:
        return Counter([], f"{devices[0].id} has no energy counter (power-only sensors cannot be fitted)")
    return Counter(knots, None, CardState.of_trace(trace, devices[0]))


def _quantiles(values: np.ndarray | None) -> dict[str, float | None]:
    if values is None or not len(values):
        return {"p50": None, "p90": None}
    return {"p50": float(np.quantile(values, 0.5)), "p90": float(np.quantile(values, 0.9))}


def _fill_table(table: RequestsTable, parts: RequestParts) -> None:
    """Each request's parts into its row: work (prefill + decode) and idle always, prefill and decode where the fit
    splits them (else the table's attributes say why), and the whole (the record's J/request is over it)."""
    index = {int(i): k for k, i in enumerate(table.requests["id"])}
    rows = np.array([index[int(i)] for i in parts.ids], dtype=np.int64)
    for name, values, interval in (("prefill_j", parts.prefill_j, parts.prefill_interval),
                                   ("decode_j", parts.decode_j, parts.decode_interval),
                                   ("idle_j", parts.idle_j, parts.idle_interval),
                                   ("work_j", parts.work_j, parts.work_interval)):
        if values is None or interval is None:
            continue
        table.requests[name][rows] = values
        table.requests[f"{name}_low"][rows] = interval[:, 0]
        table.requests[f"{name}_high"][rows] = interval[:, 1]
    table.requests["energy_j"][rows] = parts.total_j
    if parts.split_reason:
        table.attrs["energy_split_unavailable_reason"] = parts.split_reason


def _fit_summary(fit: RequestEnergyFit, method: str, trial: TermTrial, cap: CapTrial) -> RequestEnergyBlock:
    """The fit's coefficients (at the card-state term's reference clock where it was adopted; uncapped costs and
    capped powers where the power-cap term was), its card-state terms' trials, the conditions of its data and its
    held-out halves with theirs."""
    intervals = fit.intervals
    return {"method": method, "columns": list(fit.columns),
            "coefficients": {c: float(v) for c, v in zip(fit.columns, fit.coefficients, strict=True)},
            "intervals_95": {c: [float(a), float(b)] for c, (a, b) in zip(fit.columns, intervals, strict=True)},
            "idle_w": fit.idle_w, "idle_given": fit.given_idle_w is not None, "notes": fit.notes,
            "vif": {c: float(v) for c, v in zip(fit.columns, fit.vif, strict=True)},
            "prefill_block_vif": float(fit.prefill_vif), "separable": fit.separable,
            "split_unavailable_reason": fit.reason, "segments": fit.segment_count, "clock_term": trial.to_dict(),
            "cap_term": cap.to_dict(COLUMNS),
            "fitted_conditions": None if fit.fitted is None else fit.fitted.to_dict(),
            "held_out_halves": _halves(fit)}


def _halves(fit: RequestEnergyFit) -> list[HeldOutHalfCheck]:
    """Test (b): the fit's held-out halves, each with its two sides' conditions."""
    sides = list(fit.fold_conditions) + [None] * (len(fit.folds) - len(fit.fold_conditions))
    return [{"measured_j": f.measured_j, "predicted_j": f.predicted_j, "bound_j": f.bound_j, "closes": f.closes,
             **check_fields(side, f.closes)} for f, side in zip(fit.folds, sides, strict=True)]


def _checks(fit: RequestEnergyFit, cross_rate: list[CrossRateCheck], controlled: Controlled | None
            ) -> RequestEnergyBlock:
    """A fit's checks: (b) its held-out halves, (a) `cross_rate`, (c) the controlled split, and which failed."""
    checks: RequestEnergyBlock = {"held_out_halves": _halves(fit), "cross_rate": cross_rate,
                                  "controlled_split": _controlled(fit, controlled)}
    checks["checks_failed"] = failed_checks(checks)
    return checks


FitT = TypeVar("FitT")


def _own_and_cap_checks(cap: CapTrial, without: FitT, with_term: FitT | None,
                        checks: Callable[[FitT], RequestEnergyBlock]) -> tuple[RequestEnergyBlock, CapTrial]:
    """The chosen fit's checks, and the power-cap trial with the checks of the fits without and with the term (its
    effect on each), each computed once: the chosen fit is one of the two, the one with the term where adopted."""
    if with_term is None:
        return checks(without), cap
    both = checks(without), checks(with_term)
    return both[cap.adopted], cap.with_checks(*both)


@dataclasses.dataclass
class Sweep:
    """What later rates of one invocation check against: earlier windows and the controlled-split window; and the
    rates left out of the sweep's joint fit before it (label -> their record's directory and why)."""

    earlier: list[Measured] = dataclasses.field(default_factory=list)
    controlled: Controlled | None = None
    left_out: dict[str, tuple[Path, str]] = dataclasses.field(default_factory=dict)


def serving_energy(rate: RecordedRate, counter: Counter, sweep: Sweep) -> RequestEnergyBlock:
    """The engine's `request_energy` block (figures, checks and reasons) of a rate, on `counter` (trace_knots' answer);
    fills the table's energy columns. The first rate's table holds the controlled-split window's step log. It also
    measures the client-side estimate's error on these requests (llm_inference.client_estimate)."""
    knots, reason, _ = counter
    if reason:
        sweep.left_out[rate.label] = (rate.record_dir, reason)
        return {"unavailable_reason": reason}
    table = rate.table
    if table.controlled_steps:
        sweep.controlled = Controlled(with_card_state(steps_work_log(table.controlled_steps), counter), knots,
                                      *controlled_intervals(table.controlled_steps),
                                      checked_block(ControlledPlan, dict(table.attrs.get(CONTROLLED_WINDOW, {})),
                                                    CONTROLLED_WINDOW))
    wl = with_card_state(steps_work_log(table.steps), counter)
    arrival = arrivals_ns(table)
    lifetimes = engine_lifetimes(table.steps, arrival)
    finished = finished_ids(table)
    result, split = _fit_and_split(rate, wl, lifetimes, finished, knots, sweep, METHOD)
    if split is None:
        sweep.left_out[rate.label] = (rate.record_dir, str(result.get("unavailable_reason")))
    else:
        sweep.earlier[-1].joint = JointMaterial(split[1], rate.idle_w, rate.record_dir, lifetimes, finished)
        inputs = {int(i): int(t) for i, t in zip(table.requests["id"], table.requests["input_tokens"], strict=True)}
        try:
            result["client_side_estimate_error"] = client_estimate.estimate_error(
                split[0], client_estimate.engine_streams(wl, arrival, inputs), lifetimes, knots, rate.idle_w, split[1])
        except JpwrError as exc:
            result["client_side_estimate_error"] = {"unavailable_reason": str(exc)}
    return result


def client_energy(rate: RecordedRate, counter: Counter, sweep: Sweep) -> RequestEnergyBlock:
    """A server's `request_energy` block from its client's view (labelled "client-side estimate")."""
    knots, reason, _ = counter
    if reason:
        return {"unavailable_reason": reason}
    streams = client_streams(rate.table, arrivals_ns(rate.table))
    lifetimes = np.array([(s.id, s.sent_ns, int(s.chunk_ns[-1])) for s in streams], dtype=np.int64).reshape(-1, 3)
    try:
        wl = client_estimate.client_work_log(streams)
    except JpwrError as exc:
        return {"unavailable_reason": str(exc)}
    result, _ = _fit_and_split(rate, wl, lifetimes, finished_ids(rate.table), knots, sweep, client_estimate.METHOD)
    return {"estimate": "client-side estimate", **result}


def request_energy_figures(energy: RequestEnergyBlock) -> LoadMetrics:
    """The record's J/request p50/p90 from its `requests.energy` block (None where the block has none)."""
    quantiles = energy.get("energy_per_request_j") or {}
    return {"energy_per_request_p50_j": quantiles.get("p50"), "energy_per_request_p90_j": quantiles.get("p90")}


def attach_energy(record: RunRecord, table: RequestsTable, energy: RequestEnergyBlock) -> LoadMetrics:
    """A rate's per-request block into its record and its reason (or none) into its table's attributes; returns the
    record's figures of it (J/request p50/p90)."""
    record.requests = {**(record.requests or RequestsBlock()), "energy": energy}
    if energy.get("unavailable_reason"):
        table.attrs["energy_unavailable_reason"] = energy["unavailable_reason"]
    else:
        table.attrs.pop("energy_unavailable_reason", None)
    return request_energy_figures(energy)


def _fit_and_split(rate: RecordedRate, wl: WorkLog, lifetimes: np.ndarray, finished: set[int], knots: list[Knots],
                   sweep: Sweep, method: str
                   ) -> tuple[RequestEnergyBlock, tuple[RequestParts, tuple[float, float]] | None]:
    """The fit over the whole load, each request's parts, the checks; and the requests' parts over the fitted span
    with that span (None if refused)."""
    label, idle_w, table = rate.label, rate.idle_w, rate.table
    t0, t1 = float(rate.window_ns[0]), float(rate.window_ns[1])
    covered = (float(min(k.tau_ns[0] for k in knots)), float(max(k.tau_ns[-1] for k in knots)))
    span = (max(float(wl.t0_ns.min()), covered[0]), min(float(wl.t1_ns.max()), covered[1]))  # where the counter is
    held_out = [HeldOutWindow(m.label, m.log, m.knots, m.t0_ns, m.t1_ns) for m in sweep.earlier]
    try:
        base, trial = fit_with_clock_trial(wl, knots, idle_w, *span, held_out)
        fit, cap = fit_with_cap_trial(wl, knots, idle_w, *span, held_out, base, trial)
    except JpwrError as exc:
        sweep.earlier.append(Measured(label, wl, knots, t0, t1, None))
        return {"unavailable_reason": f"fit refused: {exc}"}, None
    try:
        whole = request_parts(fit, wl, lifetimes, *span)
        window = request_parts(fit, wl, lifetimes, t0, t1)
    except JpwrError as exc:
        sweep.earlier.append(Measured(label, wl, knots, t0, t1, fit))
        return {**_fit_summary(fit, method, trial, cap), "unavailable_reason": f"request parts refused: {exc}"}, None
    _fill_table(table, whole)
    own, cap = _own_and_cap_checks(cap, base, cap.model, lambda model: _checks(
        model, _cross_rate(label, model, wl, knots, t0, t1, sweep.earlier), sweep.controlled))
    result: RequestEnergyBlock = {
        **_fit_summary(fit, method, trial, cap), "fitted_span_s": (span[1] - span[0]) / 1e9,
        "share_rule": "idle power at each instant shared equally by the requests in the system (arrived, not "
                      "finished); time with none is unattributed idle",
        **_per_request(whole, finished),
        "window_remainder_j": window.remainder_j, "window_remainder_bound_j": window.remainder_bound_j,
        "window_unattributed_idle_j": window.unattributed_idle_j,
        "cross_rate": own["cross_rate"], "controlled_split": own["controlled_split"]}
    if sweep.controlled is not None:
        result["controlled_window"] = sweep.controlled.describe()
    result["checks_failed"] = own["checks_failed"]
    sweep.earlier.append(Measured(label, wl, knots, t0, t1, fit))
    return result, (whole, span)


def _per_request(whole: RequestParts, finished: set[int]) -> RequestEnergyBlock:
    """The finished requests' count, J/request quantiles and the parts' shares of their energy."""
    done = [k for k, i in enumerate(whole.ids) if int(i) in finished]
    total = whole.total_j[done]
    parts = {name: None if values is None else float(values[done].sum())
             for name, values in (("prefill", whole.prefill_j), ("decode", whole.decode_j), ("idle", whole.idle_j))}
    share_total = float(total.sum()) if len(done) else None
    return {"requests": len(done), "energy_per_request_j": _quantiles(total),
            "shares": {name: (None if value is None or not share_total else value / share_total)
                       for name, value in parts.items()}}


def joint_blocks(sweep: Sweep) -> dict[str, RequestEnergyBlock]:
    """Each rate's `joint` block: the sweep's rates fitted together (joulebench.joint_energy) and this rate's
    checks on that fit, (a) leave-one-rate-out, (b) held-out halves, (c) the controlled split; or why this rate has
    none (left out, and for what; or fewer than two rates to fit). {} for a single rate (it keeps its own fit)."""
    left = {label: why for label, (_, why) in sweep.left_out.items()}
    if len(_sweep_labels(sweep)) < MIN_RATES:
        return {}
    rates = [m for m in sweep.earlier if m.fit is not None and m.joint is not None]
    for m in sweep.earlier:
        if m.fit is None or m.joint is None:
            left.setdefault(m.label, "its own fit or its requests' parts were refused")
    windows, left_short = fitted_rates([RateWindow(m.label, m.log, m.knots, m.joint.idle_w, m.joint.span,
                                                   (m.t0_ns, m.t1_ns)) for m in rates if m.joint is not None])
    left.update(left_short)
    rates = [m for m in rates if m.label not in left_short]
    named = "; ".join(f"rate {label}: {why}" for label, why in left.items())
    joint = None
    if len(windows) < MIN_RATES:
        reason = f"fewer than {MIN_RATES} rates of the sweep can be fitted together (left out: {named})"
    else:
        try:
            joint = fit_joint(windows)
        except JpwrError as exc:
            reason = f"joint fit refused: {exc}"
    if joint is None:
        return {label: {"unavailable_reason": reason, "rates_left_out": left} for label in _sweep_labels(sweep)}
    fitted = ", ".join(joint.labels)
    blocks: dict[str, RequestEnergyBlock] = {
        label: {"unavailable_reason": f"left out of the joint fit over rates {fitted}: {why}", "rates_left_out": left}
        for label, why in left.items()}
    for m, window in zip(rates, windows, strict=True):
        assert m.joint is not None
        fit = joint.per_rate[m.label]
        without, with_term = joint.cap_fits if joint.cap_fits is not None else (joint, None)
        own, cap = _own_and_cap_checks(joint.cap, without, with_term,
                                       functools.partial(_joint_checks, m.label, window, sweep.controlled))
        block: RequestEnergyBlock = {**_fit_summary(fit, JOINT_METHOD, joint.clock, cap), "rates": list(joint.labels),
                                     "rates_left_out": left, "joint_segments": joint.segment_count}
        try:
            block.update(_per_request(request_parts(fit, m.log, m.joint.lifetimes, *m.joint.span), m.joint.finished))
        except JpwrError as exc:
            block["unavailable_reason"] = f"request parts refused: {exc}"
        block.update(own)
        blocks[m.label] = block
    return blocks


def _joint_checks(label: str, window: RateWindow, controlled: Controlled | None, joint: JointFit
                  ) -> RequestEnergyBlock:
    """A rate's checks on a joint fit: (b) its view's held-out halves, (a) its leave-one-rate-out, (c) the
    controlled split, and which failed."""
    return _checks(joint.per_rate[label], [_left_out_check(joint.left_out[label], window)], controlled)


def _sweep_labels(sweep: Sweep) -> list[str]:
    return [*(m.label for m in sweep.earlier), *(label for label in sweep.left_out if
                                                 label not in {m.label for m in sweep.earlier})]


def _left_out_check(model: RequestEnergyFit | str, window: RateWindow) -> CrossRateCheck:
    row: CrossRateCheck = {"fitted_at": f"all but {window.label}", "predicted": window.label}
    if isinstance(model, str):
        return {**row, "passes": False, "reason": model}
    try:
        check = cross_check(model, window.log, window.knots, *window.window)
    except JpwrError as exc:
        return {**row, "passes": False, "reason": str(exc)}
    return {**row, "measured_j": check.measured_j, "predicted_j": check.predicted_j, "bound_j": check.bound_j,
            "passes": bool(check.passes), **check_fields(check.conditions, check.passes)}


def write_joint(sweep: Sweep, say: Callable[[str], None]) -> None:
    """After a sweep's last rate: each fitted rate's record gains `requests.energy.joint` (joint_blocks), and a line
    per rate says which of its checks failed on the joint fit."""
    blocks = joint_blocks(sweep)
    directories = {**{label: d for label, (d, _) in sweep.left_out.items()},
                   **{m.label: m.joint.record_dir for m in sweep.earlier if m.joint is not None}}
    for label, block in blocks.items():
        if label not in directories or not amend_written_record(directories[label], partial(_add_joint, block)):
            continue
        if "rates" in block:
            say(f"rate {label}: joint per-request fit over rates {', '.join(block['rates'])}: checks failed "
                f"{block.get('checks_failed', block.get('unavailable_reason'))}")
        else:
            say(f"rate {label}: joint per-request fit n/a (left out: {', '.join(block['rates_left_out'])}; the "
                "record's requests.energy.joint says why)")


def _add_joint(block: RequestEnergyBlock, record: RunRecord) -> bool:
    """The joint block beside the rate's own per-request fit; False where the record has none."""
    if record.requests is None or not isinstance(record.requests.get("energy"), dict):
        return False
    record.requests["energy"]["joint"] = block
    return True


def failed_checks(block: RequestEnergyBlock) -> str:
    """The model's checks that failed, in one line for tables ("none" when all that ran passed): (a) cross-rate
    pairs `fitted->predicted`, (b) held-out halves by number, (c) the controlled split's parts."""
    failed = []
    cross = [f"{c['fitted_at']}->{c['predicted']}" for c in block.get("cross_rate", []) if not c["passes"]]
    halves = [str(k + 1) for k, f in enumerate(block.get("held_out_halves", [])) if not f["closes"]]
    controlled = block.get("controlled_split")
    parts = [c["part"] for c in controlled if not c["passes"]] if isinstance(controlled, list) else []
    for name, items in (("a (cross-rate)", cross), ("b (held-out half)", halves), ("c (controlled split)", parts)):
        if items:
            failed.append(f"{name}: {', '.join(items)}")
    return "; ".join(failed) or "none"


def _cross_rate(label: str, fit: RequestEnergyFit, wl: WorkLog, knots: list[Knots], t0: float, t1: float,
                earlier: list[Measured]) -> list[CrossRateCheck]:
    """Test (a) both ways between this window and every earlier rate's."""
    checks: list[CrossRateCheck] = []
    for other in earlier:
        pairs = [(label, other.label, fit, other.log, other.knots, other.t0_ns, other.t1_ns)]
        if other.fit is not None:
            pairs.append((other.label, label, other.fit, wl, knots, t0, t1))
        for fitted_at, predicted, model, log, counter, a, b in pairs:
            row: CrossRateCheck = {"fitted_at": fitted_at, "predicted": predicted}
            try:
                check = cross_check(model, log, counter, a, b)
            except JpwrError as exc:
                checks.append({**row, "passes": False, "reason": str(exc)})
                continue
            checks.append({**row, "measured_j": check.measured_j, "predicted_j": check.predicted_j,
                           "bound_j": check.bound_j, "passes": check.passes,
                           **check_fields(check.conditions, check.passes)})
    return checks


def _controlled(fit: RequestEnergyFit, controlled: Controlled | None) -> list[ControlledPartCheck] | str:
    """Test (c) against the controlled-split window, or why it could not run."""
    if controlled is None:
        return "no controlled-split window in this invocation"
    try:
        parts = controlled_split_check(fit, controlled.log, controlled.knots, *controlled.prefill, *controlled.decode)
    except JpwrError as exc:
        return f"not checked: {exc}"
    return [{"part": p.part, "measured_j": p.measured_j, "measured_bound_j": p.measured_bound_j,
             "measured_bound_fraction": p.measured_bound_j / abs(p.measured_j) if p.measured_j else None,
             "predicted_j": p.predicted_j, "relative_error": p.relative_error, "passes": p.passes, "reason": p.reason,
             **check_fields(p.conditions, p.passes)} for p in parts]
