"""What the node's accelerators read right now: recent power and temperature, and each sensor's update period.

Decisions taken before a window opens need them: how long the steady window must be for its bound
(the update period and the power), and whether an idle device has settled. The sampler answers from
the readings it already holds (no extra sensor reads), over the same channel as window energies, so an
external `jpwr serve` and an in-process sampler answer alike.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, TypedDict

from jpwr.domains import Domain, MetricReading, Reading, Sensor, Signal, Status


class DeviceLiveDict(TypedDict):
    """DeviceLive, field for field (NodeLive.to_dict)."""

    domain: str
    update_period_s: float | None
    power_w: float | None
    power_min_w: float | None
    power_max_w: float | None
    power_covered_s: float
    temperature_c: float | None
    temperature_min_c: float | None
    temperature_max_c: float | None


class NodeLiveDict(TypedDict, total=False):
    """NodeLive as the sampler answers a live query (NodeLive.to_dict; `node` missing where no sampler answered)."""

    node: str
    span_s: float
    reason: str | None
    devices: list[DeviceLiveDict]


@dataclasses.dataclass(frozen=True)
class DeviceLive:
    """One accelerator over the last `span_s` seconds."""

    domain: str
    update_period_s: float | None  # of the sensor energy is anchored on (counter, else power)
    power_w: float | None  # mean over the span
    power_min_w: float | None
    power_max_w: float | None
    power_covered_s: float  # time between the first and last power value used
    temperature_c: float | None  # latest
    temperature_min_c: float | None
    temperature_max_c: float | None

    def to_dict(self) -> DeviceLiveDict:
        return {"domain": self.domain, "update_period_s": self.update_period_s, "power_w": self.power_w,
                "power_min_w": self.power_min_w, "power_max_w": self.power_max_w,
                "power_covered_s": self.power_covered_s, "temperature_c": self.temperature_c,
                "temperature_min_c": self.temperature_min_c, "temperature_max_c": self.temperature_max_c}


@dataclasses.dataclass(frozen=True)
class NodeLive:
    """The node's accelerators; `reason` says why there are none."""

    node: str
    span_s: float
    devices: tuple[DeviceLive, ...]
    reason: str | None = None

    @property
    def update_period_s(self) -> float | None:
        """The slowest sensor's period: the one that limits every window's bound."""
        periods = [d.update_period_s for d in self.devices if d.update_period_s]
        return max(periods) if periods else None

    @property
    def power_w(self) -> float | None:
        return _sum_of_all([d.power_w for d in self.devices])

    @property
    def peak_power_w(self) -> float | None:
        return _sum_of_all([d.power_max_w for d in self.devices])

    def to_dict(self) -> NodeLiveDict:
        return {"node": self.node, "span_s": self.span_s, "reason": self.reason,
                "devices": [d.to_dict() for d in self.devices]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> NodeLive:
        return cls(str(data.get("node", "")), float(data.get("span_s", 0.0)),
                   tuple(DeviceLive(**d) for d in data.get("devices", ())), data.get("reason"))


def _sum_of_all(values: Sequence[float | None]) -> float | None:
    """The sum over every device, None when there are none or any one is unknown (a partial sum would mislead)."""
    known = [v for v in values if v is not None]
    return sum(known) if values and len(known) == len(values) else None


def _recent(readings: Sequence[Reading], since_ns: int) -> list[tuple[int, float]]:
    """(time, value) of the valid readings at or after since_ns (scanned from the end: the lists only grow)."""
    out = []
    for r in reversed(readings):
        if r.t_ns < since_ns:
            break
        if r.status is Status.OK and r.value is not None:
            out.append((r.t_ns, float(r.value)))
    return out[::-1]


def _power(sensor: Sensor | None, readings: list[tuple[int, float]]
           ) -> tuple[float | None, float | None, float | None, float]:
    """(mean, min, max, covered s) of power samples, or of the counter's slope when there is no power signal."""
    if sensor is None or not readings:
        return None, None, None, 0.0
    (t_first, first), (t_last, last) = readings[0], readings[-1]
    covered = (t_last - t_first) / 1e9
    if sensor.signal is Signal.ENERGY_COUNTER:
        if covered <= 0:
            return None, None, None, 0.0
        slope = (last - first) / covered
        return slope, slope, slope, covered
    values = [value for _, value in readings]
    return sum(values) / len(values), min(values), max(values), covered


def node_live(
    node: str,
    accelerators: Sequence[Domain],
    sensors: Sequence[Sensor],
    readings: Mapping[str, Sequence[Reading]],
    metrics: Sequence[MetricReading],
    now_ns: int,
    span_s: float,
) -> NodeLive:
    """Summarise the last `span_s` seconds of the sampler's readings per accelerator."""
    since = now_ns - int(span_s * 1e9)
    if not accelerators:
        return NodeLive(node, span_s, (), reason=f"no accelerator sensors on node {node}")
    temps: dict[str, list[float]] = {}
    for m in reversed(metrics):
        if m.t_ns < since:
            break
        if m.name == "temperature_c":
            temps.setdefault(m.domain_id, []).append(m.value)  # newest first
    devices = []
    for domain in accelerators:
        own = {s.signal: s for s in sensors if s.domain_id == domain.id}
        counter = own.get(Signal.ENERGY_COUNTER)
        power_sensor = own.get(Signal.POWER_INSTANT) or own.get(Signal.POWER_AVERAGE) or counter
        anchor = counter or power_sensor
        recent = _recent(readings.get(power_sensor.id, ()), since) if power_sensor else []
        mean, low, high, covered = _power(power_sensor, recent)
        t = temps.get(domain.id, [])
        devices.append(DeviceLive(
            domain.id, anchor.est_update_s if anchor else None, mean, low, high, covered,
            t[0] if t else None, min(t) if t else None, max(t) if t else None))
    return NodeLive(node, span_s, tuple(devices))
