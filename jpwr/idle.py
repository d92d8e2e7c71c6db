"""Cooldown before the first window: wait until the devices' power and temperature stop moving (bounded).

A device still hot or busy from a previous job draws more power and clocks differently; its idle
baseline and the first window would carry that. Settled means: over the last `hold_s` seconds the
power readings stay within a tolerance of their mean and the temperature within `temperature_c`.
The wait is bounded (`max_wait_s`); the record states whether the devices settled and after how long.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from jpwr.clock import SYSTEM_CLOCK, Clock
from jpwr.live import NodeLive


@dataclasses.dataclass(frozen=True)
class SettleRule:
    max_wait_s: float
    hold_s: float = 5.0  # the readings must have been steady this long
    power_fraction: float = 0.05  # power range within this fraction of the mean ...
    power_w: float = 10.0  # ... or within this many watts (idle GPUs jitter by a few W)
    temperature_c: float = 1.0  # temperature range over hold_s
    poll_s: float = 1.0


@dataclasses.dataclass(frozen=True)
class IdlePlan:
    """How the idle baseline is taken: settling, then an `idle` window of `seconds`."""

    settle: SettleRule
    seconds: float


# Accelerators: up to a minute of cooldown, five seconds of idle (50 updates of a 100 ms sensor).
ACCELERATOR_IDLE = IdlePlan(SettleRule(max_wait_s=60.0), seconds=5.0)
# CPU runs and tests: one look, half a second of idle; there is no device that needs to cool down.
CPU_IDLE = IdlePlan(SettleRule(max_wait_s=0.0, hold_s=0.5, poll_s=0.1), seconds=0.5)


@dataclasses.dataclass(frozen=True)
class SettleResult:
    settled: bool
    waited_s: float
    note: str


def unsettled(live: NodeLive, rule: SettleRule) -> str | None:
    """Why the node is not settled yet (None when it is): the first device still moving, and how."""
    if not live.devices:
        return live.reason or "no accelerator readings"
    for d in live.devices:
        if d.power_w is None or d.power_covered_s < 0.8 * rule.hold_s:
            return f"{d.domain}: only {d.power_covered_s:.1f} s of power readings (need {0.8 * rule.hold_s:.1f} s)"
        spread = (d.power_max_w or 0.0) - (d.power_min_w or 0.0)
        allowed = max(rule.power_fraction * d.power_w, rule.power_w)
        if spread > allowed:
            return f"{d.domain}: power moved {spread:.1f} W in {rule.hold_s:g} s (allowed {allowed:.1f} W)"
        if d.temperature_min_c is not None and d.temperature_max_c is not None:
            drift = d.temperature_max_c - d.temperature_min_c
            if drift > rule.temperature_c:
                return f"{d.domain}: temperature moved {drift:.1f} °C in {rule.hold_s:g} s"
    return None


def wait_until_settled(
    live: Callable[[float], NodeLive], rule: SettleRule, clock: Clock = SYSTEM_CLOCK,
    stop: Callable[[], str | None] = lambda: None,
) -> SettleResult:
    """Poll the sampler's live readings until settled or `max_wait_s` has passed (at least one look); `stop`: the
    run's stop request, which ends the wait at the next poll (a stopping run does not cool down for a minute)."""
    start = clock.monotonic_ns()
    while True:
        snapshot = live(rule.hold_s)
        waited = (clock.monotonic_ns() - start) / 1e9
        why = unsettled(snapshot, rule)
        if why is None:
            powers = ", ".join(f"{d.power_w:.1f} W" for d in snapshot.devices)
            temps = [d.temperature_c for d in snapshot.devices if d.temperature_c is not None]
            temp_text = f", {', '.join(f'{t:.0f} °C' for t in temps)}" if temps else ""
            return SettleResult(True, waited, f"settled after {waited:.1f} s: {powers}{temp_text}")
        if waited >= rule.max_wait_s:
            return SettleResult(False, waited, f"not settled within {rule.max_wait_s:g} s: {why}")
        stopping = stop()
        if stopping:
            return SettleResult(False, waited, f"not waited for further ({stopping}): {why}")
        clock.sleep_until_ns(clock.monotonic_ns() + int(rule.poll_s * 1e9))
