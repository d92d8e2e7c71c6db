"""Graphcore IPUs through the Poplar SDK's `gcipuinfo` module.

* gcipuinfo returns the attributes captured at construction unless `updateData()` is called (or update mode
  is on); jpwr 0.0.10's sampler therefore could record a constant. We call `updateData()` before every read.
* Readings are keyed by board serial number + board IPU index (or the device id where no serial is given),
  never by list position, so an "N/A" on one IPU stays unsupported for that IPU and never shifts another
  IPU's value into its place (jpwr 0.0.10 dropped "N/A" entries and then indexed by position).
* `ipu power` strings look like "123.45W" (or "N/A" on e.g. C600 boards); `total board power` ("12.6 W")
  becomes a BOARD domain that `contains` its IPUs. No energy counter: power is integrated by the estimator.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from jpwr.backends._base import failed, unavailable
from jpwr.clock import Clock
from jpwr.domains import Discovery, Domain, Kind, MetricReading, Reading, Sensor, Signal, Status

NAME = "gcipuinfo"
IPU_POWER = "ipu power"
BOARD_POWER = "total board power"
_QUANTITY = re.compile(r"^\s*([-+]?\d+(?:\.\d+)?)\s*([A-Za-z%]*)\s*$")
_METRICS = {"ipu utilisation": ("utilization_gpu", 0.01), "clock": ("sm_clock_hz", 1e6),
            "average die temp": ("temperature_c", 1.0)}


def parse_quantity(text: Any) -> float | None:
    """'123.45W', '12.6 W', '1300MHz', '99.96%' -> the number; 'N/A' or anything else -> None."""
    match = _QUANTITY.match(str(text))
    return float(match.group(1)) if match else None


def _ipu_key(device: dict[str, str]) -> str:
    serial = device.get("board serial number", "")
    if serial and serial != "N/A" and "board ipu index" in device:
        return f"{serial}:{device['board ipu index']}"
    return f"id{device.get('id', '?')}"


class GcIpuInfoBackend:
    name = NAME

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._info: Any = None
        self._sources: dict[str, tuple[str, str]] = {}  # sensor id -> (device key, attribute)
        self._ipu_domains: dict[str, str] = {}  # device key -> domain id

    def discover(self) -> Discovery:
        disc = Discovery(NAME)
        try:
            import gcipuinfo
        except ImportError:
            disc.unavailable.append(unavailable(NAME, "gcipuinfo not installed (ships with the Poplar SDK)"))
            return disc
        try:
            self._info = gcipuinfo.gcipuinfo()
            self._info.updateData()
            devices = [d for d in self._info.getDevices() if "board ipu index" in d]  # single IPUs, not groups
        except Exception as exc:  # the C++ bindings raise RuntimeError and others; discovery must not
            disc.unavailable.append(unavailable(NAME, f"gcipuinfo query failed: {exc!r}"))
            return disc
        boards: dict[str, list[str]] = {}
        self._sources, self._ipu_domains = {}, {}
        for device in devices:
            key = _ipu_key(device)
            serial = device.get("board serial number", "")
            domain = Domain(f"{NAME}:{key}", NAME, Kind.IPU, device.get("board type", "IPU"), device_uuid=serial,
                            pci_bus_id=device.get("pci id"), index=int(device["id"]) if device.get("id", "").isdigit()
                            else None, attrs=(("board_ipu_index", device["board ipu index"]),))
            self._ipu_domains[key] = domain.id
            disc.domains.append(domain)
            if IPU_POWER in device:
                self._add_sensor(disc, domain.id, key, IPU_POWER)
            else:
                disc.unavailable.append(unavailable(NAME, f"{domain.id}: no '{IPU_POWER}' attribute"))
            if BOARD_POWER in device and serial and serial != "N/A":
                boards.setdefault(serial, []).append(domain.id)
                if len(boards[serial]) == 1:
                    board_id = f"{NAME}:board:{serial}"
                    self._add_sensor(disc, board_id, key, BOARD_POWER)
        for serial, ipus in boards.items():
            disc.domains.append(Domain(f"{NAME}:board:{serial}", NAME, Kind.BOARD, "IPU board", device_uuid=serial,
                                       contains=tuple(ipus)))
        if not devices:
            disc.unavailable.append(unavailable(NAME, "no IPUs found"))
        return disc

    def _add_sensor(self, disc: Discovery, domain_id: str, key: str, attribute: str) -> None:
        sensor = Sensor(f"{domain_id}/power_instant", domain_id, Signal.POWER_INSTANT)
        self._sources[sensor.id] = (key, attribute)
        disc.sensors.append(sensor)

    def _fresh_devices(self) -> tuple[dict[str, dict[str, str]] | None, int, int]:
        """updateData() then getDevices(), keyed by board serial + IPU index; None if the update failed."""
        t0 = self._clock.monotonic_ns()
        try:
            updated = self._info is not None and self._info.updateData() is not False
            devices = {_ipu_key(d): d for d in self._info.getDevices()} if updated else None
        except Exception:  # see discover()
            devices = None
        return devices, t0, self._clock.monotonic_ns()

    def read(self, sensors: Sequence[Sensor]) -> list[Reading]:
        devices, t0, t1 = self._fresh_devices()
        readings = []
        for sensor in sensors:
            key, attribute = self._sources.get(sensor.id, ("", ""))
            if devices is None:
                readings.append(failed(sensor.id, t0, t1, Status.STALE))  # values would be the old snapshot
            elif key not in devices:
                readings.append(failed(sensor.id, t0, t1))
            elif (value := parse_quantity(devices[key].get(attribute))) is None:
                readings.append(failed(sensor.id, t0, t1, Status.UNSUPPORTED))  # "N/A" for THIS device only
            else:
                readings.append(Reading(sensor.id, t0, t1, value))
        return readings

    def read_metrics(self) -> list[MetricReading]:
        devices, t0, t1 = self._fresh_devices()
        metrics = []
        for key, domain_id in self._ipu_domains.items():
            for attribute, (metric, scale) in _METRICS.items():
                value = parse_quantity((devices or {}).get(key, {}).get(attribute))
                if value is not None:
                    metrics.append(MetricReading(domain_id, metric, (t0 + t1) // 2, value * scale))
        return metrics

    def close(self) -> None:
        self._info = None
        self._sources = {}
        self._ipu_domains = {}
