"""Fake `amdsmi` (ROCm's Python bindings) at the vendor boundary, driven by a clock.

Each configured `FakeGpu` draws a constant (settable) power; its energy accumulator integrates it and is
reported as ticks of `counter_resolution` µJ under either key spelling (`energy_accumulator`, or `power`
before amdsmi 6.2.1). Unsupported values read "N/A" or UINT32_MAX as on real boards; an MI250 secondary GCD
reports "N/A" power and a zero energy count. Unconfigured, amdsmi_init fails like a machine without ROCm.

Device settings (power cap, GFX clock range, performance level) answer the set functions joulebench's
device_settings calls, only when the fake is privileged (real amdsmi needs root), else AMDSMI_STATUS_NO_PERM; every
set call is logged. Narrowing the clock range sets the performance level MANUAL (as rocm-smi does); AUTO does not
widen the range again (the conservative reading of amdgpu: restore must write the range back itself).
Across processes (a job's apply and its epilog's restore): JPWR_FAKE_AMDSMI_STATE=<file> configures
JPWR_FAKE_AMDSMI_DEVICES GPUs (default 2; privileged with JPWR_FAKE_AMDSMI_PRIVILEGED=1) whose settings and call
log live in that file, read and written on every settings call.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

AMDSMI_STATUS_INVAL = 1
AMDSMI_STATUS_NOT_SUPPORTED = 2
AMDSMI_STATUS_NO_PERM = 10
AMDSMI_STATUS_INIT_ERROR = 18
AMDSMI_STATUS_NOT_INIT = 32
AMDSMI_STATUS_DRIVER_NOT_LOADED = 34
UINT32_MAX = 0xFFFFFFFF


class AmdSmiException(Exception):
    pass


class AmdSmiLibraryException(AmdSmiException):
    def __init__(self, err_code: int) -> None:
        super().__init__(err_code)
        self.err_code = err_code

    def get_error_code(self) -> int:
        return self.err_code

    def get_error_info(self) -> str:
        return f"AMDSMI error code {self.err_code}"

    def __str__(self) -> str:
        return self.get_error_info()


class AmdSmiInitFlags(enum.IntEnum):
    INIT_ALL_PROCESSORS = 0xFFFFFFFF
    INIT_AMD_CPUS = 1
    INIT_AMD_GPUS = 2


class AmdSmiClkType(enum.IntEnum):
    SYS = 0
    GFX = 0
    MEM = 4


class AmdSmiDevPerfLevel(enum.IntEnum):
    AUTO = 0
    LOW = 1
    HIGH = 2
    MANUAL = 3
    DETERMINISM = 8


class AmdSmiTemperatureType(enum.IntEnum):
    EDGE = 0
    HOTSPOT = 1
    VRAM = 2


class AmdSmiTemperatureMetric(enum.IntEnum):
    CURRENT = 0


@dataclasses.dataclass
class FakeGpu:
    """One GCD as amdsmi sees it."""

    uuid: str
    bdf: str
    name: str = "AMD Instinct MI300X"
    board_serial: str = ""
    power_w: float | None = 300.0  # what the sensor reports; None = "N/A"
    power_key: str = "current_socket_power"  # MI300+; "average_socket_power" on MI200 and older
    unsupported_as: Any = "N/A"  # or UINT32_MAX
    energy_key: str = "energy_accumulator"  # "power" before amdsmi 6.2.1
    counter_resolution: float = 15.3  # µJ per tick
    energy_supported: bool = True
    secondary_die: bool = False  # MI250 GCD 1: no power of its own, energy count 0
    secondary_reports: Any = "N/A (Secondary die)"  # or 0, depending on the ROCm version
    frozen_counter: bool = False  # MI100 bug (ROCm/amdsmi#38)
    hip_id: int | None = None
    energy_j: float = 1000.0  # accumulated at `_t_ns`
    _t_ns: int | None = None
    # settings (what amdsmi_set_* change), in amdsmi's units where it has one
    power_cap_uw: int = 500_000_000
    default_power_cap_uw: int = 500_000_000
    power_cap_range_uw: tuple[int, int] = (100_000_000, 500_000_000)
    gfx_range_mhz: tuple[int, int] = (500, 1700)  # the range the driver keeps the clock in
    gfx_levels_mhz: tuple[int, ...] = (500, 1100, 1700)  # DPM levels (amdsmi_get_clk_freq)
    perf_level: str = "AMDSMI_DEV_PERF_LEVEL_AUTO"


class _RealClock:
    def monotonic_ns(self) -> int:
        return time.monotonic_ns()


@dataclasses.dataclass
class _State:
    gpus: list[FakeGpu]
    clock: Any
    init_error: int | None = None
    privileged: bool = False  # may call the set functions (root on a real system)
    settings_file: Path | None = None  # settings shared between processes
    calls: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    initialized: bool = False
    calls_in_flight: int = 0
    max_concurrent_calls: int = 0
    guard: threading.Lock = dataclasses.field(default_factory=threading.Lock)


_state: _State | None = None


def configure(gpus: Sequence[FakeGpu], clock: Any = None, init_error: int | None = None,
              privileged: bool = False, settings_file: Path | None = None) -> _State:
    """Install `gpus` (in amdsmi's enumeration order) on `clock` (jpwr VirtualClock; None = real time)."""
    global _state
    _state = _State(list(gpus), clock or _RealClock(), init_error, privileged, settings_file)
    for gpu in _state.gpus:
        gpu._t_ns = _state.clock.monotonic_ns()
    return _state


def reset() -> None:
    global _state
    _state = None


def set_power(index: int, watts: float | None) -> None:
    """Change a GPU's draw from now on (energy up to now is integrated at the old power)."""
    gpu = _advance(_require().gpus[index])
    gpu.power_w = watts


def _from_environment() -> None:
    """A subprocess's fake GPUs, from JPWR_FAKE_AMDSMI_STATE (see the module docstring)."""
    path = os.environ.get("JPWR_FAKE_AMDSMI_STATE")
    if path:
        count = int(os.environ.get("JPWR_FAKE_AMDSMI_DEVICES", "2"))
        gpus = [FakeGpu(f"{i:08x}-0000-1000-80d9-fa4e0000000{i}", f"0000:{0xc1 + i:02x}:00.0", hip_id=i)
                for i in range(count)]
        configure(gpus, privileged=os.environ.get("JPWR_FAKE_AMDSMI_PRIVILEGED") == "1", settings_file=Path(path))


SETTING_FIELDS = ("power_cap_uw", "gfx_range_mhz", "perf_level")


def _sync(state: _State) -> None:
    """Read the shared settings file into the GPUs (another process may have changed them)."""
    if state.settings_file is None or not state.settings_file.exists():
        return
    data = json.loads(state.settings_file.read_text())
    state.calls = data["calls"]
    for gpu in state.gpus:
        for name, value in data["devices"].get(gpu.uuid, {}).items():
            setattr(gpu, name, tuple(value) if isinstance(value, list) else value)


def _save(state: _State) -> None:
    if state.settings_file is None:
        return
    devices = {gpu.uuid: {name: getattr(gpu, name) for name in SETTING_FIELDS} for gpu in state.gpus}
    temporary = state.settings_file.with_suffix(".tmp")
    temporary.write_text(json.dumps({"devices": devices, "calls": state.calls}))
    temporary.replace(state.settings_file)


def _require(initialized: bool = True) -> _State:
    if _state is None:
        _from_environment()
    if _state is None:
        raise AmdSmiLibraryException(AMDSMI_STATUS_DRIVER_NOT_LOADED)
    if initialized and not _state.initialized:
        raise AmdSmiLibraryException(AMDSMI_STATUS_NOT_INIT)
    return _state


def _advance(gpu: FakeGpu) -> FakeGpu:
    now = _require().clock.monotonic_ns()
    if gpu.power_w is not None and gpu._t_ns is not None:
        gpu.energy_j += gpu.power_w * (now - gpu._t_ns) / 1e9
    gpu._t_ns = now
    return gpu


def _call(handle: int) -> FakeGpu:
    """Every API call passes here; it records overlapping calls so tests can check the caller's lock."""
    state = _require()
    with state.guard:
        state.calls_in_flight += 1
        state.max_concurrent_calls = max(state.max_concurrent_calls, state.calls_in_flight)
    time.sleep(0)  # let another thread in if the caller does not serialise
    with state.guard:
        state.calls_in_flight -= 1
    return state.gpus[handle]


def _unsupported_or(gpu: FakeGpu, value: Any, supported: bool) -> Any:
    return value if supported else gpu.unsupported_as


# ---- API ---------------------------------------------------------------------------------------------
def amdsmi_init(flags: int = AmdSmiInitFlags.INIT_AMD_GPUS) -> None:
    state = _require(initialized=False)
    if state.init_error is not None:
        raise AmdSmiLibraryException(state.init_error)
    state.initialized = True


def amdsmi_shut_down() -> None:
    _require().initialized = False


def amdsmi_get_lib_version() -> dict[str, Any]:
    _require()
    return {"major": 25, "minor": 1, "release": 0, "build": "fake"}


def amdsmi_get_processor_handles() -> list[int]:
    return list(range(len(_require().gpus)))


def amdsmi_get_gpu_device_uuid(handle: int) -> str:
    return _call(handle).uuid


def amdsmi_get_gpu_device_bdf(handle: int) -> str:
    return _call(handle).bdf


def amdsmi_get_gpu_asic_info(handle: int) -> dict[str, Any]:
    return {"market_name": _call(handle).name, "vendor_id": 0x1002}


def amdsmi_get_gpu_board_info(handle: int) -> dict[str, Any]:
    gpu = _call(handle)
    return {"product_serial": gpu.board_serial or "N/A", "product_name": gpu.name}


def amdsmi_get_gpu_driver_info(handle: int) -> dict[str, Any]:
    _call(handle)
    return {"driver_name": "amdgpu", "driver_version": "6.10.5"}


def amdsmi_get_gpu_enumeration_info(handle: int) -> dict[str, Any]:
    gpu = _call(handle)
    if gpu.hip_id is None:
        raise AmdSmiLibraryException(AMDSMI_STATUS_NOT_SUPPORTED)
    return {"hip_id": gpu.hip_id, "drm_card": handle, "drm_render": 128 + handle}


def amdsmi_get_energy_count(handle: int) -> dict[str, Any]:
    gpu = _advance(_call(handle))
    if not gpu.energy_supported:
        raise AmdSmiLibraryException(AMDSMI_STATUS_NOT_SUPPORTED)
    ticks = 0 if gpu.secondary_die else int(gpu.energy_j * 1e6 / gpu.counter_resolution)
    if gpu.frozen_counter:
        ticks = 123456
    return {gpu.energy_key: ticks, "counter_resolution": gpu.counter_resolution, "timestamp": gpu._t_ns}


def amdsmi_get_power_info(handle: int) -> dict[str, Any]:
    """Whole watts in the key this generation fills; the other keys read as unsupported."""
    gpu = _call(handle)
    info: dict[str, Any] = dict.fromkeys(("current_socket_power", "average_socket_power", "gfx_voltage"),
                                         gpu.unsupported_as)
    info["power_limit"] = 500
    if gpu.secondary_die:
        info[gpu.power_key] = gpu.secondary_reports
    elif gpu.power_w is not None:
        info[gpu.power_key] = round(gpu.power_w)
    return info


def amdsmi_get_power_cap_info(handle: int) -> dict[str, Any]:
    gpu = _settings(handle)
    return {"power_cap": gpu.power_cap_uw, "default_power_cap": gpu.default_power_cap_uw,
            "min_power_cap": gpu.power_cap_range_uw[0], "max_power_cap": gpu.power_cap_range_uw[1]}


def amdsmi_get_gpu_activity(handle: int) -> dict[str, Any]:
    gpu = _call(handle)
    return {"gfx_activity": _unsupported_or(gpu, 97, not gpu.secondary_die), "umc_activity": 40, "mm_activity": 0}


def amdsmi_get_clock_info(handle: int, clk_type: int) -> dict[str, Any]:
    gpu = _settings(handle)
    if clk_type == AmdSmiClkType.MEM:
        return {"clk": 1600, "min_clk": 500, "max_clk": 1600, "clk_locked": False, "clk_deep_sleep": False}
    low, high = gpu.gfx_range_mhz
    return {"clk": high, "min_clk": low, "max_clk": high, "clk_locked": low == high, "clk_deep_sleep": False}


def amdsmi_get_clk_freq(handle: int, clk_type: int) -> dict[str, Any]:
    gpu = _settings(handle)
    levels = [mhz * 1_000_000 for mhz in gpu.gfx_levels_mhz]
    current = max(i for i, hz in enumerate(levels) if hz <= gpu.gfx_range_mhz[1] * 1_000_000)
    return {"num_supported": len(levels), "current": current, "frequency": levels}


def amdsmi_get_gpu_perf_level(handle: int) -> str:
    return _settings(handle).perf_level


def _settings(handle: int) -> FakeGpu:
    gpu = _call(handle)
    _sync(_require())
    return gpu


def _set(handle: int, call: str, args: dict[str, Any], change: Any) -> None:
    """One set call: logged (also when refused), refused without privilege, applied and shared."""
    state = _require()
    gpu = _settings(handle)
    state.calls.append({"call": call, "uuid": gpu.uuid, **args})
    try:
        if not state.privileged:
            raise AmdSmiLibraryException(AMDSMI_STATUS_NO_PERM)
        change(gpu)
    finally:
        _save(state)


def amdsmi_set_power_cap(handle: int, sensor_ind: int, cap: int) -> None:
    def change(gpu: FakeGpu) -> None:
        if sensor_ind != 0 or not gpu.power_cap_range_uw[0] <= cap <= gpu.power_cap_range_uw[1]:
            raise AmdSmiLibraryException(AMDSMI_STATUS_INVAL)
        gpu.power_cap_uw = int(cap)

    _set(handle, "amdsmi_set_power_cap", {"cap": cap}, change)


def amdsmi_set_gpu_clk_range(handle: int, min_clk_value: int, max_clk_value: int, clk_type: int) -> None:
    def change(gpu: FakeGpu) -> None:
        lowest, highest = gpu.gfx_levels_mhz[0], gpu.gfx_levels_mhz[-1]
        if clk_type != AmdSmiClkType.GFX or not lowest <= min_clk_value <= max_clk_value <= highest:
            raise AmdSmiLibraryException(AMDSMI_STATUS_INVAL)
        gpu.gfx_range_mhz = (int(min_clk_value), int(max_clk_value))
        gpu.perf_level = "AMDSMI_DEV_PERF_LEVEL_MANUAL"

    _set(handle, "amdsmi_set_gpu_clk_range", {"min": min_clk_value, "max": max_clk_value}, change)


def amdsmi_set_gpu_perf_level(handle: int, perf_level: int) -> None:
    def change(gpu: FakeGpu) -> None:
        gpu.perf_level = f"AMDSMI_DEV_PERF_LEVEL_{AmdSmiDevPerfLevel(perf_level).name}"

    _set(handle, "amdsmi_set_gpu_perf_level", {"level": int(perf_level)}, change)


def amdsmi_get_gpu_vram_usage(handle: int) -> dict[str, Any]:
    _call(handle)
    return {"vram_total": 65536, "vram_used": 1024}


def amdsmi_get_temp_metric(handle: int, sensor_type: int, metric: int) -> int:
    _call(handle)
    return 55
