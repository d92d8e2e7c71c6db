"""Synthetic sensor series with a known true energy, for estimator tests.

A load's true power is a function of time; the counter behaves like NVML's (updated every
`update_s` with the exact integral up to the update time, read at chosen times) and the
instantaneous-power sensor returns the true power at its own refresh instants.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from jpwr.domains import Sensor, Signal
from jpwr.trace_io import SensorSeries

NS = 1_000_000_000


def integral(power: Callable[[float], float], a: float, b: float, step: float = 1e-4) -> float:
    if b <= a:
        return 0.0
    t = np.arange(a, b, step)
    return float(sum(power(x) for x in t) * step)


def square_wave(low: float, high: float, period: float, on: float, phase: float = 0.0) -> Callable[[float], float]:
    return lambda t: high if ((t - phase) % period) < on else low


def steps(levels: Sequence[tuple[float, float]]) -> Callable[[float], float]:
    """levels: (start time, watts) pairs, ascending."""
    def power(t: float) -> float:
        watts = levels[0][1]
        for start, w in levels:
            if t >= start:
                watts = w
        return watts
    return power


def counter_series(power: Callable[[float], float], read_times: Sequence[float], update_s: float = 0.1,
                   phase: float = 0.0, offset_j: float = 5_000.0, wrap_at: float | None = None,
                   read_cost_s: float = 0.004) -> SensorSeries:
    sensor = Sensor("d/energy_counter", "d", Signal.ENERGY_COUNTER, est_update_s=update_s, wrap_at=wrap_at)
    cache: dict[float, float] = {}
    values, tb, ta = [], [], []
    for t in read_times:
        last_update = phase + np.floor((t - phase) / update_s) * update_s
        if last_update not in cache:
            cache[last_update] = offset_j + integral(power, 0.0, last_update, step=1e-3)
        value = cache[last_update]
        if wrap_at is not None:
            value %= wrap_at
        values.append(value)
        tb.append(int((t - read_cost_s) * NS))
        ta.append(int(t * NS))
    return SensorSeries(sensor, np.array(tb), np.array(ta), np.array(values, dtype=float))


def power_series(power: Callable[[float], float], t_start: float, t_end: float, poll_s: float = 0.1,
                 update_s: float = 0.1) -> SensorSeries:
    sensor = Sensor("d/power_instant", "d", Signal.POWER_INSTANT, est_update_s=update_s)
    times = np.arange(t_start, t_end, poll_s)
    values = [power(np.floor(t / update_s) * update_s) for t in times]
    stamps = (times * NS).astype(np.int64)
    return SensorSeries(sensor, stamps, stamps + 20_000, np.array(values, dtype=float))


def part_time_counter_series(power: Callable[[float], float], read_times: Sequence[float], update_s: float = 0.1,
                             sampled_s: float = 0.025, offset_j: float = 5_000.0,
                             read_cost_s: float = 0.004) -> SensorSeries:
    """A counter like the H100's part-time sensor: at each update (every `update_s` from 0) it adds the power
    averaged over only the last `sampled_s` before the update, times the whole period."""
    sensor = Sensor("d/energy_counter", "d", Signal.ENERGY_COUNTER, est_update_s=update_s)
    last = int(np.floor(max(read_times) / update_s))
    increments = [integral(power, k * update_s - sampled_s, k * update_s, step=2e-4) / sampled_s * update_s
                  for k in range(1, last + 1)]
    cumulative = offset_j + np.concatenate([[0.0], np.cumsum(increments)])
    values = [cumulative[int(np.floor(t / update_s))] for t in read_times]
    tb = [int((t - read_cost_s) * NS) for t in read_times]
    ta = [int(t * NS) for t in read_times]
    return SensorSeries(sensor, np.array(tb), np.array(ta), np.array(values, dtype=float))
