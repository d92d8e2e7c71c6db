"""Window energy from raw sensor series: counter-anchored, power-shaped, with an error bound.

Method, per domain and window [t0, t1]:
- counter: the hardware energy counter is the anchor. Each distinct counter value becomes a
  knot (tau, E); tau is only known to lie in (previous read, this read] and within one update
  period of this read, so it is placed mid-interval with that half-width as uncertainty.
- counter+power: between two knots the counter's increment is spread in proportion to the
  instantaneous-power curve (zero-order hold); without power samples, linearly in time.
- power: no counter: integrate power (zero-order hold, samples of trailing averages moved
  back by half their averaging window), with lag and gap terms in the bound.
Window energy is E(t1) - E(t0) on that curve; interior knots are exact and cancel, so only
the two edge segments carry error. See docs/jpwr.md for the bound's derivation.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from jpwr.domains import Signal
from jpwr.trace import SensorSeries

# The H100's energy counter itself spread +/-8 % across identical runs whose period matched the
# sensor's 100 ms (../shared/reference/energy-measurement.md): an aliased window gets this bound.
ALIASING_RELATIVE_BOUND = 0.08
GAP_FACTOR = 3.0
# The aliasing rule applies to loops that repeat at least a few times with a step of at most
# ten sensor periods; a longer step already spans many sensor phases within itself.
MIN_ALIAS_STEPS = 3
COUNTER_PLAUSIBLE = (0.1, 10.0)
MAX_ALIAS_MULTIPLE = 10  # a hold longer than this many expected sample intervals is a gap (not covered)


@dataclasses.dataclass
class DomainEnergy:
    energy_j: float | None
    method: str | None
    coverage: float
    error_bound_j: float | None
    warnings: list[str] = dataclasses.field(default_factory=list)
    reason: str | None = None  # why energy_j is None


@dataclasses.dataclass
class Knots:
    """Counter knots of one continuous counter segment (no reset inside)."""

    tau_ns: np.ndarray
    half_ns: np.ndarray
    energy_j: np.ndarray


def counter_segments(series: SensorSeries, update_s: float | None) -> tuple[list[Knots], list[str]]:
    """Turn raw counter reads into knots, unwrapping wraps and splitting at resets or backward jumps."""
    ok = series.valid
    t_b, t_a, val = series.t_before_ns[ok], series.t_after_ns[ok], series.value[ok]
    warnings: list[str] = []
    if len(val) == 0:
        return [], warnings
    wrap = series.sensor.wrap_at
    update_ns = int((update_s or 0.0) * 1e9)
    segments: list[Knots] = []
    taus: list[float] = []
    halves: list[float] = []
    energies: list[float] = []
    offset = 0.0
    prev_val = val[0]
    prev_read_end = None  # t_after of the last read with a different (older) value

    def close_segment() -> None:
        if taus:
            segments.append(Knots(np.array(taus), np.array(halves), np.array(energies)))
        taus.clear()
        halves.clear()
        energies.clear()

    for i in range(len(val)):
        v = val[i]
        if i > 0 and v < prev_val:
            if wrap is not None:
                offset += wrap
            else:
                warnings.append(f"counter {series.sensor.id} went backwards at read {i} (reset?): split")
                close_segment()
                offset = -v  # the new segment starts from its own zero
                prev_read_end = None
        e = v + offset
        is_new = i == 0 or v != prev_val or not taus
        if is_new:
            # The previous read still saw the old value, so the update came after it started.
            lo = t_b[i - 1] if i > 0 and prev_read_end is not None else t_b[i] - update_ns
            lo = max(lo, t_b[i] - update_ns) if update_ns else lo
            hi = t_a[i]
            lo = min(lo, hi)
            taus.append((lo + hi) / 2)
            halves.append((hi - lo) / 2)
            energies.append(e)
        prev_val = v
        prev_read_end = t_a[i]
    close_segment()
    return segments, warnings


class PowerCurve:
    """Piecewise-constant power from samples; integral over any interval, and where it is covered."""

    def __init__(self, series: SensorSeries, expected_interval_s: float) -> None:
        ok = series.valid
        t = series.t_ns[ok].astype(np.float64)
        if series.sensor.signal is Signal.POWER_AVERAGE and series.sensor.avg_window_s:
            t = t - series.sensor.avg_window_s * 1e9 / 2  # a trailing mean describes its window's centre
        order = np.argsort(t, kind="stable")
        self.t = t[order]
        self.p = series.value[ok][order]
        self.max_hold_ns = GAP_FACTOR * expected_interval_s * 1e9
        self.avg_window_s = series.sensor.avg_window_s if series.sensor.signal is Signal.POWER_AVERAGE else None

    def __bool__(self) -> bool:
        return len(self.t) > 0

    def integral(self, a: float, b: float) -> tuple[float, float]:
        """(joules, covered ns) over [a, b]; each sample holds until the next, at most max_hold."""
        if b <= a or not self:
            return 0.0, 0.0
        ends = np.append(self.t[1:], np.inf)
        ends = np.minimum(ends, self.t + self.max_hold_ns)
        lo = np.maximum(self.t, a)
        hi = np.minimum(ends, b)
        span = np.clip(hi - lo, 0.0, None)
        return float(np.sum(span * self.p) / 1e9), float(np.sum(span))

    def max_power(self, a: float, b: float) -> float:
        """Largest sample in force during [a, b] (0 when none)."""
        if not self:
            return 0.0
        i0 = max(int(np.searchsorted(self.t, a, side="right")) - 1, 0)
        i1 = int(np.searchsorted(self.t, b, side="right"))
        return float(np.max(self.p[i0:max(i1, i0 + 1)]))


def _edge_value(knots: Knots, curve: PowerCurve | None, t: float) -> tuple[float, float, bool] | None:
    """E(t) on the counter-anchored curve, its error bound, and whether power shaped it.

    None when t lies outside the knots (the caller integrates power there).
    """
    tau = knots.tau_ns
    if t < tau[0] or t > tau[-1]:
        return None
    j = int(np.searchsorted(tau, t, side="right")) - 1
    if j >= len(tau) - 1:
        j = len(tau) - 2
    if j < 0:  # a single knot exactly at t
        return float(knots.energy_j[0]), 0.0, False
    ta, tb = tau[j], tau[j + 1]
    ea, eb = knots.energy_j[j], knots.energy_j[j + 1]
    d = eb - ea
    seg_power = d / ((tb - ta) / 1e9) if tb > ta else 0.0
    s_total, covered = curve.integral(ta, tb) if curve else (0.0, 0.0)
    shaped = bool(curve) and s_total > 0 and covered >= 0.9 * (tb - ta)
    if shaped:
        f = curve.integral(ta, t)[0] / s_total  # type: ignore[union-attr]
        interp = abs(d - s_total) * 2 * min(f, 1 - f)
    else:
        f = (t - ta) / (tb - ta) if tb > ta else 1.0
        interp = abs(d) * min(f, 1 - f)
    # Knot times are uncertain by their half-widths; to first order an error e_a, e_b in the knot
    # times moves E(t) by P·(e_a·(1-f) + e_b·f), so the nearer knot dominates.
    timing = seg_power * (knots.half_ns[j] * (1 - f) + knots.half_ns[j + 1] * f) / 1e9
    return float(ea + f * d), float(timing + interp), shaped


def counter_window(
    segments: list[Knots], curve: PowerCurve | None, t0: float, t1: float, p_max: float
) -> DomainEnergy:
    """Energy over [t0, t1] from counter knots, power-shaped, with power or nothing filling gaps."""
    duration = t1 - t0
    energy = 0.0
    bound = 0.0
    covered = 0.0
    shaped_any = False
    cursor = t0
    warnings: list[str] = []
    for knots in segments:
        a, b = max(t0, knots.tau_ns[0]), min(t1, knots.tau_ns[-1])
        if b <= a:
            continue
        if a > cursor:  # uncovered by this segment's knots: fill with power
            e, c = curve.integral(cursor, a) if curve else (0.0, 0.0)
            energy += e
            covered += c
            bound += _power_gap_bound(curve, cursor, a, c, p_max)
        ea = _edge_value(knots, curve, a)
        eb = _edge_value(knots, curve, b)
        assert ea is not None and eb is not None
        energy += eb[0] - ea[0]
        bound += ea[1] + eb[1]
        covered += b - a
        shaped_any = shaped_any or ea[2] or eb[2]
        cursor = b
    if cursor < t1:
        e, c = curve.integral(cursor, t1) if curve else (0.0, 0.0)
        energy += e
        covered += c
        bound += _power_gap_bound(curve, cursor, t1, c, p_max)
        if c > 0:
            shaped_any = True
    coverage = min(1.0, covered / duration) if duration > 0 else 0.0
    if coverage < 0.999:
        warnings.append(f"counter covers {coverage:.1%} of the window; rest from power or missing")
    if covered == 0:
        return DomainEnergy(None, None, 0.0, None, warnings, reason="no counter or power data inside the window")
    method = "counter+power" if shaped_any else "counter"
    return DomainEnergy(energy, method, coverage, bound, warnings)


def _power_gap_bound(curve: PowerCurve | None, a: float, b: float, covered: float, p_max: float) -> float:
    """Bound for a stretch integrated from power: uncovered time at full power plus averaging lag."""
    gap_s = max(0.0, (b - a) - covered) / 1e9
    lag = 0.0
    if curve and curve.avg_window_s:
        lag = curve.max_power(a, b) * curve.avg_window_s / 2
    return gap_s * p_max + lag


def power_window(curve: PowerCurve, t0: float, t1: float, p_max: float) -> DomainEnergy:
    """Energy over [t0, t1] from power alone (no counter on this device)."""
    energy, covered = curve.integral(t0, t1)
    duration = t1 - t0
    coverage = min(1.0, covered / duration) if duration > 0 else 0.0
    if covered == 0:
        return DomainEnergy(None, None, 0.0, None, reason="no valid power samples inside the window")
    bound = _power_gap_bound(curve, t0, t1, covered, p_max)
    if curve.avg_window_s:
        bound += curve.max_power(t0, t1) * curve.avg_window_s / 2  # both edges lag the load change
    warnings = [] if coverage >= 0.999 else [f"power samples cover {coverage:.1%} of the window"]
    if curve.avg_window_s:
        warnings.append(f"no energy counter: integrated power averaged over {curve.avg_window_s:g} s, which lags "
                        f"load changes by ~{curve.avg_window_s / 2:g} s at each edge (in the bound)")
    return DomainEnergy(energy, "power", coverage, bound, warnings)


def planned_bound_j(edge_power_w: float, update_s: float) -> float:
    """The bound a window will be stated with, for planning its length before it opens.

    Only the two edge segments carry error (interior knots are exact and cancel). At each edge the
    timing term is P·h with h at most half an update period (the sampler chases the counter after a
    mark), and the interpolation term is at most the counter–power disagreement inside the edge
    segment, which the chase keeps to about one update period of energy. So each edge contributes at
    most about P·T, two edges 2·P·T. (On the H100 the stated bounds were 0.9–1.05 P·T in total, so
    this plans conservatively.)
    """
    return 2.0 * edge_power_w * update_s


def aliasing_warning(window_s: float, steps: int, sensor_period_s: float | None) -> str | None:
    """Warn when the loop's period keeps hitting the same sensor phases (see issue's aliasing rule).

    With step period p = window/steps, offset delta of p from the nearest multiple of the
    sensor period T, the window's N steps drift through all phases only if N·|delta| >= T.
    """
    if not sensor_period_s or steps < MIN_ALIAS_STEPS or window_s <= 0:
        return None  # no repetition to alias with
    p = window_s / steps
    multiple = round(p / sensor_period_s)
    if multiple == 0 or multiple > MAX_ALIAS_MULTIPLE:
        return None  # several steps per sensor period, or a step spanning many periods: phases are all sampled
    delta = p - multiple * sensor_period_s
    if steps * abs(delta) < sensor_period_s:
        return (
            f"aliasing: step period {p * 1e3:.1f} ms is within {abs(delta) * 1e3:.1f} ms of a multiple of the "
            f"{sensor_period_s * 1e3:.0f} ms sensor period over {steps} steps; the sensor sees the same phases "
            f"again and again (bound widened to {ALIASING_RELATIVE_BOUND:.0%})"
        )
    return None


def _counter_power_mismatch(result: DomainEnergy, curve: PowerCurve | None, t0_ns: int, t1_ns: int) -> str | None:
    """Flag a counter that disagrees grossly with the power samples (frozen or broken counters, as
    seen on MI100 and early ROCm; Zeus's start-up check uses the same (0.1, 10) band)."""
    if result.method == "power" or result.energy_j is None or curve is None:
        return None
    power_j, covered = curve.integral(float(t0_ns), float(t1_ns))
    if covered < 0.9 * (t1_ns - t0_ns) or power_j <= 0:
        return None
    ratio = result.energy_j / power_j
    if COUNTER_PLAUSIBLE[0] < ratio < COUNTER_PLAUSIBLE[1]:
        return None
    return (f"energy counter and power samples disagree by a factor {ratio:.3g} over this window: "
            "counter frozen or broken? (compare with the method `power` in the trace)")


def failed_reads_warning(series: list[SensorSeries], t0_ns: int, t1_ns: int) -> str | None:
    """Say when reads failed inside the window, and whether the device stopped answering for good.

    A device that vanishes (GPU lost, reset, driver gone) leaves error readings, not values; the
    estimator fills or bounds the gap, and this names what happened and when.
    """
    failed_at, last_ok, total = [], -math.inf, 0
    for one in series:
        t = one.t_ns
        inside = (t >= t0_ns) & (t <= t1_ns)
        total += int(inside.sum())
        failed_at += list(t[inside & ~one.valid])
        if one.valid.any():
            last_ok = max(last_ok, float(t[one.valid].max()))
    if not failed_at:
        return None
    first = (min(failed_at) - t0_ns) / 1e9
    if last_ok < min(failed_at):
        return (f"the device stopped answering {first:.2f} s into the window ({len(failed_at)} of {total} reads "
                "failed from then on: lost, reset or unreachable); the rest of the window was not measured")
    return f"{len(failed_at)} of {total} reads failed inside the window (the first {first:.2f} s after its start)"


def domain_window_energy(
    counter: SensorSeries | None,
    power: SensorSeries | None,
    t0_ns: int,
    t1_ns: int,
    interval_s: float,
    p_max_w: float,
    steps: int = 0,
) -> DomainEnergy:
    """The best estimate for one domain and window, from whichever signals it has."""
    curve = PowerCurve(power, interval_s) if power is not None else None
    if curve is not None and not curve:
        curve = None
    update_s = counter.sensor.est_update_s if counter is not None else None
    segments: list[Knots] = []
    warnings: list[str] = []
    if counter is not None:
        segments, warnings = counter_segments(counter, update_s)
    if segments:
        result = counter_window(segments, curve, float(t0_ns), float(t1_ns), p_max_w)
    elif curve is not None:
        result = power_window(curve, float(t0_ns), float(t1_ns), p_max_w)
    else:
        return DomainEnergy(None, None, 0.0, None, warnings, reason="no energy counter or power readings")
    result.warnings = warnings + result.warnings
    failed = failed_reads_warning([x for x in (counter, power) if x is not None], t0_ns, t1_ns)
    if failed:
        result.warnings.append(failed)
    implausible = _counter_power_mismatch(result, curve, t0_ns, t1_ns)
    if implausible:
        result.warnings.append(implausible)
    sensor_period = update_s or (power.sensor.est_update_s if power is not None else None)
    alias = aliasing_warning((t1_ns - t0_ns) / 1e9, steps, sensor_period)
    if alias and result.energy_j is not None and result.error_bound_j is not None:
        result.warnings.append(alias)
        result.error_bound_j = max(result.error_bound_j, ALIASING_RELATIVE_BOUND * abs(result.energy_j))
    if result.energy_j is not None and not math.isfinite(result.energy_j):
        return DomainEnergy(None, None, 0.0, None, result.warnings, reason="non-finite energy")
    return result
