"""Small helpers shared by the backends: "unavailable" lines, failed readings, sysfs reads."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from jpwr.clock import Clock
from jpwr.domains import MetricReading, Reading, Sensor, Status


def unavailable(backend: str, reason: str) -> str:
    """The one format every backend uses for something it cannot measure."""
    return f"{backend}: unavailable: {reason}"


def failed(sensor_id: str, t_before_ns: int, t_after_ns: int, status: Status = Status.ERROR,
           error: str | None = None) -> Reading:
    """A reading that did not produce a value: never 0 W, always None with a status (and the vendor's error name)."""
    return Reading(sensor_id, t_before_ns, t_after_ns, None, status, error=error)


def read_sysfs(path: Path) -> str:
    """One sysfs attribute, stripped. Raises OSError (incl. PermissionError) for the caller to classify."""
    with open(path, encoding="ascii", errors="replace") as fh:
        return fh.read().strip()


class SysfsMicroBackend:
    """Shared reading for backends whose sensors are sysfs files of integer micro-units (RAPL µJ, hwmon µW).

    Subclasses fill `_clock` and `_files` (sensor id -> attribute path) in their constructor/discover.
    """

    _clock: Clock
    _files: dict[str, Path]

    def read(self, sensors: Sequence[Sensor]) -> list[Reading]:
        readings = []
        for sensor in sensors:
            t0 = self._clock.monotonic_ns()
            try:
                value = int(read_sysfs(self._files[sensor.id])) / 1e6  # µJ -> J, µW -> W
            except (OSError, ValueError, KeyError):  # a vanished or unreadable node is an error reading, not a crash
                readings.append(failed(sensor.id, t0, self._clock.monotonic_ns()))
                continue
            readings.append(Reading(sensor.id, t0, self._clock.monotonic_ns(), value))
        return readings

    def read_metrics(self) -> list[MetricReading]:
        return []

    def close(self) -> None:
        self._files = {}
