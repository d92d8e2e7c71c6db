"""Fake `amdsmi` (ROCm's Python bindings) at the vendor boundary, driven by a clock.

Each configured `FakeGpu` draws a constant (settable) power; its energy accumulator integrates it and is
reported as ticks of `counter_resolution` µJ under either key spelling (`energy_accumulator`, or `power`
before amdsmi 6.2.1). Unsupported values read "N/A" or UINT32_MAX as on real boards; an MI250 secondary GCD
reports "N/A" power and a zero energy count. Unconfigured, amdsmi_init fails like a machine without ROCm.
"""

from __future__ import annotations

import dataclasses
import enum
import threading
import time
from collections.abc import Sequence
from typing import Any

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


class _RealClock:
    def monotonic_ns(self) -> int:
        return time.monotonic_ns()


@dataclasses.dataclass
class _State:
    gpus: list[FakeGpu]
    clock: Any
    init_error: int | None = None
    initialized: bool = False
    calls_in_flight: int = 0
    max_concurrent_calls: int = 0
    guard: threading.Lock = dataclasses.field(default_factory=threading.Lock)


_state: _State | None = None


def configure(gpus: Sequence[FakeGpu], clock: Any = None, init_error: int | None = None) -> _State:
    """Install `gpus` (in amdsmi's enumeration order) on `clock` (jpwr VirtualClock; None = real time)."""
    global _state
    _state = _State(list(gpus), clock or _RealClock(), init_error)
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


def _require(initialized: bool = True) -> _State:
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
    _call(handle)
    return {"power_cap": 500_000_000, "default_power_cap": 500_000_000, "min_power_cap": 0,
            "max_power_cap": 500_000_000}


def amdsmi_get_gpu_activity(handle: int) -> dict[str, Any]:
    gpu = _call(handle)
    return {"gfx_activity": _unsupported_or(gpu, 97, not gpu.secondary_die), "umc_activity": 40, "mm_activity": 0}


def amdsmi_get_clock_info(handle: int, clk_type: int) -> dict[str, Any]:
    _call(handle)
    mhz = 1600 if clk_type == AmdSmiClkType.MEM else 1700
    return {"clk": mhz, "min_clk": 500, "max_clk": mhz, "clk_locked": False, "clk_deep_sleep": False}


def amdsmi_get_gpu_vram_usage(handle: int) -> dict[str, Any]:
    _call(handle)
    return {"vram_total": 65536, "vram_used": 1024}


def amdsmi_get_temp_metric(handle: int, sensor_type: int, metric: int) -> int:
    _call(handle)
    return 55
