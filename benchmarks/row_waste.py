#!/usr/bin/env python3
"""The row buckets' waste of load runs, from their files (issue 59's second lever): per measured window, the rows a
decode step occupied and the rows it computed (its row bucket), and what this tree's buckets would compute for the
same occupancy; then the decode step's time against its computed rows, fitted over every run given.

    python3 benchmarks/row_waste.py benchmarks/results/2026-11-25-session10/serving-final/sweep/rate_*
    python3 benchmarks/row_waste.py $OUT/p59r/base/continuous-256/run $OUT/p59r/branch/continuous-256/run

Each argument is a directory with a load's run_record.json and requests.h5. A step log with a `computed_rows` column
(issue 59 on) says what each step computed; an older one is read with its record's `row_buckets`: the smallest bucket
over the occupied rows, which the compaction of then kept packed at the bottom (from 2026-11-25 on). CPU only.
"""

from __future__ import annotations

import argparse
import bisect
import json
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from joulebench.requests_table import FILE_NAME, StepKind, read_requests  # noqa: E402
from llm_inference.continuous_engine import rows_for  # noqa: E402


def window_steps(run: Path) -> dict[str, np.ndarray] | None:
    """The decode steps inside the run's measured window: occupied rows, computed rows, this tree's rows, ms; None
    where the window never opened."""
    record = json.loads((run / "run_record.json").read_text())
    table = read_requests(run / FILE_NAME)
    if table.attrs.get("window_ns") is None:
        return None
    steps, (begin, end) = table.steps, table.attrs["window_ns"]
    decode = (steps["kind"] == StepKind.DECODE) & (steps["t0_ns"] >= begin) & (steps["t1_ns"] <= end)
    occupied = np.diff(steps["member_offsets"])[decode]
    rows = record["config"]["max_concurrency"]
    if "computed_rows" in steps:
        computed = steps["computed_rows"][decode]
    else:
        buckets = record["config"]["engine_detail"]["row_buckets"]
        computed = np.array([buckets[bisect.bisect_left(buckets, n)] for n in occupied])
    return {"occupied": occupied, "computed": computed, "here": np.array([rows_for(n - 1, rows) for n in occupied]),
            "ms": (steps["t1_ns"] - steps["t0_ns"])[decode] / 1e6,
            "moved": steps["moved_requests"][decode] if "moved_requests" in steps else np.full(len(occupied), np.nan)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="directories of run_record.json and requests.h5")
    args = parser.parse_args(argv)
    print("| run | decode steps | occupied rows | computed / occupied | with this tree's buckets | moves per step "
          "| step ms |")
    print("|---|---|---|---|---|---|---|")
    fitted = []
    for run in args.runs:
        s = window_steps(run)
        if s is None:
            print(f"| {run} | n/a: its measured window never opened | | | | | |")
            continue
        occupied = s["occupied"].sum()
        moves = "n/a" if np.isnan(s["moved"]).all() else f"{np.mean(s['moved']):.2f}"  # a log from before issue 59
        print(f"| {run} | {len(s['occupied'])} | {s['occupied'].mean():.1f} | {s['computed'].sum() / occupied:.3f} | "
              f"{s['here'].sum() / occupied:.3f} | {moves} | {s['ms'].mean():.2f} |")
        fitted.append(s)
    if not fitted:
        return 1
    computed = np.concatenate([s["computed"] for s in fitted]).astype(float)
    ms = np.concatenate([s["ms"] for s in fitted])
    if len(set(computed)) > 1:
        (base, per_row), *_ = np.linalg.lstsq(np.c_[np.ones_like(computed), computed], ms, rcond=None)
        rms = np.sqrt(np.mean((ms - base - per_row * computed) ** 2))
        print(f"decode step ms = {base:.3f} + {per_row:.4f} x computed rows over {len(ms)} steps "
              f"(rms residual {rms:.2f} ms; one engine per fit)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
