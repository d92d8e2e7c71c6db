"""Energy per log interval, from the meter, logged a few log points late.

The loop's log points are already synced (the loss read-out), so each is an interval edge the sampler receives as
a mark (`WindowMeter.mark_interval`, no window in the record). An interval shorter than twice the sensor's update
period would have a bound as large as its energy: it is merged with the next (its edge is skipped); the last, with
no next, with the one before it (still unlogged: an interval is ready as late as the next one is long enough),
or it is n/a where it is the only one. An interval's energy is asked of the sampler at a later log point, once the
counter has updated past its end, so the query never waits for the sensor, and at most every 10 s, several
intervals in one round trip; the last ones when the loop ends (the last interval ends after the steady window:
the intervals cover every moment of the windows, a query's time included). The sampler answers for this node's
accelerators: on more than one node the per-interval figures cover global rank 0's node only (the facts say so) and
work per Wh is left out; the window figures at the end cover the whole job.
"""

from __future__ import annotations

import dataclasses

from joulebench.exports.run import Exports, labelled
from jpwr import WindowEnergy, WindowMeter
from jpwr.energy import J_PER_WH

PREFIX = WindowMeter.INTERVAL_PREFIX  # the sampler's name of a log interval: log/<its first step>

SETTLE_PERIODS = 2.0  # the sampler waits this many update periods past an edge before it reads a window
QUERY_EVERY_NS = 10 * 10**9  # ask the sampler at most this often: each answer costs the loop a round trip


@dataclasses.dataclass(frozen=True)
class Interval:
    name: str
    first_step: int
    last_step: int
    t0_ns: int
    t1_ns: int


class IntervalLog:
    """Global rank 0's log intervals: marked at log points, their energy logged when the sampler can answer."""

    def __init__(self, meter: WindowMeter, exports: Exports, work_unit: str, work_per_step: float,
                 devices: int) -> None:
        self.meter, self.exports = meter, exports
        self.work_unit, self.work_per_step, self.devices = work_unit, work_per_step, devices
        live = meter.live(1.0)
        period = live.update_period_s if live is not None else None
        self.min_ns = int(SETTLE_PERIODS * period * 1e9) if period else None
        self.open: tuple[int, int] | None = None  # (first step, begin ns)
        self.closed: list[Interval] = []
        self.methods: tuple[str, ...] = ()  # of the intervals logged so far
        self.domain: str | None = None  # the energy domain last logged as a fact
        self.asked_ns = 0  # when the sampler was last asked
        self.reason = "no jpwr sampler: energy per interval n/a" if live is None else (
            None if period else f"the sampler knows no sensor update period: {live.reason or 'no devices'}")
        scope = "n/a" if live is None else f"node {live.node}: {len(live.devices)} accelerator(s)"
        exports.facts({"interval/edges": "log points (after the loss read-out, synced), intervals shorter than "
                       f"{SETTLE_PERIODS:g} sensor update periods merged with the next",
                       "interval/update_period_s": "n/a" if period is None else f"{period:g}",
                       "interval/scope": scope, **({"interval/unavailable": self.reason} if self.reason else {})})

    def begin(self, step: int) -> None:
        """The first interval starts with the loop's first window."""
        if self.min_ns is not None:
            self.open = (step, self.meter.mark_interval(f"{PREFIX}{step}", "begin", step))

    def log_point(self, step: int, last: bool = False) -> None:
        """Close the open interval when it is long enough, open the next, and log the intervals the sampler can
        answer for now, at most every QUERY_EVERY_NS (all of them at the last point). A last interval too short
        is merged into the one before it while that one is unlogged, else it is n/a with that reason. The loop's last
        step gets the last call only (after its window ended), so the open interval always has steps."""
        if self.open is None or self.min_ns is None:
            return
        first, t0 = self.open
        long_enough = self.meter.clock.monotonic_ns() - t0 >= self.min_ns
        if long_enough or (last and not self.closed):
            if long_enough:
                self._close(Interval(f"{PREFIX}{first}", first, step, t0, 0))
            else:  # its begin stays unpaired: the sampler has no such interval
                self.exports.facts({"interval/unavailable": f"steps {first}-{step}: shorter than {SETTLE_PERIODS:g} "
                                    "sensor update periods, its bound as large as its energy: not logged"})
            self.open = None if last else (step, self.meter.mark_interval(f"{PREFIX}{step}", "begin", step))
        elif last:  # the previous interval, unlogged, ends here instead (the sampler takes a name's last end)
            self._close(dataclasses.replace(self.closed.pop(), last_step=step))
            self.open = None
        now = self.meter.clock.monotonic_ns()
        ready = [i for i in self.closed if last or now - i.t1_ns >= self.min_ns]
        if ready and (last or now - self.asked_ns >= QUERY_EVERY_NS):
            self.asked_ns = now
            self._log(ready)
            self.closed = [i for i in self.closed if i not in ready]

    def _close(self, interval: Interval) -> None:
        """Mark the interval's end (its name is its first step's: the sampler pairs by name)."""
        t1 = self.meter.mark_interval(interval.name, "end", interval.last_step)
        self.closed.append(dataclasses.replace(interval, t1_ns=t1))

    def _log(self, intervals: list[Interval]) -> None:
        energies = self.meter.node_energy([i.name for i in intervals])
        methods: set[str] = set()
        for interval in intervals:
            energy = energies.get(interval.name)
            values = self.figures(interval, energy) if energy is not None else {}
            if values:
                self.exports.series(interval.last_step, labelled(values, energy.domain))
                methods.add(str(energy.method))
                if energy.domain and energy.domain != self.domain:  # a fact changes rarely: logged when it does
                    self.domain = energy.domain
                    self.exports.facts({"interval/energy_domain": energy.domain})
            elif energy is not None and energy.unavailable_reason:
                self.exports.facts({"interval/unavailable": f"steps {interval.first_step}-{interval.last_step}: "
                                                            f"{energy.unavailable_reason}"})
        method = ",".join(sorted(methods | set(self.methods)))
        if methods and method != ",".join(self.methods):  # a fact changes rarely: logged when it does
            self.methods = tuple(sorted(methods | set(self.methods)))
            self.exports.facts({"interval/method": method})

    def figures(self, interval: Interval, energy: WindowEnergy) -> dict[str, float]:
        """An interval's figures, each with its bound (`<name>_error_bound`, from the energy's); n/a figures are
        left out (never logged as 0), so is work per Wh where the bound reaches zero energy (no finite bound)."""
        joules, bound = energy.energy_j, energy.error_bound_j
        if joules is None or bound is None:
            return {}
        seconds = (interval.t1_ns - interval.t0_ns) / 1e9
        steps = interval.last_step - interval.first_step
        values = {"interval/energy_j": joules, "interval/energy_error_bound_j": bound, "interval/seconds": seconds}
        per = {"interval/mean_power_w": seconds, "interval/energy_j_per_step": steps}
        if energy.devices == self.devices and steps > 0:  # the whole job's devices: work per energy
            work = steps * self.work_per_step
            per[f"interval/j_per_{self.work_unit.rstrip('s')}"] = work
            if joules > bound:  # work / energy is largest at the bound's low end
                values[f"interval/{self.work_unit}_per_wh"] = work * J_PER_WH / joules
                values[f"interval/{self.work_unit}_per_wh_error_bound"] = (work * J_PER_WH / (joules - bound)
                                                                           - work * J_PER_WH / joules)
        for name, divisor in per.items():
            if divisor > 0:
                values[name], values[f"{name}_error_bound"] = joules / divisor, bound / divisor
        return values
