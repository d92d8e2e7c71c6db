#!/usr/bin/env python3
"""Issue 45 item 3: the per-request energy fit of a recorded load sweep rebuilt, per rate and jointly over its rates.

    python benchmarks/joint_fit_replay.py benchmarks/results/2026-11-25-session10/serving-final/sweep

Reads each rate_<r>/ of the sweep (run_record.json, requests.h5 with the engine's step log, jpwr/<node>/trace.h5
with the energy counter) and fits with the library's code (joulebench.request_energy per rate, as the driver did;
joulebench.joint_energy over all rates). Every check runs on both; the thresholds are the library's.

The controlled-split window's step log is not stored in the sweep's files (only its check's figures are), so its
work is recovered from the records: each rate's recorded prediction is its coefficients times the window's amounts,
a linear system over the rates (exact up to rounding, the script checks it); the measured side (counter energy
less idle, and its bound) is the record's, the same for every fit.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from joulebench.joint_energy import JointFit, RateWindow, fit_joint
from joulebench.request_energy import (
    COLUMNS,
    DECODE,
    PREFILL,
    PartCheck,
    RequestEnergyFit,
    cross_check,
    fit_request_energy,
)
from joulebench.requests_table import FILE_NAME, read_requests
from llm_inference.serving_energy import steps_work_log, trace_knots

PARTS = {"prefill": PREFILL, "decode": DECODE}
POWER_CAP = 0x4  # NVML clocks event reason: SW power cap


def load_rate(rate_dir: Path) -> tuple[RateWindow, dict[str, Any]]:
    """One rate's material as the driver had it after its load, and its record."""
    record = json.loads((rate_dir / "run_record.json").read_text())
    table = read_requests(rate_dir / FILE_NAME)
    log = steps_work_log(table.steps)
    knots, reason = trace_knots(rate_dir / "jpwr")
    if reason:
        raise SystemExit(f"{rate_dir}: {reason}")
    covered = (float(min(k.tau_ns[0] for k in knots)), float(max(k.tau_ns[-1] for k in knots)))
    span = (max(float(log.t0_ns.min()), covered[0]), min(float(log.t1_ns.max()), covered[1]))
    steady = next(w for w in record["windows"] if w["name"] == "steady")
    window = (float(steady["t_start_ns"]), float(steady["t_end_ns"]))
    return RateWindow(str(record["config"]["rate"]), log, knots, record["meter"]["idle_baseline"]["power_w"], span,
                      window), record


def controlled_amounts(records: list[dict[str, Any]]) -> dict[str, tuple[np.ndarray, float, float]]:
    """Per part: the controlled window's amounts of its columns (recovered from the recorded predictions), and the
    recorded measured energy (less idle) and its bound."""
    out = {}
    for part, columns in PARTS.items():
        rows, predicted, measured = [], [], set()
        for record in records:
            energy = record["requests"]["energy"]
            check = next(c for c in energy["controlled_split"] if c["part"] == part)
            rows.append([energy["coefficients"][c] for c in COLUMNS[columns]])
            predicted.append(check["predicted_j"])
            measured.add((check["measured_j"], check["measured_bound_j"]))
        amounts = np.linalg.lstsq(np.array(rows), np.array(predicted), rcond=None)[0]
        misfit = np.abs(np.array(rows) @ amounts - np.array(predicted)).max()
        if misfit > 1e-6 * max(predicted) or len(measured) != 1:
            raise SystemExit(f"the {part} part's recorded checks do not determine its amounts (misfit {misfit:.3g} J)")
        (energy_j, bound_j), = measured
        out[part] = (np.round(amounts), energy_j, bound_j)
    return out


def split_checks(fit: RequestEnergyFit, controlled: dict[str, tuple[np.ndarray, float, float]]) -> list[PartCheck]:
    return [PartCheck(part, energy_j, bound_j,
                      None if fit.reason else float(amounts @ fit.coefficients[PARTS[part]]), fit.reason)
            for part, (amounts, energy_j, bound_j) in controlled.items()]


def per_rate_rows(runs: list[RateWindow], controlled: dict[str, Any]) -> dict[str, dict[str, str]]:
    """Today's checks: each rate's own fit, cross-rate both ways with every earlier rate (as the driver runs them)."""
    fits = {r.label: fit_request_energy(r.log, r.knots, r.idle_w, *r.span) for r in runs}
    rows = {}
    for k, run in enumerate(runs):
        fit = fits[run.label]
        failed = []
        for other in runs[:k]:
            for fitted, predicted in ((run, other), (other, run)):
                if not cross_check(fits[fitted.label], predicted.log, predicted.knots, *predicted.window).passes:
                    failed.append(f"{fitted.label}->{predicted.label}")
        rows[run.label] = {"coefficients": _coefficients(fit.coefficients), "prefill VIF": f"{fit.prefill_vif:.3g}",
                           **_halves_and_split(fit, controlled),
                           "a cross-rate": f"fail {', '.join(failed)}" if failed else ("pass" if k else "—")}
    return rows


def joint_rows(joint: JointFit, runs: list[RateWindow], controlled: dict[str, Any]) -> dict[str, dict[str, str]]:
    rows = {}
    for run in runs:
        fit, left_out = joint.per_rate[run.label], joint.left_out[run.label]
        if isinstance(left_out, str):
            cross = f"n/a ({left_out})"
        else:
            check = cross_check(left_out, run.log, run.knots, *run.window)
            error = (check.predicted_j - check.measured_j) / check.measured_j
            cross = f"{'pass' if check.passes else 'FAIL'} ({error:+.1%}, bound {check.bound_j / check.measured_j:.1%})"
        rows[run.label] = {"coefficients": _coefficients(fit.coefficients), "prefill VIF": f"{fit.prefill_vif:.3g}",
                           **_halves_and_split(fit, controlled), "a cross-rate": cross}
    return rows


def _halves_and_split(fit: RequestEnergyFit, controlled: dict[str, Any]) -> dict[str, str]:
    out = {}
    for n, fold in enumerate(fit.folds, start=1):
        out[f"b half {n}"] = (f"{'pass' if fold.closes else 'FAIL'} ({-fold.residual_j / fold.measured_j:+.1%}, "
                              f"bound {fold.bound_j / fold.measured_j:.1%})")
    for check in split_checks(fit, controlled):
        error = check.relative_error
        out[f"c {check.part}"] = "n/a" if error is None else f"{'pass' if check.passes else 'FAIL'} ({error:+.1%})"
    return out


def _coefficients(values: np.ndarray) -> str:
    return " ".join(f"{v:.3g}" for v in values[:len(COLUMNS)])


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
    with h5py.File(next((rate_dir / "jpwr").glob("*/trace.h5")), "r") as h5:
        names = np.array([n.decode() if isinstance(n, bytes) else str(n) for n in h5["metrics/name"][()]])
        values, t_ns = h5["metrics/value"][()], h5["metrics/t_ns"][()]
    inside = (t_ns >= span[0]) & (t_ns <= span[1])
    clock, reasons, temperature = (values[inside & (names == n)]
                                   for n in ("sm_clock_hz", "throttle_reasons", "temperature_c"))
    capped = np.mean((reasons.astype(np.int64) & POWER_CAP) > 0)
    return (f"SM clock {np.median(clock) / 1e6:.0f} MHz (median; p10 {np.percentile(clock, 10) / 1e6:.0f}), "
            f"power-capped in {capped:.0%} of samples, {temperature.min():.0f}–{temperature.max():.0f} °C")


def table(title: str, rows: dict[str, dict[str, str]]) -> str:
    keys = [k for k in next(iter(rows.values())) if k != "coefficients"]
    lines = [f"### {title}", "", "| rate | " + " | ".join(keys) + " |", "|---" * (len(keys) + 1) + "|"]
    lines += [f"| {label} | " + " | ".join(row.get(k, "—") for k in keys) + " |" for label, row in rows.items()]
    lines += ["", f"coefficients ({', '.join(COLUMNS)}):"]
    shared = {row["coefficients"] for row in rows.values()}
    lines += [f"- every rate: {shared.pop()}"] if len(shared) == 1 else \
        [f"- {label}: {row['coefficients']}" for label, row in rows.items()]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sweep", type=Path, help="a load sweep's directory (rate_<r>/ each with its record)")
    parser.add_argument("--draws", type=int, default=200, help="bootstrap draws (the driver's: 200)")
    args = parser.parse_args()
    loaded = [load_rate(d) for d in sorted(args.sweep.glob("rate_*"), key=lambda p: _order(p.name[5:]))]
    runs, records = [r for r, _ in loaded], [rec for _, rec in loaded]
    controlled = controlled_amounts(records)
    for part, (amounts, energy_j, bound_j) in controlled.items():
        print(f"controlled split, {part}: amounts {amounts.tolist()} of {COLUMNS[PARTS[part]]}, measured "
              f"{energy_j:.1f} J ± {bound_j:.1f} J ({bound_j / energy_j:.1%})")
    directories = sorted(args.sweep.glob("rate_*"), key=lambda p: _order(p.name[5:]))
    for run, record, directory in zip(runs, records, directories, strict=True):
        buckets = record["config"]["engine_detail"]["row_buckets"]
        print(f"rate {run.label}: {work_mix(run, buckets)}; {device_state(directory, run.span)}")
    print()
    print(table("Per-rate fit (the driver's today)", per_rate_rows(runs, controlled)))
    print()
    joint = fit_joint(runs, draws=args.draws)
    print(table(f"Joint fit over rates {', '.join(joint.labels)} ({joint.segment_count} segments)",
                joint_rows(joint, runs, controlled)))
    print(f"\njoint split: {joint.reason or 'separable'}; VIF " +
          ", ".join(f"{c} {v:.3g}" for c, v in zip(joint.columns, joint.vif, strict=True)))
    print()
    print(per_rate_power(runs, args.draws))


def per_rate_power(runs: list[RateWindow], draws: int) -> str:
    """Diagnostic: the joint fit with each rate's idle power fitted (a per-second column of its own) instead of the
    cold baseline. Where the held-out halves close with it and the fitted "idle" powers climb with the rate, each
    rate's energy carries a power level of its own that the work columns do not."""
    free = [RateWindow(r.label, r.log, r.knots, None, r.span, r.window) for r in runs]
    joint = fit_joint(free, draws=draws)
    lines = ["### Diagnostic: joint fit, each rate's idle power fitted", "",
             "| rate | fitted power per second (W) | b half 1 | b half 2 |", "|---|---|---|---|"]
    for run in free:
        fit = joint.per_rate[run.label]
        low, high = np.percentile(fit.idle_draws_w, (2.5, 97.5))
        halves = _halves_and_split(fit, {})
        lines.append(f"| {run.label} | {fit.idle_w:.0f} [{low:.0f}, {high:.0f}] | {halves.get('b half 1', '—')} | "
                     f"{halves.get('b half 2', '—')} |")
    lines += ["", f"shared coefficients ({', '.join(COLUMNS)}): {_coefficients(joint.coefficients)}"]
    return "\n".join(lines)


def _order(label: str) -> float:
    return float("inf") if label == "max" else float(label)


if __name__ == "__main__":
    main()
