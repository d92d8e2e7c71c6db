"""public: for judging what else ran on the job's GPUs (joulebench.disturbed).

What else happens on the metered GPUs: the processes holding a context on them and why their clocks are held
down (NVML's clock event reasons, formerly "throttle reasons"). Facts only, read-only (no NVML set call); the
judgement of whether a run was disturbed lives with the benchmarks (joulebench.disturbed).

PIDs are NVML's. Inside a container with its own PID namespace NVML may report PIDs of the host's namespace (or
none at all): such a PID has no /proc entry here, its name is unknown and it cannot be told apart from our own
processes by number; `ProcessFacts.visible` says so.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from jpwr.clock import SYSTEM_CLOCK
from jpwr.selectors import job_devices

__all__ = ["DeviceState", "DeviceStateProbe", "ProcessFacts", "process_facts", "reason_names"]

if TYPE_CHECKING:
    from jpwr.backends.nvml import NvmlBackend

# NVML's clocksEventReason bits (nvml.h); names without the prefix.
CLOCK_EVENT_REASONS = {
    0x1: "gpu_idle", 0x2: "applications_clocks_setting", 0x4: "sw_power_cap", 0x8: "hw_slowdown",
    0x10: "sync_boost", 0x20: "sw_thermal_slowdown", 0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown", 0x100: "display_clock_setting",
}


@dataclasses.dataclass(frozen=True)
class DeviceState:
    """One GPU at one moment: its clock event reason mask and its processes (pid -> used bytes or None)."""

    domain_id: str
    reasons: int | None
    processes: Mapping[int, int | None] | None
    unavailable: str | None = None  # what could not be read, and NVML's error


@dataclasses.dataclass(frozen=True)
class ProcessFacts:
    """A PID as this host's /proc shows it: its name and its parents (nearest first), to tell our own apart."""

    pid: int
    comm: str | None
    ancestors: tuple[int, ...]

    @property
    def visible(self) -> bool:
        return self.comm is not None


def reason_names(mask: int) -> list[str]:
    """The names of the bits set in a clock event reason mask."""
    return [name for bit, name in CLOCK_EVENT_REASONS.items() if mask & bit]


def process_facts(pid: int, proc: Path = Path("/proc")) -> ProcessFacts:
    """Name and ancestry of `pid`; comm None when the PID is not visible here (exited, another PID namespace)."""
    try:
        comm = (proc / str(pid) / "comm").read_text().strip()
    except OSError:
        return ProcessFacts(pid, None, ())
    ancestors: list[int] = []
    current = pid
    while current > 1 and len(ancestors) < 64:
        current = _parent(proc, current)
        if current <= 0:
            break
        ancestors.append(current)
    return ProcessFacts(pid, comm, tuple(ancestors))


def _parent(proc: Path, pid: int) -> int:
    try:
        stat = (proc / str(pid) / "stat").read_text()
    except OSError:
        return 0
    return int(stat.rsplit(")", 1)[1].split()[1])  # "pid (comm) state ppid ...": comm may hold spaces


class DeviceStateProbe:
    """The job's GPUs on this node (the sampler's device selection), read on demand."""

    def __init__(self, backend: NvmlBackend | None, unavailable_reason: str | None) -> None:
        self._backend = backend
        self.unavailable_reason = unavailable_reason

    @classmethod
    def open(cls, env: Mapping[str, str] | None = None) -> DeviceStateProbe:
        """NVML on the job's devices; without NVML or GPUs the probe reads nothing and says why."""
        from jpwr.backends.nvml import NvmlBackend

        backend = NvmlBackend(SYSTEM_CLOCK, job_devices("nvidia", env).selector_list)
        discovery = backend.discover()
        if not discovery.domains:
            backend.close()
            return cls(None, "; ".join(discovery.unavailable) or "no NVIDIA GPU selected")
        return cls(backend, None)

    def sample(self) -> list[DeviceState]:
        """Every GPU's state now; [] when the probe is unavailable."""
        return self._backend.device_state() if self._backend is not None else []

    def close(self) -> None:
        if self._backend is not None:
            self._backend.close()
            self._backend = None
