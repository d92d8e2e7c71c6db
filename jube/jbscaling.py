"""The scaling table's efficiency: each point's throughput per device against the one-device point of its group.

Why in the compare step: a JUBE table cannot read another row, and the efficiency of a point on d devices is only
defined against the one-device point of the same run (the same system, model and every other coordinate as asked;
jbprofile.py writes that group as JB_SCALING_GROUP). The same formula holds for both rules: weak scaling keeps the
per-device batch, so ideal per-device throughput is the one-device point's; strong scaling keeps the batch, so ideal
throughput is d times the one-device point's. Efficiency = (throughput / d) / one-device throughput. A group without
a measured one-device point reads n/a, never 100 %. Runs with the profile's Python (joulebench installed).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from jbsettings import read_settings
from jbworkloads import WORKLOADS

from joulebench.figures import is_number, rejection
from joulebench.record import RECORD_FILE, read_run_record
from jpwr import JpwrError


@dataclass(frozen=True)
class ScalingPoint:
    """One sweep point as the scaling table needs it: its group, rule, devices and measured throughput."""

    run_id: str
    group: str
    rule: str  # weak | strong | n/a (refused before it was known); empty: a workflow without one (inference)
    devices: int  # nodes x devices per node: the world size
    throughput: float | None  # work units per second, only of a run measured OK with figures that can be true


def read_point(env_path: Path) -> ScalingPoint:
    """The point of one submit work directory (its job.env, and the run record where the job wrote one)."""
    settings = read_settings(env_path)
    scaled = bool(WORKLOADS[settings["JB_BENCHMARK"]].batch_key)  # a point refused before its rule was known: n/a
    return ScalingPoint(run_id=settings["JB_RUN_ID"], group=settings.get("JB_SCALING_GROUP", ""),
                        rule=settings.get("JB_SCALING") or ("n/a" if scaled else ""),
                        devices=int(settings.get("JB_WORLD_SIZE") or 1), throughput=measured_throughput(settings))


def measured_throughput(settings: dict[str, str]) -> float | None:
    """Work units per second of a run measured OK whose figures can be true; None for any other (no record, a
    damaged one, INVALID, FAILED, PARTIAL, rejected figures)."""
    if settings.get("JB_STATUS") != "OK" or not settings.get("JB_OUT_DIR"):
        return None
    try:
        record = read_run_record(Path(settings["JB_OUT_DIR"]) / RECORD_FILE)
    except (OSError, JpwrError, ValueError):
        return None
    unit = record.metrics.get("work_unit") or WORKLOADS[settings["JB_BENCHMARK"]].work_unit
    value = record.metrics.get(f"{unit}_per_s")
    if record.status != "OK" or rejection(record) is not None or not is_number(value) or value <= 0:
        return None
    return float(value)


def efficiencies(points: list[ScalingPoint]) -> dict[str, dict[str, str]]:
    """Per run id: the rule (`-` where the workflow has none) and the efficiency against its group's one-device
    point, as `93.1%` (n/a without either throughput)."""
    baseline = {p.group: p.throughput for p in points if p.devices == 1 and p.throughput is not None}
    rows: dict[str, dict[str, str]] = {}
    for p in points:
        base = baseline.get(p.group)
        efficiency = "n/a" if base is None or p.throughput is None else f"{100 * p.throughput / p.devices / base:.1f}%"
        rows[p.run_id] = {"scaling": p.rule or "-", "scaling_efficiency": efficiency if p.rule else "-"}
    return rows


def scaling_rows(rundir: Path) -> dict[str, dict[str, str]]:
    """The scaling columns of every point of a JUBE run directory."""
    return efficiencies([read_point(path) for path in sorted(rundir.glob("*_submit/work/job.env"))])
