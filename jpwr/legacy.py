"""jpwr 0.0.10 compatibility: `--df-out DIR --df-filetype csv|h5` power and energy tables.

Same shape as the old tool's output, so existing CARAML scripts keep working: a power table
(time and one column per device, W) and an energy table (one row per device, Wh). The energy
here is this jpwr's counter-anchored estimate, not the old rectangle sum.
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from jpwr.domains import Signal
from jpwr.output import atomic_path
from jpwr.trace_io import SensorSeries, TraceData
from jpwr.windows import WindowSpan, window_energy


def _device_label(trace: TraceData, domain_id: str) -> str:
    domain = next(d for d in trace.domains if d.id == domain_id)
    return f"{domain.backend}:{domain.index if domain.index is not None else domain.id}"


def _power_column(series: SensorSeries, times: list[int]) -> np.ndarray:
    """One device's power at the table's times: interpolated only between neighbouring good reads. Where a
    read failed in between (a gap), the cell stays empty (NaN) instead of drawing a line across the gap."""
    t = np.asarray(times, dtype=float)
    if not series.valid.any():
        return np.full(len(t), np.nan)
    good_t, good_v = series.t_ns[series.valid], series.value[series.valid]
    values = np.interp(t, good_t, good_v, left=np.nan, right=np.nan)
    failed_before = np.cumsum(~series.valid)[series.valid]  # failed reads before each good one
    after = np.searchsorted(good_t, t, side="right")  # the first good read after each time
    between = (after > 0) & (after < len(good_t)) & ~np.isin(t, good_t)
    gap = np.zeros(len(t), dtype=bool)
    gap[between] = failed_before[after[between]] != failed_before[after[between] - 1]
    values[gap] = np.nan
    return values


def write_dataframes(trace: TraceData, out_dir: Path, filetype: str) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    power_sensors = [s for s in trace.sensors if s.signal in (Signal.POWER_INSTANT, Signal.POWER_AVERAGE)]
    per_domain = {}
    for s in power_sensors:  # one power column per domain, instant preferred
        if s.domain_id not in per_domain or s.signal is Signal.POWER_INSTANT:
            per_domain[s.domain_id] = s
    series = {d: trace.series(s.id) for d, s in per_domain.items()}
    times = sorted({int(t) for ser in series.values() for t in ser.t_ns})
    t_first = times[0] if times else 0
    columns = {_device_label(trace, d): _power_column(ser, times) for d, ser in series.items()}
    t_last = max(times) if times else 0
    energy = window_energy(trace, WindowSpan("run", t_first, t_last, 0, {}), 0.1, trace.info.get("node", "node"))
    energy_rows = [(_device_label(trace, d.domain), None if d.energy_j is None else d.energy_j / 3600.0)
                   for d in energy.per_device + energy.other_domains]
    if filetype == "h5":
        import h5py

        path = out_dir / "energy_meas.h5"
        with atomic_path(path) as tmp, h5py.File(tmp, "w") as h5:
            h5["power/timestamp_s"] = (np.array(times, dtype=np.float64) - t_first) / 1e9
            for label, values in columns.items():
                h5[f"power/{label}"] = values
            for label, wh in energy_rows:
                h5[f"energy_wh/{label}"] = np.nan if wh is None else wh
        return [path]
    power_path, energy_path = out_dir / "power.csv", out_dir / "energy.csv"
    with atomic_path(power_path) as tmp, open(tmp, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["timestamp_s", *columns])
        for i, t in enumerate(times):
            cells = ("" if np.isnan(v[i]) else f"{v[i]:.3f}" for v in columns.values())
            w.writerow([f"{(t - t_first) / 1e9:.6f}", *cells])
    with atomic_path(energy_path) as tmp, open(tmp, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["device", "energy_wh"])
        for label, wh in energy_rows:
            w.writerow([label, "n/a" if wh is None else f"{wh:.6f}"])
    return [power_path, energy_path]
