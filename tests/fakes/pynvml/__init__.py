"""Fake `pynvml` (nvidia-ml-py) that replays a real NVML trace recorded on an H100 SXM.

A hardware-boundary fake: jpwr's nvml backend imports this instead of nvidia-ml-py when tests/fakes is first
on sys.path, and runs exactly the code it runs on a real GPU. Names, constants, error codes, NVMLError
subclasses and the field-value struct follow nvidia-ml-py.

Replay. `configure(trace_dir, clock)` loads tests/data/h100_trace (trace.csv.gz + meta.json). The query time
is trace-relative: rel = clock.monotonic_ns() - origin_ns (origin = the clock's time at configure unless
given). Each call returns the last value the recorder had obtained at or before rel: a row counts from its
"after" stamp (counter_t_after_ns for the energy counter, fields_t_after_ns for POWER_INSTANT/POWER_AVERAGE,
usage_t_after_ns for GetPowerUsage, SM clock and utilisation); before the first row the first row is used.
Past the end the trace loops, the counter continuing upward. Several devices are copies with distinct UUIDs
and PCI bus ids. Values not in the trace are fixed, documented stand-ins (`SYNTHETIC`).

Device settings (device_state.py has the details): nvmlDeviceSetPowerManagementLimit, nvmlDeviceSetGpuLockedClocks and
nvmlDeviceResetGpuLockedClocks change a per-device state that the readers (power limit, clocks, power, the energy
counter) follow through a documented clock response; they need a privileged caller, and every call is logged.
Read-only companions: the limit's constraints and default, supported and maximum clocks, persistence mode and the
API restriction; their values are SYNTHETIC stand-ins.

Other jobs on a device (joulebench.disturbed): configure's overrides plant running processes (pid -> used bytes,
listed by nvmlDeviceGetComputeRunningProcesses; no graphics processes) and clock event reason bits held throughout.

Subprocesses: with JPWR_FAKE_NVML_TRACE=<dir> set at import, the fake configures itself on real
time.monotonic_ns() (origin JPWR_FAKE_NVML_ORIGIN_NS, default: import time), JPWR_FAKE_NVML_DEVICES=N copies,
JPWR_FAKE_NVML_FAULTS=<json of Faults fields, or {"per_device": {index: Faults fields}}>,
JPWR_FAKE_NVML_INIT_ERROR=<NVML error code>, JPWR_FAKE_NVML_CALL_COSTS=1 (calls take as long as on the H100),
JPWR_FAKE_NVML_STATE=<file> (device settings shared between processes), JPWR_FAKE_NVML_PRIVILEGED=1 (set/reset calls
are permitted), JPWR_FAKE_NVML_CLOCK_RESPONSE=<json of ClockResponse fields>, JPWR_FAKE_NVML_NVLINK=N (active NVLink
links per GPU; 0, the default: a PCIe GPU).
Unconfigured, it behaves like a machine without the NVIDIA driver: nvmlInit raises NVMLError_LibraryNotFound.
"""

from __future__ import annotations

import bisect
import csv
import ctypes
import dataclasses
import gzip
import json
import os
import string
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .device_state import ClockResponse, PhaseResponse, ScaledTrace, Settings, StateStore, state_path_from

__all__ = ["ClockResponse", "PhaseResponse", "Settings"]  # re-exported for tests that configure the response

# ---- constants (same names and values as nvidia-ml-py) ----------------------------------------------
NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_NO_DATA = 21
NVML_ERROR_UNKNOWN = 999

NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION = 83
NVML_FI_DEV_POWER_AVERAGE = 185
NVML_FI_DEV_POWER_INSTANT = 186
NVML_POWER_SCOPE_GPU = 0
NVML_POWER_SCOPE_MODULE = 1
NVML_POWER_SCOPE_MEMORY = 2

NVML_VALUE_TYPE_DOUBLE = 0
NVML_VALUE_TYPE_UNSIGNED_INT = 1
NVML_VALUE_TYPE_UNSIGNED_LONG = 2
NVML_VALUE_TYPE_UNSIGNED_LONG_LONG = 3

NVML_CLOCK_GRAPHICS = 0
NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2
NVML_TEMPERATURE_GPU = 0
NVML_DEVICE_ARCH_VOLTA = 5
NVML_DEVICE_ARCH_AMPERE = 7
NVML_DEVICE_ARCH_HOPPER = 9
NVML_DEVICE_MIG_DISABLE = 0
NVML_DEVICE_MIG_ENABLE = 1
NVML_FEATURE_DISABLED = 0
NVML_FEATURE_ENABLED = 1
NVML_RESTRICTED_API_SET_APPLICATION_CLOCKS = 0
NVML_RESTRICTED_API_SET_AUTO_BOOSTED_CLOCKS = 1
nvmlClocksEventReasonApplicationsClocksSetting = 0x2
nvmlClocksEventReasonSwPowerCap = 0x4

# Values the trace does not hold; fixed stand-ins so metric code paths run (not measurements).
SYNTHETIC = {"memory_clock_MHz": 2619, "temperature_C": 40, "memory_used_bytes": 0, "util_memory_pct": 0,
             "clocks_event_reasons": 0, "power_limit_min_mW": 200_000, "sm_clocks_MHz": list(range(1980, 344, -15)),
             "persistence_mode": NVML_FEATURE_ENABLED, "api_restricted": NVML_FEATURE_ENABLED}

_ERROR_STRINGS = {
    NVML_ERROR_UNINITIALIZED: "Uninitialized",
    NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
    NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
    NVML_ERROR_NOT_FOUND: "Not Found",
    NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
    NVML_ERROR_TIMEOUT: "Timeout",
    NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
    NVML_ERROR_FUNCTION_NOT_FOUND: "Function Not Found",
    NVML_ERROR_GPU_IS_LOST: "GPU is lost",
    NVML_ERROR_NO_DATA: "No Data",
    NVML_ERROR_UNKNOWN: "Unknown Error",
}


class NVMLError(Exception):
    """Like nvidia-ml-py: NVMLError(code) returns the code's subclass (e.g. NVMLError_NotSupported)."""

    _valClassMapping: dict[int, type] = {}  # noqa: RUF012 (nvidia-ml-py's name)

    def __new__(cls, value: int) -> NVMLError:
        if cls is NVMLError:
            cls = NVMLError._valClassMapping.get(value, cls)
        obj = Exception.__new__(cls)
        obj.value = value
        return obj

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return _ERROR_STRINGS.get(self.value, f"NVML Error with code {self.value}")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, NVMLError) and self.value == other.value

    __hash__ = Exception.__hash__


def _make_error_classes() -> None:
    module = sys.modules[__name__]
    for name in [n for n in dir(module) if n.startswith("NVML_ERROR_")]:
        cls_name = "NVMLError_" + string.capwords(name.replace("NVML_ERROR_", ""), "_").replace("_", "")
        code = getattr(module, name)
        cls = type(cls_name, (NVMLError,), {"__new__": lambda typ, *args, _code=code: NVMLError.__new__(typ, _code)})
        setattr(module, cls_name, cls)
        NVMLError._valClassMapping[code] = cls


_make_error_classes()


def nvmlErrorString(result: int) -> str:
    return _ERROR_STRINGS.get(result, "Unknown Error")


# ---- structs (layout as nvidia-ml-py) ---------------------------------------------------------------
class c_nvmlValue_t(ctypes.Union):
    _fields_ = [("dVal", ctypes.c_double), ("uiVal", ctypes.c_uint), ("ulVal", ctypes.c_ulong),
                ("ullVal", ctypes.c_ulonglong), ("sllVal", ctypes.c_longlong), ("siVal", ctypes.c_int),
                ("usVal", ctypes.c_ushort)]


class c_nvmlFieldValue_t(ctypes.Structure):
    _fields_ = [("fieldId", ctypes.c_uint32), ("scopeId", ctypes.c_uint32), ("timestamp", ctypes.c_int64),
                ("latencyUsec", ctypes.c_int64), ("valueType", ctypes.c_uint), ("nvmlReturn", ctypes.c_uint),
                ("value", c_nvmlValue_t)]


class c_nvmlUtilization_t(ctypes.Structure):
    _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]


class c_nvmlMemory_t(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


@dataclasses.dataclass(frozen=True)
class c_nvmlPciInfo_t:
    busId: str


@dataclasses.dataclass(frozen=True)
class c_nvmlProcessInfo_t:
    """A running process as nvidia-ml-py's wrappers return it (usedGpuMemory None where NVML does not know it)."""

    pid: int
    usedGpuMemory: int | None
    gpuInstanceId: int = 0xFFFFFFFF
    computeInstanceId: int = 0xFFFFFFFF


# ---- trace and faults --------------------------------------------------------------------------------
class Trace:
    """The recorded columns, as three time-sorted series keyed by each read's 'after' stamp."""

    def __init__(self, trace_dir: str | Path) -> None:
        trace_dir = Path(trace_dir)
        self.meta = json.loads((trace_dir / "meta.json").read_text())
        with gzip.open(trace_dir / "trace.csv.gz", "rt", newline="") as fh:
            rows = [{k: int(v) for k, v in row.items()} for row in csv.DictReader(fh)]
        self.rows = rows
        self.t_start_ns = int(self.meta["t_start_ns"])
        self.counter_t = [r["counter_t_after_ns"] for r in rows]
        self.fields_t = [r["fields_t_after_ns"] for r in rows]
        self.usage_t = [r["usage_t_after_ns"] for r in rows]
        self.duration_ns = max(self.counter_t[-1], self.fields_t[-1], self.usage_t[-1]) - self.t_start_ns
        self.loop_energy_mj = rows[-1]["energy_mJ"] - rows[0]["energy_mJ"]
        # phase marks as trace-relative ns: [(name, "begin"/"end", rel_ns), ...]
        self.marks = [(name, edge, int(t) - self.t_start_ns) for name, edge, t in self.meta["marks"]]

    def index(self, series: list[int], rel_ns: int) -> tuple[int, int]:
        """Index of the last row recorded at or before rel_ns (looping), and how many loops have passed."""
        loops, within = divmod(max(rel_ns, 0), self.duration_ns)
        return max(bisect.bisect_right(series, self.t_start_ns + within) - 1, 0), loops

    def row(self, series: list[int], rel_ns: int) -> tuple[dict[str, int], int]:
        """The last row recorded at or before rel_ns (looping), and how many loops have passed."""
        index, loops = self.index(series, rel_ns)
        return self.rows[index], loops

    def energy_mj(self, rel_ns: int) -> int:
        """The counter value the real GPU reported at rel_ns (no faults): the replay's ground truth."""
        row, loops = self.row(self.counter_t, rel_ns)
        return row["energy_mJ"] + loops * self.loop_energy_mj


@dataclasses.dataclass(frozen=True)
class Fail:
    """Make one call fail: target = pynvml function name, or 'field:<id>' / 'field:<id>:<scope>' for a field
    inside nvmlDeviceGetFieldValues (its nvmlReturn is set; the call itself succeeds, as on real GPUs)."""

    target: str
    code: int = NVML_ERROR_NOT_SUPPORTED
    from_ns: int = 0  # trace-relative
    until_ns: int | None = None

    def active(self, target: str, rel_ns: int) -> bool:
        hit = target == self.target or (target.count(":") == 2 and target.rsplit(":", 1)[0] == self.target)
        return hit and self.from_ns <= rel_ns and (self.until_ns is None or rel_ns < self.until_ns)


@dataclasses.dataclass(frozen=True)
class Faults:
    fails: tuple[Fail, ...] = ()
    counter_steps: tuple[tuple[int, int], ...] = ()  # (from rel ns, mJ added from then on; < 0: backward jump)
    counter_reset_at_ns: int | None = None  # the counter restarts at 0 here (driver reload)
    counter_wrap_mj: int | None = None  # the counter is reported modulo this
    slow_ms: Mapping[str, float] = dataclasses.field(default_factory=dict)  # function -> ms spent inside it
    lost_at_ns: int | None = None  # from here every call on the device raises NVML_ERROR_GPU_IS_LOST (fell off the bus)

    @classmethod
    def from_json(cls, text: str) -> Faults | dict[int, Faults]:
        """Faults for every device, or {"per_device": {index: faults}} for some devices only."""
        data = json.loads(text)
        if "per_device" in data:
            return {int(index): cls._one(f) for index, f in data["per_device"].items()}
        return cls._one(data)

    @classmethod
    def _one(cls, data: dict[str, Any]) -> Faults:
        data = dict(data)
        data["fails"] = tuple(Fail(**f) for f in data.get("fails", ()))
        data["counter_steps"] = tuple(tuple(s) for s in data.get("counter_steps", ()))
        return cls(**data)


@dataclasses.dataclass
class _Device:
    index: int
    uuid: str
    pci_bus_id: str
    name: str
    architecture: int
    faults: Faults
    mig_uuids: tuple[str, ...] = ()
    processes: Mapping[int, int | None] = dataclasses.field(default_factory=dict)  # pid -> used bytes (None: n/a)
    event_reasons: int = 0  # clock event reason bits held on top of the recording's (e.g. 0x40 HW thermal)


@dataclasses.dataclass(frozen=True)
class _Handle:
    index: int
    mig_uuid: str | None = None


class _RealClock:
    def monotonic_ns(self) -> int:
        return time.monotonic_ns()


class Replay:
    """The configured fake: the trace, the devices, the clock, and helpers for tests."""

    def __init__(self, trace: Trace, clock: Any, origin_ns: int, devices: list[_Device], init_error: int | None,
                 call_costs: bool = False, store: StateStore | None = None, privileged: bool = False,
                 response: ClockResponse | None = None) -> None:
        self.trace, self.clock, self.origin_ns, self.devices, self.init_error = (
            trace, clock, origin_ns, devices, init_error)
        limit = int(trace.meta["power_limit_mW"])
        self.store = store or StateStore(None, {dev.uuid: limit for dev in devices})
        self.privileged = privileged
        self.scaled = ScaledTrace(trace, response or ClockResponse())
        # per-call cost measured on the H100 before recording (meta call_cost_s), if emulated
        measured = trace.meta.get("call_cost_s", {}) if call_costs else {}
        self.call_cost_ms = {function: measured[key] * 1000 for key, function in _COST_KEYS.items() if key in measured}
        self.initialized = 0
        self.lock = threading.Lock()
        self.nvlink_links = 0  # active NVLink links per GPU (configure's nvlink_links)

    def rel_ns(self) -> int:
        return self.clock.monotonic_ns() - self.origin_ns

    def clock_ns(self, rel_ns: int) -> int:
        """Trace-relative time -> the configured clock's time (e.g. to place window marks on the trace)."""
        return self.origin_ns + rel_ns

    def marks_ns(self) -> list[tuple[str, str, int]]:
        """The recorded phase marks on the configured clock."""
        return [(name, edge, self.clock_ns(rel)) for name, edge, rel in self.trace.marks]

    def settings(self, index: int) -> Settings:
        """Device `index`'s current power limit and locked clocks."""
        return self.store.settings(self.devices[index].uuid)

    def energy_mj(self, dev: _Device, rel_ns: int) -> float:
        """The counter without faults: the recording's, or integrated over the device's settings history."""
        history = self.store.history(dev.uuid)
        if not history:
            return self.trace.energy_mj(rel_ns)
        edges = [(t - self.origin_ns, settings) for t, settings in history]
        total = self.scaled.energy_mj(min(rel_ns, edges[0][0]), self.store.defaults(dev.uuid))
        for k, (start, settings) in enumerate(edges):
            if rel_ns <= start:
                break
            end = min(edges[k + 1][0], rel_ns) if k + 1 < len(edges) else rel_ns
            total += self.scaled.energy_mj(end, settings) - self.scaled.energy_mj(start, settings)
        return total

    def phase_time_factor(self, phase: str, index: int = 0) -> float:
        """How much longer `phase` takes under device `index`'s current settings than in the recording (the clock
        response's time model; the fake cannot slow its caller, the caller applies the factor)."""
        rows = self.scaled.phase_rows(phase)
        if not rows:
            raise ValueError(f"phase {phase!r} is not marked in the trace ({sorted(set(self.scaled.row_phase))})")
        settings = self.settings(index)
        recorded = sum(self.trace.rows[i]["sm_clock_MHz"] for i in rows)
        running = sum(self.scaled.row_point(i, settings, self.trace.rows[i]["power_usage_mW"])[0] for i in rows)
        share = self.scaled.response.phase(phase).compute_fraction
        return (1 - share) + share * recorded / running


_replay: Replay | None = None
_COST_KEYS = {"counter": "nvmlDeviceGetTotalEnergyConsumption", "power_usage": "nvmlDeviceGetPowerUsage",
              "fields": "nvmlDeviceGetFieldValues", "clock": "nvmlDeviceGetClockInfo",
              "utilization": "nvmlDeviceGetUtilizationRates"}


def _uuid_copy(uuid: str, i: int) -> str:
    return uuid if i == 0 else f"{uuid[:-4]}{(int(uuid[-4:], 16) + i) & 0xFFFF:04x}"


def _pci_copy(bus_id: str, i: int) -> str:
    domain_bus, dev_fn = bus_id.rsplit(":", 1)
    dev, fn = dev_fn.split(".")
    return f"{domain_bus}:{int(dev, 16) + i:02x}.{fn}"


def configure(
    trace_dir: str | Path,
    clock: Any = None,
    devices: int = 1,
    faults: Faults | Mapping[int, Faults] | None = None,
    overrides: Mapping[int, Mapping[str, Any]] | None = None,
    init_error: int | None = None,
    origin_ns: int | None = None,
    call_costs: bool = False,
    state_file: str | Path | None = None,
    privileged: bool = False,
    clock_response: ClockResponse | None = None,
    nvlink_links: int = 0,
) -> Replay:
    """Replay `trace_dir` as `devices` GPUs on `clock` (a jpwr VirtualClock; None = real monotonic time).

    faults: for all devices, or per device index. overrides: per device index, any of name, uuid,
    pci_bus_id, architecture, mig_uuids (MIG instance ids that resolve to this GPU), processes (pid -> used bytes
    or None: what the running-process calls list) and event_reasons (clock event bits held throughout).
    call_costs: each call takes as long as it did on the H100 (meta call_cost_s; the counter ~3.6 ms), on
    top of any Faults.slow_ms. state_file: device settings shared with other processes ("{node}" = node name);
    None keeps them in memory. privileged: set/reset calls are permitted. clock_response: how power, clock and
    phase times follow the settings (device_state.py). nvlink_links: active NVLink links per GPU (0: a PCIe GPU,
    whose nvmlDeviceGetNvLinkState raises NOT_SUPPORTED, as NVML does on cards without NVLink).
    """
    global _replay
    trace = Trace(trace_dir)
    clock = clock or _RealClock()
    meta = trace.meta
    devs = []
    for i in range(devices):
        f = faults.get(i, Faults()) if isinstance(faults, Mapping) else (faults or Faults())
        dev = _Device(i, _uuid_copy(meta["uuid"], i), _pci_copy(meta["pci_bus_id"], i), meta["name"],
                      NVML_DEVICE_ARCH_HOPPER, f)
        for key, value in (overrides or {}).get(i, {}).items():
            setattr(dev, key, tuple(value) if key == "mig_uuids" else value)
        devs.append(dev)
    origin = clock.monotonic_ns() if origin_ns is None else origin_ns
    limits = {dev.uuid: int(meta["power_limit_mW"]) for dev in devs}
    store = StateStore(None if state_file is None else state_path_from(str(state_file)), limits)
    _replay = Replay(trace, clock, origin, devs, init_error, call_costs, store, privileged, clock_response)
    _replay.nvlink_links = nvlink_links
    return _replay


def reset() -> None:
    """Back to 'no driver' (tests call this after each use)."""
    global _replay
    _replay = None


# ---- helpers behind the API ----------------------------------------------------------------------------
def _state(initialized: bool = True) -> Replay:
    if _replay is None:
        raise NVMLError(NVML_ERROR_LIBRARY_NOT_FOUND)
    if initialized and _replay.initialized <= 0:
        raise NVMLError(NVML_ERROR_UNINITIALIZED)
    return _replay


def _device(handle: _Handle, function: str) -> tuple[Replay, _Device, int]:
    """Run the fault plan for `function` on this device and return (replay, device, rel time)."""
    replay = _state()
    dev = replay.devices[handle.index]
    delay = dev.faults.slow_ms.get(function, 0.0) + replay.call_cost_ms.get(function, 0.0)
    if delay:
        if hasattr(replay.clock, "advance_ns"):
            replay.clock.advance_ns(int(delay * 1e6))
        else:
            time.sleep(delay / 1000)
    rel = replay.rel_ns()
    if dev.faults.lost_at_ns is not None and rel >= dev.faults.lost_at_ns:
        raise NVMLError(NVML_ERROR_GPU_IS_LOST)
    for fail in dev.faults.fails:
        if fail.active(function, rel):
            raise NVMLError(fail.code)
    return replay, dev, rel


# ---- the pynvml API used by jpwr -------------------------------------------------------------------------
def nvmlInit() -> None:
    nvmlInitWithFlags(0)


def nvmlInitWithFlags(flags: int) -> None:
    replay = _state(initialized=False)
    if replay.init_error is not None:
        raise NVMLError(replay.init_error)
    replay.initialized += 1


def nvmlShutdown() -> None:
    _state().initialized -= 1


def nvmlSystemGetDriverVersion() -> str:
    return _state().trace.meta["driver"]


def nvmlSystemGetNVMLVersion() -> str:
    return _state().trace.meta["nvml"]


def nvmlDeviceGetCount() -> int:
    return len(_state().devices)


def nvmlDeviceGetHandleByIndex(index: int) -> _Handle:
    if not 0 <= index < len(_state().devices):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return _Handle(index)


def nvmlDeviceGetHandleByUUID(uuid: str | bytes) -> _Handle:
    uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
    for dev in _state().devices:
        if dev.uuid == uuid:
            return _Handle(dev.index)
        if uuid in dev.mig_uuids:
            return _Handle(dev.index, uuid)
    raise NVMLError(NVML_ERROR_NOT_FOUND)


def _pci_key(bus_id: str) -> tuple[int, str]:
    """NVML accepts 'domain:bus:device.function' with a 4- or 8-digit domain, or none."""
    head, _, dev_fn = bus_id.lower().rpartition(":")
    domain, _, bus = head.rpartition(":")
    return int(domain or "0", 16), f"{bus}:{dev_fn}"


def nvmlDeviceGetHandleByPciBusId(bus_id: str | bytes) -> _Handle:
    key = _pci_key(bus_id.decode() if isinstance(bus_id, bytes) else bus_id)
    for dev in _state().devices:
        if _pci_key(dev.pci_bus_id) == key:
            return _Handle(dev.index)
    raise NVMLError(NVML_ERROR_NOT_FOUND)


def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(handle: _Handle) -> _Handle:
    if handle.mig_uuid is None:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return _Handle(handle.index)


def nvmlDeviceGetMigMode(handle: _Handle) -> list[int]:
    _, dev, _ = _device(handle, "nvmlDeviceGetMigMode")
    mode = NVML_DEVICE_MIG_ENABLE if dev.mig_uuids else NVML_DEVICE_MIG_DISABLE
    return [mode, mode]


def nvmlDeviceGetIndex(handle: _Handle) -> int:
    return handle.index


def nvmlDeviceGetName(handle: _Handle) -> str:
    return _device(handle, "nvmlDeviceGetName")[1].name


def nvmlDeviceGetUUID(handle: _Handle) -> str:
    _, dev, _ = _device(handle, "nvmlDeviceGetUUID")
    return handle.mig_uuid or dev.uuid


def nvmlDeviceGetPciInfo(handle: _Handle) -> c_nvmlPciInfo_t:
    return c_nvmlPciInfo_t(_device(handle, "nvmlDeviceGetPciInfo")[1].pci_bus_id)


def nvmlDeviceGetArchitecture(handle: _Handle) -> int:
    return _device(handle, "nvmlDeviceGetArchitecture")[1].architecture


def nvmlDeviceGetEnforcedPowerLimit(handle: _Handle) -> int:
    replay, dev, _ = _device(handle, "nvmlDeviceGetEnforcedPowerLimit")
    return replay.store.settings(dev.uuid).power_limit_mw


def nvmlDeviceGetPowerManagementLimit(handle: _Handle) -> int:
    replay, dev, _ = _device(handle, "nvmlDeviceGetPowerManagementLimit")
    return replay.store.settings(dev.uuid).power_limit_mw


def nvmlDeviceGetPowerManagementDefaultLimit(handle: _Handle) -> int:
    return int(_device(handle, "nvmlDeviceGetPowerManagementDefaultLimit")[0].trace.meta["power_limit_mW"])


def nvmlDeviceGetPowerManagementLimitConstraints(handle: _Handle) -> list[int]:
    replay = _device(handle, "nvmlDeviceGetPowerManagementLimitConstraints")[0]
    return [SYNTHETIC["power_limit_min_mW"], int(replay.trace.meta["power_limit_mW"])]


def nvmlDeviceGetMaxClockInfo(handle: _Handle, clock_type: int) -> int:
    _device(handle, "nvmlDeviceGetMaxClockInfo")
    return SYNTHETIC["memory_clock_MHz"] if clock_type == NVML_CLOCK_MEM else max(SYNTHETIC["sm_clocks_MHz"])


def nvmlDeviceGetSupportedMemoryClocks(handle: _Handle) -> list[int]:
    _device(handle, "nvmlDeviceGetSupportedMemoryClocks")
    return [SYNTHETIC["memory_clock_MHz"]]


def nvmlDeviceGetSupportedGraphicsClocks(handle: _Handle, memoryClockMHz: int) -> list[int]:
    _device(handle, "nvmlDeviceGetSupportedGraphicsClocks")
    if memoryClockMHz != SYNTHETIC["memory_clock_MHz"]:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return list(SYNTHETIC["sm_clocks_MHz"])


def nvmlDeviceGetPersistenceMode(handle: _Handle) -> int:
    _device(handle, "nvmlDeviceGetPersistenceMode")
    return SYNTHETIC["persistence_mode"]


def nvmlDeviceGetAPIRestriction(handle: _Handle, apiType: int) -> int:
    _device(handle, "nvmlDeviceGetAPIRestriction")
    if apiType not in (NVML_RESTRICTED_API_SET_APPLICATION_CLOCKS, NVML_RESTRICTED_API_SET_AUTO_BOOSTED_CLOCKS):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return SYNTHETIC["api_restricted"]


def nvmlDeviceGetTotalEnergyConsumption(handle: _Handle) -> int:
    replay, dev, rel = _device(handle, "nvmlDeviceGetTotalEnergyConsumption")
    f = dev.faults
    energy = replay.energy_mj(dev, rel)
    if f.counter_reset_at_ns is not None and rel >= f.counter_reset_at_ns:
        energy -= replay.energy_mj(dev, f.counter_reset_at_ns)
    energy = round(energy) + sum(delta for start, delta in f.counter_steps if rel >= start)
    return energy % f.counter_wrap_mj if f.counter_wrap_mj else energy


def _operating_point(replay: Replay, dev: _Device, series: list[int], rel: int,
                     column: str) -> tuple[float, float, bool]:
    """(SM clock MHz, `column`'s power in mW, capped) of the row at rel under the device's current settings."""
    index, _ = replay.trace.index(series, rel)
    recorded_mw = replay.trace.rows[index][column]
    clock, power_w, capped = replay.scaled.row_point(index, replay.store.settings(dev.uuid), recorded_mw)
    return clock, power_w * 1000.0, capped


def nvmlDeviceGetFieldValues(handle: _Handle, fieldIds: Sequence[int | tuple[int, int]]) -> Any:
    replay, dev, rel = _device(handle, "nvmlDeviceGetFieldValues")
    row, loops = replay.trace.row(replay.trace.fields_t, rel)
    values = (c_nvmlFieldValue_t * len(fieldIds))()
    for slot, request in zip(values, fieldIds, strict=True):
        field_id, scope = request if isinstance(request, tuple) else (request, 0)
        slot.fieldId, slot.scopeId = field_id, scope
        slot.timestamp = row["power_instant_hw_us"] + loops * replay.trace.duration_ns // 1000
        slot.valueType = NVML_VALUE_TYPE_UNSIGNED_INT
        column = {NVML_FI_DEV_POWER_INSTANT: "power_instant_mW", NVML_FI_DEV_POWER_AVERAGE: "power_average_mW"}
        failing = [f for f in dev.faults.fails if f.active(f"field:{field_id}:{scope}", rel)]
        if failing:
            slot.nvmlReturn = failing[0].code
        elif field_id == NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION and scope == 0:
            slot.valueType = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
            slot.value.ullVal = nvmlDeviceGetTotalEnergyConsumption(handle)
        elif field_id in column and scope in (NVML_POWER_SCOPE_GPU, NVML_POWER_SCOPE_MODULE):
            # an H100 SXM board: module scope = GPU scope
            slot.value.uiVal = round(_operating_point(replay, dev, replay.trace.fields_t, rel, column[field_id])[1])
        else:
            slot.nvmlReturn = NVML_ERROR_NOT_SUPPORTED
    return values


def nvmlDeviceGetPowerUsage(handle: _Handle) -> int:
    replay, dev, rel = _device(handle, "nvmlDeviceGetPowerUsage")
    return round(_operating_point(replay, dev, replay.trace.usage_t, rel, "power_usage_mW")[1])


def nvmlDeviceGetClockInfo(handle: _Handle, clock_type: int) -> int:
    replay, dev, rel = _device(handle, "nvmlDeviceGetClockInfo")
    if clock_type == NVML_CLOCK_MEM:
        return SYNTHETIC["memory_clock_MHz"]
    return round(_operating_point(replay, dev, replay.trace.usage_t, rel, "power_usage_mW")[0])


def nvmlDeviceGetUtilizationRates(handle: _Handle) -> c_nvmlUtilization_t:
    replay, _, rel = _device(handle, "nvmlDeviceGetUtilizationRates")
    return c_nvmlUtilization_t(replay.trace.row(replay.trace.usage_t, rel)[0]["util_gpu_pct"],
                               SYNTHETIC["util_memory_pct"])


def nvmlDeviceGetMemoryInfo(handle: _Handle) -> c_nvmlMemory_t:
    total = int(_device(handle, "nvmlDeviceGetMemoryInfo")[0].trace.meta["memory_total_bytes"])
    used = SYNTHETIC["memory_used_bytes"]
    return c_nvmlMemory_t(total, total - used, used)


def nvmlDeviceGetTemperature(handle: _Handle, sensor: int) -> int:
    _device(handle, "nvmlDeviceGetTemperature")
    return SYNTHETIC["temperature_C"]


def nvmlDeviceGetCurrentClocksEventReasons(handle: _Handle) -> int:
    """The recording's stand-in, plus 'applications clocks setting' while a clock below the maximum is locked and
    'SW power cap' while a lowered power limit holds the clock down."""
    replay, dev, rel = _device(handle, "nvmlDeviceGetCurrentClocksEventReasons")
    reasons = SYNTHETIC["clocks_event_reasons"] | dev.event_reasons
    locked = replay.store.settings(dev.uuid).locked_mhz
    if locked is not None and locked[1] < max(SYNTHETIC["sm_clocks_MHz"]):
        reasons |= nvmlClocksEventReasonApplicationsClocksSetting
    if _operating_point(replay, dev, replay.trace.usage_t, rel, "power_usage_mW")[2]:
        reasons |= nvmlClocksEventReasonSwPowerCap
    return reasons


nvmlDeviceGetCurrentClocksThrottleReasons = nvmlDeviceGetCurrentClocksEventReasons


def nvmlDeviceGetNvLinkState(handle: _Handle, link: int) -> int:
    """NVML_FEATURE_ENABLED for the first `nvlink_links` links; INVALID_ARGUMENT past them, NOT_SUPPORTED on a GPU
    without NVLink (as NVML answers on a PCIe card)."""
    replay, _, _ = _device(handle, "nvmlDeviceGetNvLinkState")
    if not replay.nvlink_links:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    if link >= replay.nvlink_links:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return NVML_FEATURE_ENABLED


def nvmlDeviceGetComputeRunningProcesses(handle: _Handle) -> list[c_nvmlProcessInfo_t]:
    """The processes planted on the device (configure's overrides: `processes`); none by default."""
    _, dev, _ = _device(handle, "nvmlDeviceGetComputeRunningProcesses")
    return [c_nvmlProcessInfo_t(pid, used) for pid, used in dev.processes.items()]


def nvmlDeviceGetGraphicsRunningProcesses(handle: _Handle) -> list[c_nvmlProcessInfo_t]:
    _device(handle, "nvmlDeviceGetGraphicsRunningProcesses")
    return []


# ---- device settings: need a privileged caller, change the shared state, and are logged -------------------------
def _set_call(handle: _Handle, function: str, args: list[int], edit, valid: bool) -> None:
    """Run one set/reset call like NVML: faults, then permission, then argument checks; log it either way."""
    replay = _state()
    dev = replay.devices[handle.index]
    result = "interrupted"  # a signal inside a slow call: nothing changed
    try:
        _device(handle, function)
        if not replay.privileged:
            raise NVMLError(NVML_ERROR_NO_PERMISSION)
        if not valid:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        result = "ok"
    except NVMLError as exc:
        result = type(exc).__name__
        raise
    finally:
        replay.store.log_call(function, dev.uuid, args, result, replay.clock.monotonic_ns())
    replay.store.change(dev.uuid, replay.clock.monotonic_ns(), edit)


def nvmlDeviceSetPowerManagementLimit(handle: _Handle, limit: int) -> None:
    low, high = SYNTHETIC["power_limit_min_mW"], int(_state().trace.meta["power_limit_mW"])
    _set_call(handle, "nvmlDeviceSetPowerManagementLimit", [int(limit)],
              lambda s: dataclasses.replace(s, power_limit_mw=int(limit)), low <= limit <= high)


def nvmlDeviceSetGpuLockedClocks(handle: _Handle, minGpuClockMHz: int, maxGpuClockMHz: int) -> None:
    clocks = SYNTHETIC["sm_clocks_MHz"]
    valid = min(clocks) <= minGpuClockMHz <= maxGpuClockMHz <= max(clocks)
    _set_call(handle, "nvmlDeviceSetGpuLockedClocks", [int(minGpuClockMHz), int(maxGpuClockMHz)],
              lambda s: dataclasses.replace(s, locked_mhz=(int(minGpuClockMHz), int(maxGpuClockMHz))), valid)


def nvmlDeviceResetGpuLockedClocks(handle: _Handle) -> None:
    _set_call(handle, "nvmlDeviceResetGpuLockedClocks", [], lambda s: dataclasses.replace(s, locked_mhz=None), True)


def _configure_from_env() -> None:
    trace_dir = os.environ.get("JPWR_FAKE_NVML_TRACE")
    if not trace_dir:
        return
    faults = os.environ.get("JPWR_FAKE_NVML_FAULTS")
    init_error = os.environ.get("JPWR_FAKE_NVML_INIT_ERROR")
    origin = os.environ.get("JPWR_FAKE_NVML_ORIGIN_NS")
    response = os.environ.get("JPWR_FAKE_NVML_CLOCK_RESPONSE")
    configure(
        trace_dir,
        devices=int(os.environ.get("JPWR_FAKE_NVML_DEVICES", "1")),
        faults=Faults.from_json(faults) if faults else None,
        init_error=int(init_error) if init_error else None,
        origin_ns=int(origin) if origin else None,
        call_costs=os.environ.get("JPWR_FAKE_NVML_CALL_COSTS", "") == "1",
        state_file=os.environ.get("JPWR_FAKE_NVML_STATE") or None,
        privileged=os.environ.get("JPWR_FAKE_NVML_PRIVILEGED", "") == "1",
        clock_response=ClockResponse.from_json(response) if response else None,
        nvlink_links=int(os.environ.get("JPWR_FAKE_NVML_NVLINK", "0")),
    )


_configure_from_env()
