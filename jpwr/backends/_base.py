"""Small helpers shared by the backends: "unavailable" lines, failed readings, sysfs reads."""

from __future__ import annotations

from pathlib import Path

from jpwr.domains import Reading, Status


def unavailable(backend: str, reason: str) -> str:
    """The one format every backend uses for something it cannot measure."""
    return f"{backend}: unavailable: {reason}"


def failed(sensor_id: str, t_before_ns: int, t_after_ns: int, status: Status = Status.ERROR) -> Reading:
    """A reading that did not produce a value: never 0 W, always None with a status."""
    return Reading(sensor_id, t_before_ns, t_after_ns, None, status)


def read_sysfs(path: Path) -> str:
    """One sysfs attribute, stripped. Raises OSError (incl. PermissionError) for the caller to classify."""
    with open(path, encoding="ascii", errors="replace") as fh:
        return fh.read().strip()
