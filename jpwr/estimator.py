"""public: for sizing a window before it opens (joulebench.sizing): the bound the estimator will state
and whether a loop aliases with the sensor; the rest of this module is the meter's own.

Window energy from raw sensor series: counter-anchored, power-shaped, with an error bound that holds.

Method, per domain and window [t0, t1]:
- counter: the hardware energy counter is the anchor. Each distinct counter value becomes a
  knot (tau, E). The update behind it lies between the start of the previous read (which still
  showed the old value) and the end of this one: the bounds use that interval [lo, hi]. The
  estimate places tau in the part of it within one update period of this read, as a counter that
  updates regularly has it (one that stalls does not, hence the wider interval for the bounds).
- counter+power: between two knots the counter's increment is spread in proportion to the
  instantaneous-power curve (zero-order hold); without power samples, linearly in time.
- power: no counter: integrate power (zero-order hold, samples of trailing averages moved
  back by half their averaging window).
Window energy is E(t1) - E(t0) on that curve; interior knots are exact and cancel, so only
the two edge segments carry error.

The bound is interval arithmetic, not a rule of thumb: for the signal class of docs/jpwr.md
("Faults and what the meter does about them") the true power lies between the envelopes
`Envelope` derives from the samples (or between 0 and the device's envelope where samples
say nothing), and every bound below is the farthest the estimate can be from any signal
consistent with the counter knots and those envelopes. Counter steps no such signal can produce
are faults, not energy: the series is split there and power bridges the gap. Steps the power
samples contradict are doubted: kept, with the bound covering what the power samples allow.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

from jpwr.aliasing import CardBound, card_bound
from jpwr.device_energy import Fault
from jpwr.power_envelope import Envelope, PowerCurve
from jpwr.trace_io import SensorSeries

__all__ = ["aliasing_warning", "planned_bound_j"]

# The aliasing rule applies to loops that repeat at least a few times with a step of at most
# ten sensor periods; a longer step already spans many sensor phases within itself.
MIN_ALIAS_STEPS = 3
MAX_ALIAS_MULTIPLE = 10
# Counter and power must disagree by more than this factor before a counter step is doubted: real sensors
# alias (docs/jpwr.md) and only a gross disagreement is evidence.
COUNTER_POWER_TOLERANCE = 2.0


@dataclasses.dataclass(kw_only=True)
class DomainEnergy:
    energy_j: float | None
    method: str | None
    coverage: float
    error_bound_j: float | None
    warnings: list[str] = dataclasses.field(default_factory=list)
    reason: str | None = None  # why energy_j is None
    covered_s: float = 0.0  # seconds of the window with data (counter knots or held power samples)
    gap_bound_j: float = 0.0  # the part of error_bound_j charged for the seconds without data
    faults: list[Fault] = dataclasses.field(default_factory=list)
    counter_bound_j: float | None = None  # the bound taking the counter's word where it and power disagreed


def fault(kind: str, from_s: float, to_s: float, detail: str, error: str | None = None) -> Fault:
    """One fault found in a domain's data for a window, its times (s from the window's start) to the µs."""
    return Fault(kind=kind, from_s=round(from_s, 6), to_s=round(to_s, 6), error=error, detail=detail)


@dataclasses.dataclass
class Knots:
    """Counter knots of one continuous counter segment (no reset inside)."""

    tau_ns: np.ndarray  # best guess of each update's time (for the estimate)
    lo_ns: np.ndarray  # the update happened in [lo, hi] for certain (for the bounds)
    hi_ns: np.ndarray
    energy_j: np.ndarray

    def part(self, start: int, stop: int | None) -> Knots:
        return Knots(self.tau_ns[start:stop], self.lo_ns[start:stop], self.hi_ns[start:stop],
                     self.energy_j[start:stop])


@dataclasses.dataclass(frozen=True)
class CounterIssue:
    """A counter step that cannot be taken at its word. counter_backward and counter_fault split the series
    (power bridges the stretch between the knots); counter_power_disagree keeps the step but doubts it."""

    t0_ns: float  # the knot before the step
    t1_ns: float  # the knot after it
    kind: str  # counter_backward, counter_fault or counter_power_disagree
    step_j: float  # what the counter claimed across the step
    span_ns: float  # the longest time the step could have taken


def counter_segments(series: SensorSeries, update_s: float | None) -> tuple[list[Knots], list[CounterIssue]]:
    """Turn raw counter reads (in time order) into knots, unwrapping known wraps, splitting at backward steps."""
    ok = series.valid
    t_b, t_a, val = series.t_before_ns[ok], series.t_after_ns[ok], series.value[ok]
    issues: list[CounterIssue] = []
    if len(val) == 0:
        return [], issues
    wrap = series.sensor.wrap_at
    update_ns = int((update_s or 0.0) * 1e9)
    segments: list[Knots] = []
    taus: list[float] = []
    los: list[float] = []
    his: list[float] = []
    energies: list[float] = []
    offset = 0.0
    prev_val = val[0]
    earliest = -np.inf  # after a split: the new value may stem from any update since the last knot's

    def close_segment() -> None:
        if taus:
            segments.append(Knots(np.array(taus), np.array(los), np.array(his), np.array(energies)))
        for values in (taus, los, his, energies):
            values.clear()

    for i in range(len(val)):
        v = val[i]
        if i > 0 and v < prev_val:
            if wrap is not None:
                offset += wrap
            else:
                last = taus[-1] if taus else float(t_a[i - 1])
                issues.append(CounterIssue(last, float(t_a[i]), "counter_backward", float(v - prev_val),
                                           float(t_a[i] - t_b[i - 1])))
                earliest = los[-1] if los else earliest
                close_segment()
                offset = -v  # the new segment starts from its own zero
        e = v + offset
        if i == 0 or v != prev_val or not taus:
            # The previous read still saw the old value, so the update came after it started; right after a
            # split (a reset, or a jump in the value) the value may stem from any update since the last knot's;
            # the very first read is assumed to show an update at most one period old (nothing else is known).
            hi = t_a[i]
            lo = min(t_b[i - 1] if i > 0 else t_b[i] - update_ns, hi, earliest if not taus else np.inf)
            likely = min(max(lo, t_b[i] - update_ns), hi)
            taus.append((likely + hi) / 2)
            los.append(lo)
            his.append(hi)
            energies.append(e)
        prev_val = v
    close_segment()
    return segments, issues


def _counter_range(env: Envelope, t: float, knots: Knots, j: int) -> tuple[float, float]:
    """Least and most energy from the update behind knot j to time t, for any signal of the class.

    Knot j's value was taken at an update u_a in [lo_j, hi_j], knot j+1's at u_b in [lo_j+1, hi_j+1], and
    the power between them integrates to their difference d exactly; the envelope bounds it at every time.
    """
    d = knots.energy_j[j + 1] - knots.energy_j[j]
    early_a, late_a = knots.lo_ns[j], knots.hi_ns[j]
    early_b, late_b = knots.lo_ns[j + 1], knots.hi_ns[j + 1]
    most_a = env.integrals(early_a, t)[1] if t >= early_a else -env.integrals(t, early_a)[0]
    most_b = d - env.integrals(t, early_b)[0] if early_b >= t else d + env.integrals(early_b, t)[1]
    least_a = env.integrals(late_a, t)[0] if t >= late_a else -env.integrals(t, late_a)[1]
    least_b = d - env.integrals(t, late_b)[1] if late_b >= t else d + env.integrals(late_b, t)[0]
    return max(least_a, least_b), min(most_a, most_b)


def _edge_value(knots: Knots, curve: PowerCurve | None, env: Envelope, t: float, resolution: float
                ) -> tuple[float, float, bool]:
    """E(t) on the counter-anchored curve, its error bound, and whether power shaped it (t within the knots)."""
    tau = knots.tau_ns
    j = min(max(int(np.searchsorted(tau, t, side="right")) - 1, 0), len(tau) - 2)
    ta, tb = tau[j], tau[j + 1]
    ea, eb = knots.energy_j[j], knots.energy_j[j + 1]
    d = eb - ea
    s_total, covered = curve.integral(ta, tb) if curve else (0.0, 0.0)
    shaped = bool(curve) and s_total > 0 and covered >= 0.9 * (tb - ta)
    linear = (t - ta) / (tb - ta) if tb > ta else 1.0
    f = curve.integral(ta, t)[0] / s_total if curve is not None and shaped else linear
    estimate = f * d
    least, most = _counter_range(env, t, knots, j)
    if least > most:  # the power samples contradict this step: fall back on the device envelope alone
        least, most = _counter_range(Envelope.blind(env.p_env), t, knots, j)
    bound = max(estimate - least, most - estimate, 0.0) + 2 * resolution  # the counter's own quantum
    return float(ea + estimate), float(bound), shaped


def plausible_segments(segments: Sequence[Knots], env: Envelope, resolution: float, t0: float, t1: float
                       ) -> tuple[list[Knots], list[CounterIssue]]:
    """Split counter segments where a step is a fault, not energy (only steps that touch [t0, t1] matter).

    A step is a fault when it needs more power than the device envelope over the longest time it can
    have taken (a forward jump), or when its mean power lies outside the highest and lowest power the
    samples allow anywhere around it by more than COUNTER_POWER_TOLERANCE (a jump, or a counter that
    stalled and lost energy). Comparing with the extremes, not the integral, keeps bursty loads that the
    power sensor aliases (docs/jpwr.md) from looking like faults. Only the envelope fault is split (power
    bridges it); a disagreement is listed, the counter kept, and `_doubt` widens the bound.
    """
    out: list[Knots] = []
    issues: list[CounterIssue] = []
    for knots in segments:
        start = 0
        tau, lo, hi, e = knots.tau_ns, knots.lo_ns.copy(), knots.hi_ns, knots.energy_j
        knots = Knots(tau, lo, hi, e)
        for j in range(len(tau) - 1):
            if tau[j + 1] < t0 or tau[j] > t1:
                continue
            d = e[j + 1] - e[j]
            # A counter that updates every period took this step within these times. One that stalled and
            # caught up may look like a fault here, which costs a bridge or a wider bound, never a wrong one:
            # the bounds use [lo, hi].
            likely_start = 2 * tau[j] - hi[j]
            longest = hi[j + 1] - likely_start
            shortest = max(0.0, (2 * tau[j + 1] - hi[j + 1]) - hi[j])
            kind = None
            if d > env.p_env * longest / 1e9 + 2 * resolution:
                kind = "counter_fault"
            else:
                low, high = env.extremes(likely_start, hi[j + 1])
                most = COUNTER_POWER_TOLERANCE * high * longest / 1e9
                least = low * shortest / 1e9 / COUNTER_POWER_TOLERANCE
                if d > most + 2 * resolution or d < least - 2 * resolution:
                    kind = "counter_power_disagree"
            if kind:
                issues.append(CounterIssue(float(tau[j]), float(tau[j + 1]), kind, float(d), float(longest)))
            if kind == "counter_fault":  # a disagreement is doubted (`_doubt`), not split
                out.append(knots.part(start, j + 1))
                start = j + 1
                # the faulty value may stem from any update since knot j's, not only since the read before
                lo[j + 1] = min(lo[j + 1], lo[j])
        out.append(knots.part(start, None))
    return out, issues


@dataclasses.dataclass
class _Tally:
    """Running sums of one window's evaluation."""

    energy: float = 0.0
    bound: float = 0.0  # covers every signal the class allows, the power samples' view included
    counter_bound: float = 0.0  # the same, but taking the counter's word where it and power disagreed
    covered: float = 0.0
    gap_bound: float = 0.0
    shaped: bool = False

    def add(self, energy: float, bound: float, covered: float, counter_bound: float | None = None) -> None:
        self.energy += energy
        self.bound += bound
        self.counter_bound += bound if counter_bound is None else counter_bound
        self.covered += covered


def _bridge(tally: _Tally, curve: PowerCurve | None, env: Envelope, a: float, b: float) -> None:
    """Fill [a, b] between counter segments (or beyond them) from power, bounded by what its envelope allows."""
    if b <= a:
        return
    energy, covered = curve.integral(a, b) if curve else (0.0, 0.0)
    least, most = env.integrals(a, b)
    bound = max(energy - least, most - energy, 0.0)
    tally.add(energy, bound, covered)
    uncovered = max(0.0, (b - a) - covered) / 1e9
    tally.gap_bound += min(bound, uncovered * env.p_env)
    tally.shaped = tally.shaped or covered > 0


def _doubt(tally: _Tally, segments: Sequence[Knots], curve: PowerCurve | None, env: Envelope, issue: CounterIssue,
           t0: float, t1: float) -> None:
    """Widen the bound for a counter step the power samples disagree with: the step stays the estimate, and
    the bound also covers every energy the power samples allow over the part of it inside the window."""
    knots = next((k for k in segments if k.tau_ns[0] <= issue.t0_ns and issue.t1_ns <= k.tau_ns[-1]), None)
    x, y = max(t0, issue.t0_ns), min(t1, issue.t1_ns)
    if knots is None or y <= x:
        return
    j = int(np.searchsorted(knots.tau_ns, issue.t0_ns))
    estimate = _edge_value(knots, curve, env, y, 0.0)[0] - _edge_value(knots, curve, env, x, 0.0)[0]
    # the knots' timing is uncertain: the power's least over the shortest stretch, its most over the longest
    least = env.integrals(x if x > issue.t0_ns else knots.hi_ns[j], y if y < issue.t1_ns else knots.lo_ns[j + 1])[0]
    most = env.integrals(x if x > issue.t0_ns else knots.lo_ns[j], y if y < issue.t1_ns else knots.hi_ns[j + 1])[1]
    tally.bound += max(estimate - least, most - estimate, 0.0)


def counter_window(segments: Sequence[Knots], curve: PowerCurve | None, t0: float, t1: float, p_max: float,
                   issues: Sequence[CounterIssue] = (), env: Envelope | None = None, resolution: float = 0.0
                   ) -> DomainEnergy:
    """Energy over [t0, t1] from counter knots, power-shaped, with power (or nothing) filling the gaps."""
    env = env or Envelope(curve, p_max, (t0, t1))
    tally = _Tally()
    cursor = t0
    for knots in sorted(segments, key=lambda k: k.tau_ns[0]):
        a, b = max(t0, knots.tau_ns[0]), min(t1, knots.tau_ns[-1])
        if b <= a:
            continue
        _bridge(tally, curve, env, cursor, a)
        ea = _edge_value(knots, curve, env, a, resolution)
        eb = _edge_value(knots, curve, env, b, resolution)
        tally.add(eb[0] - ea[0], ea[1] + eb[1], b - a)
        tally.shaped = tally.shaped or ea[2] or eb[2]
        cursor = b
    _bridge(tally, curve, env, cursor, t1)
    for issue in issues:
        if issue.kind == "counter_power_disagree":
            _doubt(tally, segments, curve, env, issue, t0, t1)
    return _result(tally, t1 - t0, "counter+power" if tally.shaped else "counter")


def _result(tally: _Tally, duration: float, method: str) -> DomainEnergy:
    coverage = min(1.0, tally.covered / duration) if duration > 0 else 0.0
    if tally.covered == 0:
        return DomainEnergy(energy_j=None, method=None, coverage=0.0, error_bound_j=None,
                            reason="no counter or power data inside the window")
    return DomainEnergy(energy_j=tally.energy, method=method, coverage=coverage, error_bound_j=tally.bound,
                        covered_s=tally.covered / 1e9, gap_bound_j=tally.gap_bound, counter_bound_j=tally.counter_bound)


def power_window(curve: PowerCurve, t0: float, t1: float, p_max: float) -> DomainEnergy:
    """Energy over [t0, t1] from power alone (no counter on this device)."""
    tally = _Tally()
    _bridge(tally, curve, Envelope(curve, p_max, (t0, t1)), t0, t1)
    result = _result(tally, t1 - t0, "power")
    if result.energy_j is not None and curve.avg_window_s:
        result.warnings.append(f"no energy counter: integrated power averaged over {curve.avg_window_s:g} s, which "
                               f"lags load changes by ~{curve.avg_window_s / 2:g} s at each edge (in the bound)")
    return result


def planned_bound_j(edge_power_w: float, update_s: float) -> float:
    """The bound a window will be stated with, for planning its length before it opens.

    Only the two edge segments carry error (interior knots are exact and cancel). At each edge the
    energy between the update behind the knot before it and the edge is bounded by the counter step
    around the edge, and the sampler's chase after a mark pins the knot after the edge to one read,
    so that step is about one update period of energy. So each edge contributes at most about P·T,
    two edges 2·P·T. (On the H100 the stated bounds were 0.9–1.05 P·T in total, so this plans
    conservatively.)
    """
    return 2.0 * edge_power_w * update_s


def aliasing_warning(window_s: float, steps: int, sensor_period_s: float | None, bound: CardBound | None = None
                     ) -> str | None:
    """Warn when the loop's period keeps hitting the same sensor phases (see issue's aliasing rule).

    With step period p = window/steps, offset delta of p from the nearest multiple of the
    sensor period T, the window's N steps drift through all phases only if N·|delta| >= T.
    `bound` is the card's aliasing bound the warning states (default: a card without a measured row).
    """
    if not sensor_period_s or steps < MIN_ALIAS_STEPS or window_s <= 0:
        return None  # no repetition to alias with
    p = window_s / steps
    multiple = round(p / sensor_period_s)
    if multiple == 0 or multiple > MAX_ALIAS_MULTIPLE:
        return None  # several steps per sensor period, or a step spanning many periods: phases are all sampled
    delta = p - multiple * sensor_period_s
    if steps * abs(delta) < sensor_period_s:
        bound = bound or card_bound(None)
        return (
            f"aliasing: step period {p * 1e3:.1f} ms is within {abs(delta) * 1e3:.1f} ms of a multiple of the "
            f"{sensor_period_s * 1e3:.0f} ms sensor period over {steps} steps; the sensor sees the same phases "
            f"again and again (bound widened to {bound.percent}: {bound.origin()})"
        )
    return None


def _describe_issues(issues: Sequence[CounterIssue], sensor_id: str, p_env: float, t0: float, t1: float
                     ) -> tuple[list[str], list[Fault]]:
    """A warning and a fault entry for every counter issue that touches the window."""
    warnings: list[str] = []
    faults: list[Fault] = []
    for k in issues:
        if k.t1_ns < t0 or k.t0_ns > t1:
            continue
        a, b = (k.t0_ns - t0) / 1e9, (k.t1_ns - t0) / 1e9
        where = f"between {a:.3f} s and {b:.3f} s of the window"
        if k.kind == "counter_backward":
            detail = f"counter {sensor_id} went backwards by {-k.step_j:.4g} J {where} (reset or wrap?): split there"
        elif k.kind == "counter_fault":
            detail = (f"counter {sensor_id} jumped by {k.step_j:.4g} J {where}, more than the device can draw in "
                      f"{k.span_ns / 1e9:.3g} s at its {p_env:.4g} W envelope: a fault, not energy; split there")
        else:
            detail = (f"counter {sensor_id} and the power samples disagree {where}: the counter's step of "
                      f"{k.step_j:.4g} J is more than a factor {COUNTER_POWER_TOLERANCE:g} outside the power the "
                      "samples allow (a counter fault, or a bursty load the power sensor aliases); the counter's "
                      "step is kept and the bound covers the power samples' view")
            warnings.append(detail)
            faults.append(fault(k.kind, a, b, detail))
            continue
        warnings.append(f"{detail}; bridged from power samples where there are any")
        faults.append(fault(k.kind, a, b, detail))
    return warnings, faults


def _describe_gaps(counter: SensorSeries | None, power: SensorSeries | None, curve: PowerCurve | None,
                   segments: Sequence[Knots], t0: float, t1: float) -> list[Fault]:
    """The stretches of the window with neither counter knots nor held power samples, with the read errors there."""
    covered = sorted((max(t0, k.tau_ns[0]), min(t1, k.tau_ns[-1])) for k in segments if len(k.tau_ns) > 1)
    holes: list[tuple[float, float]] = []
    cursor = t0
    for a, b in [*covered, (t1, t1)]:
        if a > cursor:
            holes += curve.uncovered(cursor, a) if curve else [(cursor, a)]
        cursor = max(cursor, b)
    faults: list[Fault] = []
    reach = curve.max_hold_ns if curve else 0.0
    for a, b in holes:
        if b - a <= 0:
            continue
        found = [s.failures_between(a - reach, b) for s in (counter, power) if s is not None]
        errors = sorted({e for names, _ in found for e in names})
        starts = [first for _, first in found if first is not None]
        error = ", ".join(errors) if errors else None
        detail = f"no data from {(a - t0) / 1e9:.3f} s to {(b - t0) / 1e9:.3f} s of the window"
        if error:
            detail += f" (reads failing from {(min(starts) - t0) / 1e9:.3f} s: {error})"
        elif counter is not None and np.any(counter.valid & (counter.t_after_ns >= a) & (counter.t_before_ns <= b)):
            detail += " (the counter did not change: stalled, or no power drawn; no power samples to tell)"
        else:
            detail += " (no readings)"
        faults.append(fault("gap", (a - t0) / 1e9, (b - t0) / 1e9, detail, error))
    return faults


def _reach(segments: Sequence[Knots], t0: float, t1: float) -> tuple[float, float]:
    """The time the window's estimate can depend on: [t0, t1] widened to the knots just outside it."""
    lo, hi = t0, t1
    for k in segments:
        if k.tau_ns[0] > t1 or k.tau_ns[-1] < t0:
            continue
        i0 = max(int(np.searchsorted(k.tau_ns, t0)) - 1, 0)
        i1 = min(int(np.searchsorted(k.tau_ns, t1)), len(k.tau_ns) - 1)
        lo, hi = min(lo, k.lo_ns[i0]), max(hi, k.hi_ns[i1])
    return lo, hi


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
    names = sorted({e for one in series for e in one.failures_between(t0_ns, t1_ns)[0]})
    said = f": {', '.join(names)}" if names else ""
    if last_ok < min(failed_at):
        return (f"the device stopped answering {first:.2f} s into the window ({len(failed_at)} of {total} reads "
                f"failed from then on{said}: lost, reset or unreachable); the rest of the window was not measured")
    return (f"{len(failed_at)} of {total} reads failed inside the window (the first {first:.2f} s after its start"
            f"{said})")


def domain_window_energy(
    counter: SensorSeries | None,
    power: SensorSeries | None,
    t0_ns: int,
    t1_ns: int,
    interval_s: float,
    p_max_w: float,
    steps: int = 0,
    card: str | None = None,
) -> DomainEnergy:
    """The best estimate for one domain and window, from whichever signals it has.

    p_max_w is the device's envelope (power limit × margin): the most any stretch without data, or any
    counter step, can hold. card is the device's model name (its domain's name): an aliased window's bound
    is the one measured for that model (jpwr.aliasing), else the conservative one.
    """
    t0, t1 = float(t0_ns), float(t1_ns)
    counter = counter.ordered() if counter is not None else None
    power = power.ordered() if power is not None else None
    warnings, faults = _ordering_notes([s for s in (counter, power) if s is not None])
    curve = PowerCurve(power, interval_s) if power is not None else None
    if curve is not None and not curve:
        curve = None
    update_s = counter.sensor.est_update_s if counter is not None else None
    segments: list[Knots] = []
    issues: list[CounterIssue] = []
    if counter is not None:
        segments, issues = counter_segments(counter, update_s)
    if counter is not None and segments:
        resolution = counter.sensor.resolution or 0.0
        env = Envelope(curve, p_max_w, _reach(segments, t0, t1))
        segments, more = plausible_segments(segments, env, resolution, t0, t1)
        issues += more
        result = counter_window(segments, curve, t0, t1, p_max_w, issues, env, resolution)
        text, found = _describe_issues(issues, counter.sensor.id, p_max_w, t0, t1)
        warnings += text
        faults += found
    elif curve is not None:
        result = power_window(curve, t0, t1, p_max_w)
    else:
        reason = "no energy counter or power readings"
        gaps = _describe_gaps(counter, power, None, [], t0, t1)
        errors = sorted({g.error for g in gaps if g.error})
        return DomainEnergy(energy_j=None, method=None, coverage=0.0, error_bound_j=None, warnings=warnings,
                            reason=reason + (f" ({', '.join(errors)})" if errors else ""), faults=faults + gaps)
    result.warnings = warnings + result.warnings
    failed = failed_reads_warning([x for x in (counter, power) if x is not None], t0_ns, t1_ns)
    if failed:
        result.warnings.append(failed)
    gaps = _describe_gaps(counter, power, curve, segments, t0, t1)
    result.faults = faults + gaps
    if result.energy_j is not None and result.coverage < 0.999:
        result.warnings.append(f"data cover {result.coverage:.1%} of the window; the rest is charged to the bound at "
                               f"{p_max_w:.4g} W: " + "; ".join(g.detail for g in gaps))
    sensor_period = update_s or (power.sensor.est_update_s if power is not None else None)
    bound = card_bound(card)
    alias = aliasing_warning((t1 - t0) / 1e9, steps, sensor_period, bound)
    if alias and result.energy_j is not None and result.error_bound_j is not None:
        # The loop aliases with the sensor: the power samples cannot arbitrate a disagreement with the counter.
        result.warnings.append(alias)
        counter_bound = result.counter_bound_j if result.counter_bound_j is not None else result.error_bound_j
        result.error_bound_j = max(counter_bound, bound.fraction * abs(result.energy_j))
    if result.energy_j is not None and not math.isfinite(result.energy_j):
        return DomainEnergy(energy_j=None, method=None, coverage=0.0, error_bound_j=None, warnings=result.warnings,
                            reason="non-finite energy", faults=result.faults)
    return result


def _ordering_notes(series: Sequence[SensorSeries]) -> tuple[list[str], list[Fault]]:
    """Say so when readings arrived out of time order or twice (they were ordered and deduplicated)."""
    warnings: list[str] = []
    faults: list[Fault] = []
    for s in series:
        if s.reordered or s.duplicates:
            text = (f"{s.sensor.id}: {s.reordered} readings arrived out of time order and {s.duplicates} were "
                    "repeats; ordered by time and deduplicated before integration")
            warnings.append(text)
            faults.append(fault("out_of_order", 0.0, 0.0, text))
    return warnings, faults
