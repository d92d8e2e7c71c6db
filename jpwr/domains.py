"""What a backend can measure: domains (physical things), their sensors (signals) and readings.

Every value crosses the backend edge in SI units (J, W, Hz, bytes, degrees C, fractions 0-1).
A sensor that is missing is described as unavailable with a reason; it is never read as 0.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Sequence
from typing import Protocol, runtime_checkable


class Kind(enum.StrEnum):
    """What a domain covers; totals add only accelerator kinds that do not overlap."""

    GPU = "gpu"
    PACKAGE = "package"  # a multi-die accelerator package (MI250: two GCDs, one sensor)
    MODULE = "module"  # Grace Hopper module: GPU + HBM + CPU + LPDDR + regulator loss
    IPU = "ipu"
    BOARD = "board"
    CPU_PACKAGE = "cpu_package"
    CPU_CORE = "cpu_core"
    DRAM = "dram"
    OTHER = "other"

    @property
    def is_accelerator(self) -> bool:
        return self in (Kind.GPU, Kind.PACKAGE, Kind.IPU)


class Signal(enum.StrEnum):
    ENERGY_COUNTER = "energy_counter"  # cumulative J; differences only
    POWER_INSTANT = "power_instant"  # W at (about) the read time
    POWER_AVERAGE = "power_average"  # W averaged over the trailing `avg_window_s`


class Status(enum.StrEnum):
    OK = "ok"
    UNSUPPORTED = "unsupported"
    ERROR = "error"
    STALE = "stale"


@dataclasses.dataclass(frozen=True)
class Domain:
    """One physical thing whose energy is reported: a GPU, a CPU package, a GH200 module..."""

    id: str  # stable and unique on the host, e.g. "nvml:GPU-3f1c..." (never a list position alone)
    backend: str
    kind: Kind
    name: str  # human model name, e.g. "NVIDIA H100 80GB HBM3"
    device_uuid: str | None = None
    pci_bus_id: str | None = None
    index: int | None = None  # the vendor library's index, recorded beside the UUID
    contains: tuple[str, ...] = ()  # domain ids fully inside this one (module ⊃ gpu, package ⊃ core)
    shared_with: tuple[str, ...] = ()  # ids (or labels) that share this sensor, e.g. MI250's second GCD
    attrs: tuple[tuple[str, str], ...] = ()  # static facts: power limit, driver, firmware...

    def to_dict(self) -> dict[str, object]:
        data = dataclasses.asdict(self)
        data["kind"] = self.kind.value
        data["attrs"] = dict(self.attrs)
        return data


@dataclasses.dataclass(frozen=True)
class Sensor:
    """One signal of one domain and what its values mean."""

    id: str  # f"{domain_id}/{signal}" (plus a scope suffix where a vendor has several)
    domain_id: str
    signal: Signal
    est_update_s: float | None = None  # how often the hardware refreshes the value
    avg_window_s: float | None = None  # for POWER_AVERAGE: the trailing averaging window
    resolution: float | None = None  # smallest step in SI units
    wrap_at: float | None = None  # counters: value (SI) at which the counter wraps to 0
    read_cost_s: float | None = None  # measured at start-up by the sampler

    def to_dict(self) -> dict[str, object]:
        data = dataclasses.asdict(self)
        data["signal"] = self.signal.value
        return data


@dataclasses.dataclass(frozen=True)
class Reading:
    """A sensor value stamped with monotonic time before and after the read (midpoint = sample time)."""

    sensor_id: str
    t_before_ns: int
    t_after_ns: int
    value: float | None  # SI; None unless status is OK
    status: Status = Status.OK
    hw_timestamp_ns: int | None = None  # the vendor's own stamp where it gives one (wall clock)
    error: str | None = None  # why a read failed, by the vendor's name (e.g. NVML_ERROR_GPU_IS_LOST)

    @property
    def t_ns(self) -> int:
        return (self.t_before_ns + self.t_after_ns) // 2


# Latent metrics recorded beside power. Units in the name's suffix.
METRIC_NAMES = (
    "utilization_gpu",  # fraction of time a kernel ran, 0-1
    "utilization_memory",  # fraction of time memory was read/written, 0-1
    "sm_clock_hz",
    "memory_clock_hz",
    "memory_used_bytes",
    "temperature_c",
    "throttle_reasons",  # vendor bit mask, see docs/jpwr.md
    "power_limit_w",
)


@dataclasses.dataclass(frozen=True)
class MetricReading:
    domain_id: str
    name: str  # one of METRIC_NAMES
    t_ns: int
    value: float


@dataclasses.dataclass
class Discovery:
    """What a backend found: usable domains and sensors, and why anything else is unavailable."""

    backend: str
    domains: list[Domain] = dataclasses.field(default_factory=list)
    sensors: list[Sensor] = dataclasses.field(default_factory=list)
    unavailable: list[str] = dataclasses.field(default_factory=list)  # "unavailable: <reason>" lines
    info: dict[str, str] = dataclasses.field(default_factory=dict)  # library/driver versions
    # Domain ids metered on a whole-node request although the job is not bound to them: never in a headline
    outside_job: list[str] = dataclasses.field(default_factory=list)

    @property
    def available(self) -> bool:
        return bool(self.sensors)


class Backend(Protocol):
    """A vendor backend. `discover` never raises; `read` never sleeps or blocks on purpose."""

    name: str

    def discover(self) -> Discovery: ...

    def read(self, sensors: Sequence[Sensor]) -> list[Reading]: ...

    def read_metrics(self) -> list[MetricReading]: ...

    def close(self) -> None: ...


@runtime_checkable
class WindowFollower(Protocol):
    """A backend whose readings depend on the run's windows (a replayed trace plays the segment that matches the
    window the run is in): the sampler tells it every window edge as it records it."""

    def follow_window(self, name: str, edge: str) -> None: ...
