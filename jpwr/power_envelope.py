"""The power samples as the estimator uses them: a zero-order-hold curve and a rigorous envelope.

PowerCurve is the estimate (each sample holds until the next, at most GAP_FACTOR sampling intervals).
Envelope bounds the true power at every time for the signal class of docs/jpwr.md ("Faults and what
the meter does about them"), so that a bound computed from it holds for every signal the samples allow.
"""

from __future__ import annotations

import numpy as np

from jpwr.domains import Signal
from jpwr.trace_io import SensorSeries

GAP_FACTOR = 3.0  # a power sample holds for at most this many sampling intervals; longer is a gap


class PowerCurve:
    """Piecewise-constant power from samples; integral over any interval, and where it is covered."""

    def __init__(self, series: SensorSeries, expected_interval_s: float) -> None:
        ok = series.valid
        t = series.t_ns[ok].astype(np.float64)
        self.avg_window_s = series.sensor.avg_window_s if series.sensor.signal is Signal.POWER_AVERAGE else None
        if self.avg_window_s:
            t = t - self.avg_window_s * 1e9 / 2  # a trailing mean describes its window's centre
        order = np.argsort(t, kind="stable")
        self.t = t[order]
        self.p = series.value[ok][order]
        self.t_before = series.t_before_ns[ok][order].astype(np.float64)
        self.t_after = series.t_after_ns[ok][order].astype(np.float64)
        self.max_hold_ns = GAP_FACTOR * expected_interval_s * 1e9
        self.refresh_s = series.sensor.est_update_s or expected_interval_s

    def __bool__(self) -> bool:
        return len(self.t) > 0

    def _holds(self) -> tuple[np.ndarray, np.ndarray]:
        ends = np.append(self.t[1:], np.inf)
        return self.t, np.minimum(ends, self.t + self.max_hold_ns)

    def integral(self, a: float, b: float) -> tuple[float, float]:
        """(joules, covered ns) over [a, b]; each sample holds until the next, at most max_hold."""
        if b <= a or not self:
            return 0.0, 0.0
        starts, ends = self._holds()
        span = np.clip(np.minimum(ends, b) - np.maximum(starts, a), 0.0, None)
        return float(np.sum(span * self.p) / 1e9), float(np.sum(span))

    def uncovered(self, a: float, b: float) -> list[tuple[float, float]]:
        """The stretches of [a, b] no sample holds over."""
        if b <= a:
            return []
        if not self:
            return [(a, b)]
        starts, ends = self._holds()
        inside = (ends > a) & (starts < b)
        gaps, cursor = [], a
        for s, e in zip(starts[inside], ends[inside], strict=True):
            if s > cursor:
                gaps.append((cursor, min(s, b)))
            cursor = max(cursor, e)
        if cursor < b:
            gaps.append((cursor, b))
        return gaps


class Envelope:
    """Bounds pmin(t) <= P(t) <= pmax(t) on the true power, from the power samples, and their integrals.

    For a signal of the class in docs/jpwr.md (piecewise constant in [0, p_env], every piece lasting at
    least D = refresh period + averaging window + the largest gap between samples), the piece in force at
    t is seen whole by some sample stamped within [t - G, t + D], G that largest gap (up to the curve's
    maximum hold). So P(t) lies between the smallest and largest such sample. Where samples are sparser,
    or there are none, nothing is known: [0, p_env].
    """

    def __init__(self, curve: PowerCurve | None, p_env: float, around: tuple[float, float] | None = None) -> None:
        self.p_env = p_env
        self.x = np.array([0.0])  # breakpoints; lo/hi hold on [x_i, x_i+1); outside [x_0, x_-1]: [0, p_env]
        self.cum_lo = np.array([0.0])
        self.cum_hi = np.array([0.0])
        if curve:
            self._build(curve, around)

    @classmethod
    def blind(cls, p_env: float) -> Envelope:
        """Only the device envelope: what is known with no power samples."""
        return cls(None, p_env)

    def _build(self, curve: PowerCurve, around: tuple[float, float] | None) -> None:
        tb, ta, v = curve.t_before, curve.t_after, curve.p
        if around is not None:  # only the samples that can matter, so long traces stay cheap
            reach = 2 * (curve.max_hold_ns + curve.refresh_s * 1e9 + (curve.avg_window_s or 0.0) * 1e9)
            keep = (ta >= around[0] - reach) & (tb <= around[1] + reach)
            tb, ta, v = tb[keep], ta[keep], v[keep]
        if len(v) < 2:
            return
        order = np.argsort(tb, kind="stable")
        tb, ta, v = tb[order], np.maximum.accumulate(ta[order]), v[order]
        gaps = ta[1:] - tb[:-1]  # the longest time between two consecutive sample instants
        cuts = np.flatnonzero(gaps > curve.max_hold_ns) + 1
        xs, los, his = [], [], []
        for run in np.split(np.arange(len(v)), cuts):
            if len(run) < 2:
                continue
            k0, k1 = run[0], run[-1]
            g = float(np.max(gaps[k0:k1]))
            d = curve.refresh_s * 1e9 + (curve.avg_window_s or 0.0) * 1e9 + g
            lo_t, hi_t = ta[k0] + g, tb[k1] - d  # where the argument above holds inside this run
            if hi_t <= lo_t:
                continue
            edges = np.concatenate((tb[run] - d, ta[run] + g, [lo_t, hi_t]))
            edges = np.unique(np.clip(edges, lo_t, hi_t))
            mids = (edges[:-1] + edges[1:]) / 2
            first = np.searchsorted(ta[run] + g, mids, side="left")  # samples with ta + g >= t
            last = np.searchsorted(tb[run] - d, mids, side="right") - 1  # samples with tb - d <= t
            lo, hi = _range_min_max(v[run], first, last)
            empty = last < first
            lo[empty], hi[empty] = 0.0, self.p_env
            xs.append(edges)
            los.append(np.append(np.clip(lo, 0.0, None), 0.0))  # the value after the run's end: unknown
            his.append(np.append(hi, self.p_env))
        if not xs:
            return
        x = np.concatenate(xs)
        lo_v = np.concatenate(los)[:-1]
        hi_v = np.concatenate(his)[:-1]
        # between runs the placeholder (0, p_env) stands for "unknown", which is what it should be
        width = np.diff(x)
        self.x = x
        self.cum_lo = np.concatenate(([0.0], np.cumsum(lo_v * width)))
        self.cum_hi = np.concatenate(([0.0], np.cumsum(hi_v * width)))

    def extremes(self, a: float, b: float) -> tuple[float, float]:
        """The lowest pmin and highest pmax anywhere in [a, b] (ns): the power can be no lower or higher there."""
        if b <= a or len(self.x) < 2 or a < self.x[0] or b > self.x[-1]:
            return 0.0, self.p_env
        i0 = max(int(np.searchsorted(self.x, a, side="right")) - 1, 0)
        i1 = min(int(np.searchsorted(self.x, b, side="left")), len(self.x) - 1)
        width = np.diff(self.x[i0:i1 + 1])
        wide = width > 0
        if not wide.any():
            return 0.0, self.p_env
        lo = np.diff(self.cum_lo[i0:i1 + 1])[wide] / width[wide]
        hi = np.diff(self.cum_hi[i0:i1 + 1])[wide] / width[wide]
        return float(np.min(lo)), float(np.max(hi))

    def integrals(self, a: float, b: float) -> tuple[float, float]:
        """(least, most) joules any signal of the class can deliver over [a, b] (ns)."""
        if b <= a:
            return 0.0, 0.0
        x0, x1 = self.x[0], self.x[-1]
        inner_a, inner_b = min(max(a, x0), x1), min(max(b, x0), x1)
        outside_s = ((b - a) - (inner_b - inner_a)) / 1e9
        lo = float(np.interp(inner_b, self.x, self.cum_lo) - np.interp(inner_a, self.x, self.cum_lo)) / 1e9
        hi = float(np.interp(inner_b, self.x, self.cum_hi) - np.interp(inner_a, self.x, self.cum_hi)) / 1e9
        return lo, hi + outside_s * self.p_env


def _range_min_max(values: np.ndarray, first: np.ndarray, last: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """min and max of values[first[i]:last[i]+1] for every i (sparse table; empty ranges give garbage)."""
    n = len(values)
    mins, maxs = [values], [values]
    width = 1
    while 2 * width <= n:
        mins.append(np.minimum(mins[-1][:-width], mins[-1][width:]))
        maxs.append(np.maximum(maxs[-1][:-width], maxs[-1][width:]))
        width *= 2
    first = np.clip(first, 0, n - 1)
    last = np.clip(last, first, n - 1)
    length = last - first + 1
    level = np.floor(np.log2(length)).astype(int)
    lo = np.empty(len(first))
    hi = np.empty(len(first))
    for k in np.unique(level):
        sel = level == k
        a, b = first[sel], last[sel] - (1 << k) + 1
        lo[sel] = np.minimum(mins[k][a], mins[k][b])
        hi[sel] = np.maximum(maxs[k][a], maxs[k][b])
    return lo, hi
