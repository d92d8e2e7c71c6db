#!/usr/bin/env python3
"""Is a run's steady window steady? Mean power, SM clock and temperature per slice of the window, from its trace.

    python benchmarks/window_drift.py RUN_DIR [--window steady] [--slices 8]

Why: the attribution's held-out closure compares the two halves of a window; when both misfit in opposite
directions the device's power moved between them. This prints what moved (power, clock, temperature) so the cause
is measured, not guessed. Reads the traces the run's analysis finds (joulebench.analysis.plot.find_trace_sources).
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from joulebench.analysis.plot import find_trace_sources  # noqa: E402 (after sys.path)
from jpwr.output import fmt  # noqa: E402
from jpwr.trace import Signal, accelerator_domains, load_trace, spans_from_marks  # noqa: E402

METRICS = (("sm_clock_hz", "SM MHz", 1e-6), ("temperature_c", "°C", 1.0))


def slice_means(run_dir: Path, window: str, slices: int) -> list[str]:
    lines = []
    for source in find_trace_sources(run_dir):
        trace = load_trace(source)
        span = spans_from_marks(trace.marks).get(window)
        if span is None:
            lines.append(f"{source}: no {window} window in the trace")
            continue
        edges = np.linspace(span.t0_ns, span.t1_ns, slices + 1)
        for domain in accelerator_domains(trace.domains):
            counter = [s for s in trace.sensors if s.domain_id == domain.id and s.signal is Signal.ENERGY_COUNTER]
            columns: dict[str, tuple[np.ndarray, np.ndarray]] = {}
            energy_at = None
            if counter:
                series = trace.series(counter[0].id)
                ok = np.isfinite(series.value)
                t = (series.t_before_ns[ok] + series.t_after_ns[ok]) / 2
                energy_at = np.interp(edges, t, series.value[ok])  # the counter interpolated at the slice edges
            for name in ("sm_clock_hz", "temperature_c"):
                rows = [(m.t_ns, m.value) for m in trace.metrics if m.domain_id == domain.id and m.name == name]
                if rows:
                    times, values = zip(*rows, strict=True)
                    columns[name] = (np.array(times, dtype=float), np.array(values, dtype=float))
            header = ["slice s", "W (counter)"] + [unit for name, unit, _ in METRICS if name in columns]
            lines.append(f"{source.relative_to(run_dir)} {domain.id}: {window} window in {slices} slices")
            lines.append("  " + " | ".join(header))
            for i, (a, b) in enumerate(itertools.pairwise(edges)):
                cells = [f"{(a - span.t0_ns) / 1e9:.1f}-{(b - span.t0_ns) / 1e9:.1f}",
                         fmt(None if energy_at is None else (energy_at[i + 1] - energy_at[i]) / ((b - a) / 1e9), 5)]
                for name, _unit, scale in METRICS:
                    if name in columns:
                        t, v = columns[name]
                        inside = (t >= a) & (t < b) & np.isfinite(v)
                        cells.append(fmt(float(v[inside].mean()) * scale if inside.any() else None, 4))
                lines.append("  " + " | ".join(cells))
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--window", default="steady")
    parser.add_argument("--slices", type=int, default=8)
    args = parser.parse_args()
    print("\n".join(slice_means(args.run_dir, args.window, args.slices)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
