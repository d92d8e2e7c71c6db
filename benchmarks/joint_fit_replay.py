#!/usr/bin/env python3
"""Issues 45 and 60: the per-request energy fit of a recorded load sweep replayed by the driver's own code, without
and with the card's state (SM clock, power cap), per rate and jointly over its rates.

    python benchmarks/joint_fit_replay.py benchmarks/results/2026-11-25-session10/serving-compact/sweep
    python benchmarks/joint_fit_replay.py --check SWEEP   # every record's coefficients and checks reproduced?

Reads each rate_<r>/ of the sweep (run_record.json, requests.h5 with the engine's step log, jpwr/<node>/trace.h5
with the energy counter and the card's readings) and fits it as the driver does after each rate and after the
sweep (llm_inference.serving_energy: serving_energy per rate in order, then joint_blocks): once with the trace's
card state stripped (the model without the clock term: the driver before issue 60) and once as recorded. The
thresholds are the library's.

Sweeps recorded before the controlled split's step log was saved (2026-11-25) have its work only in the checks'
figures: its amounts are recovered from the records (each rate's recorded prediction is its coefficients times
the window's amounts, a linear system over the rates; the script checks it is exact), its measured side is the
record's, its card state the trace's over its intervals (decode: the record's `controlled` window; prefill: the
interval ending there whose counter energy less idle is the recorded one). With the term, its amounts count at
the median clock of their interval.

Sweeps recorded since issue 60's multi-step controlled split keep its step log and plan in the first rate's table:
its checks run as the driver ran them, and the report prints each part as measured (length, steps, step size,
counter energy with its own bound, card state).

--check compares what the records hold (coefficients to 1e-9 relative, every check's outcome) with the replay of
the model they name, and exits 1 on a difference, 0 when every record is reproduced.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from joulebench.card_state import Comparison, Conditions
from joulebench.joint_energy import JointFit, RateWindow, fit_joint
from joulebench.record import RECORD_FILE, read_run_record
from joulebench.record_types import CapTermTrial, ClockTermTrial, RequestEnergyBlock
from joulebench.request_energy import COLUMNS, DECODE, PREFILL, PartCheck, RequestEnergyFit, measured_energy
from joulebench.requests_table import FILE_NAME, REQUEST_COLUMNS, read_requests
from joulebench.segment_fit import CLOSURE_Z, window_segments
from llm_inference.serving_energy import (
    IN_PROCESS_TRACE,
    Counter,
    RecordedRate,
    Sweep,
    joint_blocks,
    serving_energy,
    steps_work_log,
    trace_knots,
    with_card_state,
)

PARTS = {"prefill": PREFILL, "decode": DECODE}
POWER_CAP = 0x4  # NVML clocks event reason: SW power cap
RELATIVE = 1e-9  # --check: coefficients equal to this relative tolerance (the replay runs the same code and seed)


def rate_dirs(sweep: Path) -> list[Path]:
    return sorted(sweep.glob("rate_*"), key=lambda p: _order(p.name[5:]))


def load_rate(rate_dir: Path) -> tuple[RateWindow, dict[str, Any]]:
    """One rate's material as the driver had it after its load (the steps with their card state), and its
    record."""
    record = json.loads((rate_dir / RECORD_FILE).read_text())
    counter = _counter(rate_dir)
    log = with_card_state(steps_work_log(read_requests(rate_dir / FILE_NAME).steps), counter)
    knots = counter.knots
    covered = (float(min(k.tau_ns[0] for k in knots)), float(max(k.tau_ns[-1] for k in knots)))
    span = (max(float(log.t0_ns.min()), covered[0]), min(float(log.t1_ns.max()), covered[1]))
    steady = next(w for w in record["windows"] if w["name"] == "steady")
    window = (float(steady["t_start_ns"]), float(steady["t_end_ns"]))
    return RateWindow(str(record["config"]["rate"]), log, knots, record["meter"]["idle_baseline"]["power_w"], span,
                      window), record


def _counter(rate_dir: Path) -> Counter:
    counter = trace_knots(rate_dir / IN_PROCESS_TRACE)
    if counter.reason:
        raise SystemExit(f"{rate_dir}: {counter.reason}")
    return counter


@dataclasses.dataclass
class Replay:
    """The driver's blocks of every rate (its own and the joint one) and the sweep they were fitted in."""

    blocks: dict[str, RequestEnergyBlock]
    joint: dict[str, RequestEnergyBlock]
    sweep: Sweep


def replay(sweep_dir: Path, card_state: bool = True) -> Replay:
    """Every rate fitted as the driver fits it, in the sweep's order, then the joint blocks; `card_state` False:
    the trace's card state stripped (no clock term can be tried: the model before issue 60)."""
    sweep = Sweep()
    blocks: dict[str, RequestEnergyBlock] = {}
    for directory in rate_dirs(sweep_dir):
        rate, counter = recorded_rate(directory)
        blocks[rate.label] = serving_energy(rate, counter if card_state else counter._replace(state=None), sweep)
    return Replay(blocks, joint_blocks(sweep), sweep)


def recorded_rate(directory: Path) -> tuple[RecordedRate, Counter]:
    """One rate as the driver saved it (its record, its table, its in-process trace's counter and card state)."""
    table = read_requests(directory / FILE_NAME)
    for column in set(REQUEST_COLUMNS) - set(table.requests):  # a table older than its column (NaN: none)
        table.requests[column] = np.full(len(table), np.nan)
    return RecordedRate.of(read_run_record(directory / RECORD_FILE), table, directory), _counter(directory)


# ---- --check: the records reproduced ---------------------------------------------------------------------
def differences(sweep_dir: Path) -> list[str]:
    """What the records hold that the replay does not reproduce (empty: every record reproduced). A record
    without a `clock_term` predates issue 60: it is compared with the replay without the card state."""
    records = {d.name[5:]: json.loads((d / RECORD_FILE).read_text()) for d in rate_dirs(sweep_dir)}
    with_term = all("clock_term" in r["requests"]["energy"] for r in records.values())
    replayed = replay(sweep_dir, card_state=with_term)
    found = []
    for label, record in records.items():
        energy = record["requests"]["energy"]
        found += block_differences(f"rate {label}", energy, replayed.blocks[label])
        if "joint" in energy:
            found += block_differences(f"rate {label} joint", energy["joint"], replayed.joint.get(label, {}))
    return found


def block_differences(where: str, recorded: Mapping[str, Any], replayed: Mapping[str, Any]) -> list[str]:
    if recorded.get("unavailable_reason") or replayed.get("unavailable_reason"):
        same = recorded.get("unavailable_reason") == replayed.get("unavailable_reason")
        return [] if same else [f"{where}: n/a {recorded.get('unavailable_reason')!r}, replayed "
                                f"{replayed.get('unavailable_reason')!r}"]
    found = []
    for column, value in recorded["coefficients"].items():
        again = replayed["coefficients"].get(column)
        if again is None or not np.isclose(again, value, rtol=RELATIVE, atol=1e-12):
            found.append(f"{where}: coefficient {column} {value!r}, replayed {again!r}")
    outcomes = [("held-out halves", "held_out_halves", "closes"), ("cross-rate", "cross_rate", "passes")]
    if isinstance(replayed.get("controlled_split"), list):  # a sweep without its step log replays none
        outcomes.append(("controlled split", "controlled_split", "passes"))
    for name, key, verdict in outcomes:
        ours, theirs = [c[verdict] for c in recorded.get(key) or []], [c[verdict] for c in replayed.get(key) or []]
        if ours != theirs:
            found.append(f"{where}: {name} {ours}, replayed {theirs}")
    for term in ("clock_term", "cap_term"):
        if term in recorded and recorded[term]["adopted"] != replayed[term]["adopted"]:
            found.append(f"{where}: {term.replace('_', ' ')} adopted {recorded[term]['adopted']}, replayed "
                         f"{replayed[term]['adopted']}")
    return found


# ---- the controlled split of a sweep that did not save its step log -----------------------------------------
@dataclasses.dataclass(frozen=True)
class RecoveredPart:
    """One part of the controlled split: its amounts, measured energy less idle and bound, and its interval's
    median SM clock (Hz) and power-capped share."""

    amounts: np.ndarray
    measured_j: float
    bound_j: float
    interval: tuple[float, float]
    clock_hz: float
    capped: float | None


def controlled_parts(sweep_dir: Path, records: list[dict[str, Any]]) -> dict[str, RecoveredPart]:
    """Per part: the controlled window's amounts (recovered from the recorded predictions), the recorded measured
    energy (less idle) and bound, and the card state over its recovered interval."""
    first = rate_dirs(sweep_dir)[0]
    counter = _counter(first)
    segments = window_segments(counter.knots, -np.inf, np.inf)
    window = next(w for w in records[0]["windows"] if w["name"] == "controlled")
    idle_w = records[0]["meter"]["idle_baseline"]["power_w"]
    out = {}
    for part, columns in PARTS.items():
        rows, predicted, measured = [], [], set()
        for record in records:
            energy = record["requests"]["energy"]
            check = next(c for c in energy["controlled_split"] if c["part"] == part)
            rows.append([energy["coefficients"][c] for c in COLUMNS[columns]])
            predicted.append(check["predicted_j"])
            measured.add((check["measured_j"], check["measured_bound_j"]))
        amounts: np.ndarray = np.linalg.lstsq(np.array(rows), np.array(predicted), rcond=None)[0]
        misfit = np.abs(np.array(rows) @ amounts - np.array(predicted)).max()
        if misfit > 1e-6 * max(predicted) or len(measured) != 1:
            raise SystemExit(f"the {part} part's recorded checks do not determine its amounts (misfit {misfit:.3g} J)")
        (energy_j, bound_j), = measured
        decode_start = float(window["t_start_ns"])
        interval = (decode_start, float(window["t_end_ns"])) if part == "decode" else \
            (_prefill_start(segments, decode_start, idle_w, energy_j), decode_start)
        state = counter.state
        assert state is not None, "the trace recorded no SM clock"
        clock = state.clock_hz[(state.clock_t_ns >= interval[0]) & (state.clock_t_ns <= interval[1])]
        capped = None if state.capped is None or state.capped_t_ns is None else float(np.mean(
            state.capped[(state.capped_t_ns >= interval[0]) & (state.capped_t_ns <= interval[1])]))
        out[part] = RecoveredPart(np.round(amounts), energy_j, bound_j, interval, float(np.median(clock)), capped)
    return out


def _prefill_start(segments: Any, end_ns: float, idle_w: float, energy_j: float) -> float:
    """The start of the interval ending at `end_ns` whose counter energy less idle is `energy_j` (bisection)."""
    def excess(start: float) -> float:
        return measured_energy(segments, start, end_ns)[0] - idle_w * (end_ns - start) / 1e9 - energy_j
    low, high = end_ns - 10e9, end_ns - 1e6
    for _ in range(60):
        middle = (low + high) / 2
        low, high = (middle, high) if excess(middle) > 0 else (low, middle)
    return (low + high) / 2


def controlled_window(window: Mapping[str, Any]) -> list[str]:
    """The stored controlled split as measured (serving_energy.Controlled.describe): per part its length, steps, step
    size, counter energy with its own bound and the card state it ran at."""
    lines = []
    for name in ("prefill", "decode"):
        part = window.get(name)
        if not part:
            continue
        size = (f"{part['prefill_step_tokens']:.0f} tokens" if name == "prefill" else
                f"{part['decode_step_rows']:.0f} rows") + " per step (weighted)" + \
            ("" if part.get("decode_row_positions") is None else
             f", {part['decode_row_positions']:.0f} KV positions attended per row")
        energy = part.get("energy_unavailable_reason") or \
            f"measured {part['energy_j']:.1f} J ± {part['bound_j']:.1f} J ({part['bound_fraction']:.1%})"
        clock = "n/a" if part["sm_clock_mhz"] is None else f"{part['sm_clock_mhz']:.0f} MHz"
        capped = "n/a" if part["capped_share"] is None else f"{part['capped_share']:.0%}"
        lines.append(f"controlled split, {name}: {part['seconds']:.2f} s (planned >= "
                     f"{window.get('part_seconds_planned', float('nan')):.3g} s), {part['steps']} steps of {size}; "
                     f"{energy}; {clock} median, {capped} capped")
    return lines


def split_checks(fit: RequestEnergyFit, parts: dict[str, RecoveredPart]) -> list[PartCheck]:
    """Test (c) on the recovered amounts (counted at their interval's median clock where the fit has the clock
    term; where it has the power-cap term, their uncapped share at the costs and their capped share's device time
    by its law at the capped power, the share their interval's)."""
    out = []
    for name, part in parts.items():
        own = PARTS[name]
        if fit.cap is None:
            factor = 1.0 if fit.clock is None else float(fit.clock.multipliers(np.array([part.clock_hz]))[0])
            amounts, cost = part.amounts * factor, fit.coefficients[own]
        else:
            assert part.capped is not None, "a power-cap term is fitted only where the trace has the cap's share"
            amounts = np.append((1 - part.capped) * part.amounts,
                                part.capped * part.amounts @ fit.cap.seconds_per_unit[own])
            cost = fit.coefficients[fit.prefill if name == "prefill" else fit.decode]
        predicted = None if fit.reason else float(amounts @ cost)
        out.append(PartCheck(name, part.measured_j, part.bound_j, predicted, fit.reason))
    return out


# ---- the tables ------------------------------------------------------------------------------------------
def _verdict(passes: bool, error: float, bound: float | None = None) -> str:
    return f"{'pass' if passes else 'FAIL'} {error:+.1%}" + ("" if bound is None else f" (bound {bound:.1%})")


def _halves(block: Mapping[str, Any]) -> str:
    return ", ".join(_verdict(f["closes"], (f["predicted_j"] - f["measured_j"]) / f["measured_j"],
                              f["bound_j"] / f["measured_j"]) for f in block.get("held_out_halves", []))


def _cross(block: Mapping[str, Any]) -> str:
    rows = block.get("cross_rate") or []
    failed = [f"{c['fitted_at']}->{c['predicted']}" for c in rows if not c["passes"]]
    if len(rows) == 1 and "measured_j" in rows[0]:  # the joint fit's leave-one-rate-out
        c = rows[0]
        return _verdict(c["passes"], (c["predicted_j"] - c["measured_j"]) / c["measured_j"],
                        c["bound_j"] / c["measured_j"])
    return "—" if not rows else (f"FAIL {', '.join(failed)}" if failed else "pass")


def _split(fit: RequestEnergyFit, parts: dict[str, RecoveredPart] | None, block: Mapping[str, Any]) -> str:
    checks = split_checks(fit, parts) if parts else [
        PartCheck(c["part"], c["measured_j"], c["measured_bound_j"], c["predicted_j"], c["reason"])
        for c in block["controlled_split"]] if isinstance(block.get("controlled_split"), list) else []
    return " / ".join("n/a" if c.relative_error is None else _verdict(c.passes, c.relative_error) for c in checks)


def _term(trial: ClockTermTrial) -> str:
    if trial["alpha"] is None:
        return f"not fitted ({trial['unadopted_reason']})"
    held = ", ".join(f"{h['rate']} {h['error_without']:+.1%}->{h['error_with']:+.1%}" for h in trial["held_out_rates"])
    verdict = "ADOPTED" if trial["adopted"] else "not adopted"
    return (f"alpha {trial['alpha']:.1f} (likelihood ratio {trial['alpha_likelihood_ratio']:.1f}) {verdict}; held out "
            f"(without->with): {held or 'none'}")


def _cap(trial: CapTermTrial) -> str:
    """The power-cap term: its capped powers, adoption, held-out rates and the checks that fail without and with."""
    if trial["capped_power_w"] is None:
        return f"not fitted ({trial['unadopted_reason']})"
    powers = trial["capped_power_w"]
    held = ", ".join(f"{h['rate']} {h['error_without']:+.1%}->{h['error_with']:+.1%}" for h in trial["held_out_rates"])
    verdict = "ADOPTED" if trial["adopted"] else "not adopted"
    return (f"{powers['prefill']:.0f} / {powers['decode']:.0f} W {verdict}; held out: {held or 'none'}; failed "
            f"without: {trial['checks_without_term']['checks_failed']}, with: "
            f"{trial['checks_with_term']['checks_failed']}")


def _rms(trial: ClockTermTrial | CapTermTrial) -> str:
    without, with_term = trial.get("rms_error_without"), trial.get("rms_error_with")
    if without is None or with_term is None:
        return "no held-out rate"
    return f"root mean square of the held-out rates' errors {without:.2%} without, {with_term:.2%} with"


def _cap_fit(trial: CapTermTrial) -> list[str]:
    """The joint fit's power-cap term: its capped powers, law, likelihood ratio, held-out rates and decision (each
    rate's checks without and with it are in the table's rows)."""
    law, ratio, powers = trial.get("step_time_law_s"), trial.get("likelihood_ratio"), trial.get("capped_power_w")
    if law is None or ratio is None or powers is None:
        return [f"not fitted ({trial.get('unadopted_reason')})"]
    seconds = ", ".join(f"{c} {v:.3g}" for c, v in law.items())
    held = ", ".join(f"{h['rate']} {h['error_without']:+.1%}->{h['error_with']:+.1%}"
                     for h in trial.get("held_out_rates", []))
    return [f"{trial.get('unadopted_reason') or 'ADOPTED'}",
            f"capped power {powers['prefill']:.0f} W prefill, {powers['decode']:.0f} W decode; likelihood ratio "
            f"{ratio:.1f} (determined above {CLOSURE_Z ** 2:.1f})", f"step-time law (s per unit): {seconds}",
            f"held out (without->with): {held or 'none'}"]


def comparison(before: Replay, after: Replay, joints: tuple[JointFit, JointFit],
               parts: dict[str, RecoveredPart] | None) -> str:
    """Checks per rate, per-rate and joint, without and with the card state."""
    lines = ["| rate | fit | card state | b halves | c prefill / decode | a cross-rate | clock term (held-out "
             "rates' error) | power-cap term |", "|---|---|---|---|---|---|---|---|"]
    fits = [{m.label: m.fit for m in r.sweep.earlier} for r in (before, after)]
    for label in before.blocks:
        for name, replayed, own in (("per-rate", before, fits[0]), ("per-rate + term", after, fits[1])):
            block, fit = replayed.blocks[label], own[label]
            if fit is None:
                continue
            term = name.endswith("term")
            lines.append(f"| {label} | {name} | {_state(block)} | {_halves(block)} | {_split(fit, parts, block)} | "
                         f"{_cross(block)} | {_term(block['clock_term']) if term else '—'} | "
                         f"{_cap(block['cap_term']) if term else '—'} |")
        for name, replayed, joint in (("joint", before, joints[0]), ("joint + term", after, joints[1])):
            joint_block = replayed.joint.get(label)
            if joint_block is None or "coefficients" not in joint_block:
                continue
            term = name.endswith("term")
            lines.append(f"| {label} | {name} | {_state(joint_block)} | {_halves(joint_block)} | "
                         f"{_split(joint.per_rate[label], parts, joint_block)} | {_cross(joint_block)} | "
                         f"{_term(joint_block['clock_term']) if term else '—'} | "
                         f"{_cap(joint_block['cap_term']) if term else '—'} |")
    return "\n".join(lines)


def _state(block: Mapping[str, Any]) -> str:
    c = block.get("fitted_conditions") or {}
    if c.get("sm_clock_mhz") is None:
        return "n/a"
    return f"{c['sm_clock_mhz']:.0f} MHz, {c['capped_share']:.0%} capped"


def causes(replayed: Replay, joint: JointFit, parts: dict[str, RecoveredPart] | None) -> str:
    """Each failing check's measured cause as the records name it (the joint fit as adopted); for a sweep without
    the controlled split's step log, that of its recovered parts (step sizes from the recovered amounts: the
    decode part's rows per step a mean, not row-weighted)."""
    lines = []
    fit = next(iter(joint.per_rate.values()))
    for check, (name, part) in zip(split_checks(fit, parts or {}), (parts or {}).items(), strict=True):
        if not check.passes and fit.fitted is not None:
            steps = part.amounts[1] if name == "prefill" else part.amounts[0]
            size = part.amounts[0] / steps if name == "prefill" else part.amounts[1] / steps
            recovered = Conditions(part.clock_hz / 1e6, part.capped, size if name == "prefill" else None,
                                   size if name == "decode" else None,
                                   part.amounts[2] / part.amounts[1] if name == "decode" else None)
            lines.append(f"- every rate, c {name} (recovered): {Comparison(fit.fitted, recovered).cause()}")
    for label, block in replayed.joint.items():
        for key, name in (("held_out_halves", "b half"), ("cross_rate", "a"), ("controlled_split", "c")):
            rows = block.get(key)
            for k, row in enumerate(rows if isinstance(rows, list) else []):
                if "measured_cause" in row:
                    lines.append(f"- rate {label}, {name} {row.get('part', k + 1)}: {row['measured_cause']}")
    return "\n".join(lines) or "- none"


def coefficients(fit: RequestEnergyFit) -> str:
    """The fit's work columns' costs (with the power-cap term: the uncapped costs and the capped powers, in W)."""
    term = "" if fit.clock is None else f" at {fit.clock.reference_hz / 1e6:.0f} MHz, alpha {fit.clock.exponent:.1f}"
    return " ".join(f"{v:.3g}" for v in fit.coefficients[fit.work_columns]) + term


def work_mix(run: RateWindow, buckets: list[int]) -> str:
    """What the rate's steps were: prefill tokens per prefill step, rows per decode step, and the median decode step
    time by the engine's captured row bucket (a step runs padded to the smallest bucket that holds its rows)."""
    log = run.log
    prefill, decode = log.prefill_steps > 0, log.decode_steps > 0
    tokens, rows = log.prefill_tokens[prefill], log.row_steps[decode]
    bucket = np.asarray(buckets)[np.searchsorted(buckets, rows)]
    times = ", ".join(f"{b}: {np.median(log.seconds[decode][bucket == b]) * 1e3:.1f}" for b in buckets
                      if np.count_nonzero(bucket == b) >= 50)
    return (f"{int(prefill.sum())} prefill steps of {np.median(tokens):.0f} tokens (median; max {tokens.max():.0f}), "
            f"{int(decode.sum())} decode steps of {rows.mean():.1f} rows (mean; {rows.min():.0f}–{rows.max():.0f}); "
            f"decode step ms by row bucket {times}")


def device_state(rate_dir: Path, span: tuple[float, float]) -> str:
    """The card's own report over the rate's fitted span: SM clock, power-cap throttling (NVML reason bit 0x4,
    SW power cap), temperature."""
    with h5py.File(next((rate_dir / IN_PROCESS_TRACE).glob("*/trace.h5")), "r") as h5:
        names = np.array([n.decode() if isinstance(n, bytes) else str(n) for n in h5["metrics/name"][()]])
        values, t_ns = h5["metrics/value"][()], h5["metrics/t_ns"][()]
    inside = (t_ns >= span[0]) & (t_ns <= span[1])
    clock, reasons, temperature = (values[inside & (names == n)]
                                   for n in ("sm_clock_hz", "throttle_reasons", "temperature_c"))
    capped = np.mean((reasons.astype(np.int64) & POWER_CAP) > 0)
    return (f"SM clock {np.median(clock) / 1e6:.0f} MHz (median; p10 {np.percentile(clock, 10) / 1e6:.0f}), "
            f"power-capped in {capped:.0%} of samples, {temperature.min():.0f}–{temperature.max():.0f} °C")


def per_rate_power(runs: list[RateWindow], draws: int) -> str:
    """Diagnostic: the joint fit with each rate's idle power fitted (a per-second column of its own) instead of the
    cold baseline. Where the held-out halves close with it and the fitted "idle" powers climb with the rate, each
    rate's energy carries a power level of its own that the work columns do not."""
    free = [RateWindow(r.label, r.log, r.knots, None, r.span, r.window) for r in runs]
    joint = fit_joint(free, draws=draws, clock=False)
    lines = ["| rate | fitted power per second (W) | b halves |", "|---|---|---|"]
    for run in free:
        fit = joint.per_rate[run.label]
        low, high = np.percentile(fit.idle_draws_w, (2.5, 97.5))
        halves = ", ".join(_verdict(f.closes, -f.residual_j / f.measured_j, f.bound_j / f.measured_j)
                           for f in fit.folds)
        lines.append(f"| {run.label} | {fit.idle_w:.0f} [{low:.0f}, {high:.0f}] | {halves} |")
    shared = coefficients(joint.per_rate[runs[0].label])
    return "\n".join(lines) + f"\n\nshared coefficients ({', '.join(COLUMNS)}): {shared}"


def report(sweep_dir: Path, draws: int) -> str:
    loaded = [load_rate(d) for d in rate_dirs(sweep_dir)]
    runs, records = [r for r, _ in loaded], [rec for _, rec in loaded]
    stored = any(read_requests(d / FILE_NAME).controlled_steps for d in rate_dirs(sweep_dir)[:1])
    parts = None if stored else controlled_parts(sweep_dir, records)
    out = []
    for name, part in (parts or {}).items():
        capped = "n/a" if part.capped is None else f"{part.capped:.0%}"
        out.append(f"controlled split, {name} (recovered): amounts {part.amounts.tolist()} of {COLUMNS[PARTS[name]]}, "
                   f"measured {part.measured_j:.1f} J ± {part.bound_j:.1f} J ({part.bound_j / part.measured_j:.1%}); "
                   f"{(part.interval[1] - part.interval[0]) / 1e9:.2f} s at {part.clock_hz / 1e6:.0f} MHz median, "
                   f"{capped} capped")
    for run, record, directory in zip(runs, records, rate_dirs(sweep_dir), strict=True):
        buckets = record["config"]["engine_detail"]["row_buckets"]
        out.append(f"rate {run.label}: {work_mix(run, buckets)}; {device_state(directory, run.span)}")
    before, after = replay(sweep_dir, card_state=False), replay(sweep_dir)
    if stored:
        out += controlled_window(next(iter(after.blocks.values())).get("controlled_window") or {})
    joints = (fit_joint(runs, clock=False), fit_joint(runs))
    out += ["", "### Checks per rate, without and with the card state (the driver's code: per rate in order, then "
                "joint)", "", comparison(before, after, joints, parts), ""]
    for name, joint in (("joint", joints[0]), ("joint + term", joints[1])):
        fit = joint.per_rate[runs[0].label]
        out.append(f"{name} coefficients ({', '.join(fit.columns[fit.work_columns])}): {coefficients(fit)}")
    trial, cap = joints[1].clock.to_dict(), joints[1].cap.to_dict(COLUMNS)
    out += [f"joint clock term: {_term(trial)}; {_rms(trial)}",
            "joint power-cap term:", *(f"- {part}" for part in _cap_fit(cap)), f"- {_rms(cap)}",
            "", "### Failing checks' measured causes (joint fit as adopted)", "", causes(after, joints[1], parts), "",
            "### Diagnostic: joint fit, each rate's idle power fitted (no term)", "", per_rate_power(runs, draws)]
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sweep", type=Path, help="a load sweep's directory (rate_<r>/ each with its record)")
    parser.add_argument("--draws", type=int, default=200, help="bootstrap draws of the diagnostic (the driver's: 200)")
    parser.add_argument("--check", action="store_true", help="compare every record with the replay; exit 1 on a "
                                                             "difference")
    args = parser.parse_args()
    if not args.check:
        print(report(args.sweep, args.draws))
        return
    found = differences(args.sweep)
    print("\n".join(found) or f"every record under {args.sweep} reproduced (coefficients and checks)")
    sys.exit(1 if found else 0)


def _order(label: str) -> float:
    return float("inf") if label == "max" else float(label)


if __name__ == "__main__":
    main()
