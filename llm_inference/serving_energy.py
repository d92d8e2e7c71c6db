"""Per-request energy of a load run and the tests of its model, from the in-process trace beside the record.

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
the in-sample remainder of the window is reported with its bound as a diagnostic, not as a test.
Under an external sampler the trace is written only when the sampler stops, after the driver: the figures are
then n/a with that reason.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from joulebench.joint_energy import MIN_RATES, RateWindow, fit_joint
from joulebench.lifecycle import amend_written_record
from joulebench.record import RunRecord
from joulebench.request_energy import (
    RequestEnergyFit,
    RequestParts,
    WorkLog,
    controlled_split_check,
    cross_check,
    fit_request_energy,
    request_parts,
)
from joulebench.requests_table import RequestsTable
from joulebench.segment_fit import counter_knots
from jpwr import JpwrError, Window
from jpwr.trace import Knots, accelerator_domains, load_trace
from llm_inference import client_estimate
from llm_inference.serve_loop import DECODE, PREFILL, ServeLog

METHOD = ("counter-segment fit: E = idle power x seconds + a x prefill tokens + e x prefill steps + b x decode steps + "
          "c x row-steps + d x attended KV tokens, NNLS, block bootstrap (joulebench.request_energy)")
JOINT_METHOD = ("the same model fitted over every rate of the sweep at once, a..e shared, idle power per rate, blocks "
                "drawn per rate (joulebench.joint_energy)")


def work_log(log: ServeLog) -> WorkLog:
    """The loop's steps as the fit's work log (members' amounts: prompt tokens in prefills, KV tokens in decodes)."""
    return steps_work_log({"kind": log.step_kind, "t0_ns": log.step_t0_ns, "t1_ns": log.step_t1_ns,
                           **dict(zip(("member_offsets", "member_request", "member_amount"), log.members(),
                                      strict=True))})


def steps_work_log(steps: Mapping[str, np.ndarray]) -> WorkLog:
    """A step log in the request table's form (`RequestsTable.steps`: kind, t0_ns, t1_ns and the members as CSR)
    as the fit's work log: what a recorded run's fit is rebuilt from."""
    offsets, amounts, step_kind = steps["member_offsets"], steps["member_amount"], np.asarray(steps["kind"])
    counts = np.diff(offsets)
    kind = np.repeat(step_kind, counts)
    per_step = np.add.reduceat(amounts, offsets[:-1]) if len(amounts) else np.zeros(0, np.int64)
    per_step = np.where(counts > 0, per_step, 0)
    prefill = step_kind == PREFILL
    return WorkLog.of_steps(
        t0_ns=np.asarray(steps["t0_ns"]), t1_ns=np.asarray(steps["t1_ns"]),
        prefill_tokens=np.where(prefill, per_step, 0), decode_rows=np.where(step_kind == DECODE, counts, 0),
        kv_tokens=np.where(prefill, 0, per_step), member_offsets=offsets, member_request=steps["member_request"],
        member_prefill_tokens=np.where(kind == PREFILL, amounts, 0),
        member_kv_tokens=np.where(kind == DECODE, amounts, 0))


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


@dataclasses.dataclass
class Controlled:
    """The controlled-split window: its work, counter and the prefill and decode intervals."""

    log: WorkLog
    knots: list[Knots]
    prefill: tuple[float, float]
    decode: tuple[float, float]


def controlled_intervals(log: ServeLog) -> tuple[tuple[float, float], tuple[float, float]]:
    prefill, decode = log.step_kind == PREFILL, log.step_kind == DECODE
    return ((float(log.step_t0_ns[prefill].min()), float(log.step_t1_ns[prefill].max())),
            (float(log.step_t0_ns[decode].min()), float(log.step_t1_ns[decode].max())))


def trace_knots(jpwr_dir: Path) -> tuple[list[Knots], str | None]:
    """The first accelerator's energy-counter knots from the in-process trace, or why there are none."""
    nodes = sorted(p.parent for p in jpwr_dir.glob("*/trace.h5"))
    if not nodes:
        return [], ("no in-process trace beside the record (under an external sampler the trace is written when it "
                    "stops, after the driver; meter in-process with --energy-methods for per-request energy)")
    trace = load_trace(nodes[0])
    devices = sorted(accelerator_domains(trace.domains), key=lambda d: (d.index is None, d.index or 0, d.id))
    if not devices:
        return [], "the trace holds no accelerator"
    knots = counter_knots(trace, devices[0])
    return knots, None if knots else f"{devices[0].id} has no energy counter (power-only sensors cannot be fitted)"


def _lifetimes(arrival_ns: dict[int, int], finish_ns: dict[int, int], ids: list[int]) -> np.ndarray:
    return np.array([(i, arrival_ns[i], finish_ns[i]) for i in ids], dtype=np.int64).reshape(-1, 3)


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


def _fit_summary(fit: RequestEnergyFit, method: str) -> dict[str, Any]:
    intervals = fit.intervals
    return {"method": method, "columns": list(fit.columns),
            "coefficients": {c: float(v) for c, v in zip(fit.columns, fit.coefficients, strict=True)},
            "intervals_95": {c: [float(a), float(b)] for c, (a, b) in zip(fit.columns, intervals, strict=True)},
            "idle_w": fit.idle_w, "idle_given": fit.given_idle_w is not None, "notes": fit.notes,
            "vif": {c: float(v) for c, v in zip(fit.columns, fit.vif, strict=True)},
            "prefill_block_vif": float(fit.prefill_vif), "separable": fit.separable,
            "split_unavailable_reason": fit.reason, "segments": fit.segment_count,
            "held_out_halves": [{"measured_j": f.measured_j, "predicted_j": f.predicted_j, "bound_j": f.bound_j,
                                 "closes": f.closes} for f in fit.folds]}


@dataclasses.dataclass
class Sweep:
    """What later rates of one invocation check against: earlier windows and the controlled-split window."""

    earlier: list[Measured] = dataclasses.field(default_factory=list)
    controlled: Controlled | None = None


def serving_energy(label: str, log: ServeLog, steady: Window, finished: set[int], idle_w: float | None,
                   jpwr_dir: Path, table: RequestsTable, sweep: Sweep, controlled_log: ServeLog | None
                   ) -> dict[str, Any]:
    """The engine's `request_energy` block (figures, checks and reasons); fills the table's energy columns.
    `finished`: the counted requests that finished (their whole-lifetime energy gives the per-request figures);
    `controlled_log`: this record's controlled-split window, if it ran one. It also measures the client-side
    estimate's error on these requests (llm_inference.client_estimate)."""
    knots, reason = trace_knots(jpwr_dir)
    if reason:
        return {"unavailable_reason": reason}
    if controlled_log is not None:
        sweep.controlled = Controlled(work_log(controlled_log), knots, *controlled_intervals(controlled_log))
    wl = work_log(log)
    lifetimes = _lifetimes(log.arrival_ns, log.finish_ns, sorted(log.admitted_ns))
    result, split = _fit_and_split(label, wl, lifetimes, steady, finished, idle_w, knots, table, sweep, METHOD)
    if split is not None:
        sweep.earlier[-1].joint = JointMaterial(split[1], idle_w, jpwr_dir.parent, lifetimes, finished)
        inputs = {int(i): int(t) for i, t in zip(table.requests["id"], table.requests["input_tokens"], strict=True)}
        try:
            result["client_side_estimate_error"] = client_estimate.estimate_error(
                split[0], client_estimate.engine_streams(wl, log.arrival_ns, inputs), lifetimes, knots, idle_w,
                split[1])
        except JpwrError as exc:
            result["client_side_estimate_error"] = {"unavailable_reason": str(exc)}
    return result


def client_energy(label: str, streams: list[client_estimate.ClientStream], lifetimes: np.ndarray, steady: Window,
                  finished: set[int], idle_w: float | None, jpwr_dir: Path, table: RequestsTable, sweep: Sweep
                  ) -> dict[str, Any]:
    """A server's `request_energy` block from its client's view (labelled "client-side estimate")."""
    knots, reason = trace_knots(jpwr_dir)
    if reason:
        return {"unavailable_reason": reason}
    try:
        wl = client_estimate.client_work_log(streams)
    except JpwrError as exc:
        return {"unavailable_reason": str(exc)}
    result, _ = _fit_and_split(label, wl, lifetimes, steady, finished, idle_w, knots, table, sweep,
                               client_estimate.METHOD)
    return {"estimate": "client-side estimate", **result}


def _fit_and_split(label: str, wl: WorkLog, lifetimes: np.ndarray, steady: Window, finished: set[int],
                   idle_w: float | None, knots: list[Knots], table: RequestsTable, sweep: Sweep, method: str
                   ) -> tuple[dict[str, Any], tuple[RequestParts, tuple[float, float]] | None]:
    """The fit over the whole load, each request's parts, the checks; and the requests' parts over the fitted span
    with that span (None if refused)."""
    t0, t1 = float(steady.t_start_ns), float(steady.t_end_ns)
    covered = (float(min(k.tau_ns[0] for k in knots)), float(max(k.tau_ns[-1] for k in knots)))
    span = (max(float(wl.t0_ns.min()), covered[0]), min(float(wl.t1_ns.max()), covered[1]))  # where the counter is
    try:
        fit = fit_request_energy(wl, knots, idle_w, *span)
    except JpwrError as exc:
        sweep.earlier.append(Measured(label, wl, knots, t0, t1, None))
        return {"unavailable_reason": f"fit refused: {exc}"}, None
    try:
        whole = request_parts(fit, wl, lifetimes, *span)
        window = request_parts(fit, wl, lifetimes, t0, t1)
    except JpwrError as exc:
        sweep.earlier.append(Measured(label, wl, knots, t0, t1, fit))
        return {**_fit_summary(fit, method), "unavailable_reason": f"request parts refused: {exc}"}, None
    _fill_table(table, whole)
    result: dict[str, Any] = {
        **_fit_summary(fit, method), "fitted_span_s": (span[1] - span[0]) / 1e9,
        "share_rule": "idle power at each instant shared equally by the requests in the system (arrived, not "
                      "finished); time with none is unattributed idle",
        **_per_request(whole, finished),
        "window_remainder_j": window.remainder_j, "window_remainder_bound_j": window.remainder_bound_j,
        "window_unattributed_idle_j": window.unattributed_idle_j,
        "cross_rate": _cross_rate(label, fit, wl, knots, t0, t1, sweep.earlier),
        "controlled_split": _controlled(fit, sweep.controlled)}
    result["checks_failed"] = failed_checks(result)
    sweep.earlier.append(Measured(label, wl, knots, t0, t1, fit))
    return result, (whole, span)


def _per_request(whole: RequestParts, finished: set[int]) -> dict[str, Any]:
    """The finished requests' count, J/request quantiles and the parts' shares of their energy."""
    done = [k for k, i in enumerate(whole.ids) if int(i) in finished]
    total = whole.total_j[done]
    parts = {name: None if values is None else float(values[done].sum())
             for name, values in (("prefill", whole.prefill_j), ("decode", whole.decode_j), ("idle", whole.idle_j))}
    share_total = float(total.sum()) if len(done) else None
    return {"requests": len(done), "energy_per_request_j": _quantiles(total),
            "shares": {name: (None if value is None or not share_total else value / share_total)
                       for name, value in parts.items()}}


def joint_blocks(sweep: Sweep) -> dict[str, dict[str, Any]]:
    """Each fitted rate's `joint` block: the sweep's rates fitted together (joulebench.joint_energy) and this rate's
    checks on that fit, (a) leave-one-rate-out, (b) held-out halves, (c) the controlled split; {} with fewer than
    two fitted rates (a single rate keeps its own fit only)."""
    rates = [m for m in sweep.earlier if m.fit is not None and m.joint is not None]
    if len(rates) < MIN_RATES:
        return {}
    windows = [RateWindow(m.label, m.log, m.knots, m.joint.idle_w, m.joint.span, (m.t0_ns, m.t1_ns))
               for m in rates if m.joint is not None]
    try:
        joint = fit_joint(windows)
    except JpwrError as exc:
        return {m.label: {"unavailable_reason": f"joint fit refused: {exc}"} for m in rates}
    blocks = {}
    for m, window in zip(rates, windows, strict=True):
        assert m.joint is not None
        fit = joint.per_rate[m.label]
        block: dict[str, Any] = {**_fit_summary(fit, JOINT_METHOD), "rates": list(joint.labels),
                                 "joint_segments": joint.segment_count}
        try:
            block.update(_per_request(request_parts(fit, m.log, m.joint.lifetimes, *m.joint.span), m.joint.finished))
        except JpwrError as exc:
            block["unavailable_reason"] = f"request parts refused: {exc}"
        block["cross_rate"] = [_left_out_check(joint.left_out[m.label], window)]
        block["controlled_split"] = _controlled(fit, sweep.controlled)
        block["checks_failed"] = failed_checks(block)
        blocks[m.label] = block
    return blocks


def _left_out_check(model: RequestEnergyFit | str, window: RateWindow) -> dict[str, Any]:
    row: dict[str, Any] = {"fitted_at": f"all but {window.label}", "predicted": window.label}
    if isinstance(model, str):
        return {**row, "passes": False, "reason": model}
    try:
        check = cross_check(model, window.log, window.knots, *window.window)
    except JpwrError as exc:
        return {**row, "passes": False, "reason": str(exc)}
    return {**row, "measured_j": check.measured_j, "predicted_j": check.predicted_j, "bound_j": check.bound_j,
            "passes": check.passes}


def write_joint(sweep: Sweep, say: Callable[[str], None]) -> None:
    """After a sweep's last rate: each fitted rate's record gains `requests.energy.joint` (joint_blocks), and a line
    per rate says which of its checks failed on the joint fit."""
    blocks = joint_blocks(sweep)
    for m in sweep.earlier:
        block = blocks.get(m.label)
        if block is None or m.joint is None:
            continue
        if not amend_written_record(m.joint.record_dir, partial(_add_joint, block)):
            continue
        say(f"rate {m.label}: joint per-request fit over rates {', '.join(block.get('rates', []))}: checks failed "
            f"{block.get('checks_failed', block.get('unavailable_reason'))}")


def _add_joint(block: dict[str, Any], record: RunRecord) -> bool:
    """The joint block beside the rate's own per-request fit; False where the record has none."""
    if record.requests is None or not isinstance(record.requests.get("energy"), dict):
        return False
    record.requests["energy"]["joint"] = block
    return True


def failed_checks(block: dict[str, Any]) -> str:
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
                earlier: list[Measured]) -> list[dict[str, Any]]:
    """Test (a) both ways between this window and every earlier rate's."""
    checks = []
    for other in earlier:
        pairs = [(label, other.label, fit, other.log, other.knots, other.t0_ns, other.t1_ns)]
        if other.fit is not None:
            pairs.append((other.label, label, other.fit, wl, knots, t0, t1))
        for fitted_at, predicted, model, log, counter, a, b in pairs:
            row: dict[str, Any] = {"fitted_at": fitted_at, "predicted": predicted}
            try:
                check = cross_check(model, log, counter, a, b)
            except JpwrError as exc:
                checks.append({**row, "passes": False, "reason": str(exc)})
                continue
            checks.append({**row, "measured_j": check.measured_j, "predicted_j": check.predicted_j,
                           "bound_j": check.bound_j, "passes": check.passes})
    return checks


def _controlled(fit: RequestEnergyFit, controlled: Controlled | None) -> list[dict[str, Any]] | str:
    """Test (c) against the controlled-split window, or why it could not run."""
    if controlled is None:
        return "no controlled-split window in this invocation"
    try:
        parts = controlled_split_check(fit, controlled.log, controlled.knots, *controlled.prefill, *controlled.decode)
    except JpwrError as exc:
        return f"not checked: {exc}"
    return [{"part": p.part, "measured_j": p.measured_j, "measured_bound_j": p.measured_bound_j,
             "predicted_j": p.predicted_j, "relative_error": p.relative_error, "passes": p.passes, "reason": p.reason}
            for p in parts]
