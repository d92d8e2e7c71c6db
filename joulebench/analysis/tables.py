"""What workflow tables read from analysis: a setting sweep's slowdown and energy saving per run, as `joulebench
report --pareto` computes them.

Why a module of its own: the JUBE compare step (jube/jbrecord.py) puts these figures into each row, and reads them
here through one public function instead of the Pareto report's parts, so the report can change inside.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

from joulebench.analysis.pareto import baseline, saving, slowdown, sweep_points
from joulebench.analysis.runs import load_runs


@dataclasses.dataclass(frozen=True)
class SettingComparison:
    """One run against its sweep's default-setting rows; None where the run's energy cannot be trusted or a figure
    is missing."""

    slowdown: float | None
    energy_saving: float | None


def compare_settings(record_paths: Sequence[Path]) -> dict[str, SettingComparison]:
    """Per run id of the records: slowdown and energy saving against the default-setting runs among them (power limit
    and clock untouched, energy trusted). Runs without a steady window (never measured) are left out; a run left out
    of the sweep (its energy not trusted) gets None for both. Raises jpwr's errors where the records cannot be
    compared (no default-setting run, unreadable records)."""
    runs = load_runs(list(record_paths))
    measured = [run for run in runs if run.record.window("steady") is not None]
    points = {point.name: point for point in sweep_points(measured)}
    base = baseline(list(points.values()))
    return {name: (SettingComparison(slowdown(point, base), saving(point, base)) if point.excluded is None
                   else SettingComparison(None, None)) for name, point in points.items()}
