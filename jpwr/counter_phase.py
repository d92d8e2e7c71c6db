"""When the energy counter updates: a regular grid fitted to observed updates, so that `jpwr selftest` can start
bursts at a chosen phase of the counter's period (its locked mode) and say which phase a window ran at.

An update is seen as a change between two reads: it happened after the earlier read began and before the later
one ended, and the fit takes the middle of that interval. On an H100 the counter updates every 99.99 ms with
about 4.6 ms of scatter around a regular grid (tests/data/h100_trace, reads ~9 ms apart), so a grid fitted to a
few dozen updates places the next update to a few milliseconds.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence

import numpy as np

from jpwr.domains import Reading

MIN_UPDATES = 3  # a grid needs at least two intervals to fit a period and see its scatter


@dataclasses.dataclass(frozen=True)
class UpdateGrid:
    """The counter's updates as t = anchor + n * period; scatter_s is the fit's rms residual."""

    anchor_ns: float
    period_s: float
    scatter_s: float
    updates: int

    def phase_of(self, t_ns: float) -> float:
        """Fraction of a period [0, 1) that t lies after the update before it."""
        return float(((t_ns - self.anchor_ns) / 1e9 / self.period_s) % 1.0)

    def next_at_phase(self, after_ns: float, phase: float) -> float:
        """The first time after `after_ns` that lies `phase` of a period after an update (monotonic ns)."""
        period_ns = self.period_s * 1e9
        base = self.anchor_ns + phase * period_ns
        cycles = np.ceil((after_ns - base) / period_ns)
        return float(base + cycles * period_ns)


def fit_grid(times_ns: Sequence[float], nominal_s: float) -> UpdateGrid | None:
    """A regular grid through update times (any order; at least MIN_UPDATES distinct updates, else None).

    Each update's cycle number counts whole periods from the one before it, with the period fitted so far (the
    nominal one to start): probes minutes apart stay unambiguous as long as the fit so far errs by less than
    half a period over the gap, which growing the fit time-ordered keeps true.
    """
    times = np.sort(np.asarray(times_ns, dtype=float))
    if len(times) < MIN_UPDATES:
        return None
    cycles = [0.0]
    period_ns = nominal_s * 1e9
    for i in range(1, len(times)):
        cycles.append(cycles[-1] + max(1.0, float(np.round((times[i] - times[i - 1]) / period_ns))))
        if i >= 2:
            period_ns = float(np.polyfit(cycles, times[: i + 1], 1)[0])
    slope, intercept = np.polyfit(cycles, times, 1)
    residual = times - (intercept + slope * np.asarray(cycles))
    return UpdateGrid(float(intercept), float(slope) / 1e9, float(np.sqrt(np.mean(residual**2))) / 1e9, len(times))


def probe_updates(read: Callable[[], Reading], updates: int, timeout_s: float) -> list[float]:
    """Read the counter back to back until it has changed `updates` times (or `timeout_s` passed); each change's
    time in monotonic ns, the middle of the interval between the last read of the old value and the first of
    the new one."""
    seen: list[float] = []
    deadline = time.monotonic() + timeout_s
    previous = read()
    while len(seen) < updates and time.monotonic() < deadline:
        current = read()
        if current.value is None or previous.value is None:
            previous = current
            continue
        if current.value != previous.value:
            seen.append((previous.t_before_ns + current.t_after_ns) / 2)
        previous = current
    return seen
