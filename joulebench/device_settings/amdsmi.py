"""amdsmi access for device settings on AMD GPUs: read-only queries, and the one class that calls set functions.

`AmdsmiDevices` reads what `NvmlDevices` reads, in the same `Device` and `Reading` types: the power cap with its range
and default (amdsmi_get_power_cap_info, µW), the current SM (GFX) clock and its range (amdsmi_get_clock_info, MHz),
the clock levels (amdsmi_get_clk_freq, Hz) and the performance level (amdsmi_get_gpu_perf_level). `AmdsmiSetter`
holds the only references to amdsmi_set_power_cap, amdsmi_set_gpu_clk_range and amdsmi_set_gpu_perf_level in
joulebench; `joulebench.device_settings.setter_for` builds it for an authorised route only.

Mechanism, and why it differs from NVML's: a clock is "locked" by narrowing the GFX clock range to one value
(min = max), which any MHz within the device's range allows (not only its few DPM levels). There is no reset call
whose effect is documented for every generation, so restore writes the prior range back and returns the performance
level to AUTO, then reads both back. A performance level other than AUTO before the sweep (an admin's MANUAL or
DETERMINISM setting) means a setting already holds the clock: clock sweeps are refused there, power sweeps are not.
Tested with the fake amdsmi only (tests/fakes/amdsmi); never against a real AMD GPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from joulebench.device_settings.nvml import Device, DeviceCallError, LibrarySetter, Reading
from jpwr import MethodUnavailableError, ValidationError
from jpwr.devices import selector_kind, selector_matches

PERF_LEVEL_AUTO = "AMDSMI_DEV_PERF_LEVEL_AUTO"
POWER_SENSOR = 0  # amdsmi_set_power_cap's sensor index: 0 on every board with one power sensor


class AmdsmiDevices:
    """An initialised amdsmi, its GPUs in enumeration order, and read-only queries."""

    def __init__(self) -> None:
        try:
            import amdsmi
        except ImportError as exc:
            raise MethodUnavailableError("amdsmi: ROCm's Python bindings (module amdsmi) are not installed") from exc
        try:
            amdsmi.amdsmi_init()
        except amdsmi.AmdSmiException as exc:
            raise MethodUnavailableError(f"amdsmi: amdsmi_init failed: {exc} (no amdgpu driver or GPU here)") from exc
        self.smi = amdsmi
        self.handles = list(amdsmi.amdsmi_get_processor_handles())

    def close(self) -> None:
        self.smi.amdsmi_shut_down()

    def _device(self, index: int) -> Device:
        smi, handle = self.smi, self.handles[index]
        return Device(index, str(smi.amdsmi_get_gpu_device_uuid(handle)), str(smi.amdsmi_get_gpu_device_bdf(handle)),
                      str(smi.amdsmi_get_gpu_asic_info(handle).get("market_name", "AMD GPU")), handle)

    def _hip_index(self, index: int) -> int:
        """The index HIP and ROCR_VISIBLE_DEVICES use where amdsmi reports it (ROCm 6.4+), else the enumeration's."""
        try:
            return int(self.smi.amdsmi_get_gpu_enumeration_info(self.handles[index])["hip_id"])
        except (AttributeError, KeyError, TypeError, ValueError, self.smi.AmdSmiException):
            return index

    def select(self, selectors: Sequence[str] | None) -> list[Device]:
        """The job's devices: selectors as ROCR_VISIBLE_DEVICES/HIP_VISIBLE_DEVICES hold them (HIP indices, GPU-
        UUID prefixes or PCI bus ids; None = every GPU of the node), matched as jpwr's amdsmi backend matches them."""
        devices = [self._device(index) for index in range(len(self.handles))]
        if not devices:
            raise ValidationError("no AMD GPU on this node", "run on a GPU node, or check --devices")
        if selectors is None:
            return devices
        hip_indices = [self._hip_index(d.index) for d in devices]  # one query per device, not per selector
        chosen, problems = [], []
        for selector in selectors:
            kind = selector_kind(selector)
            matches = [d for d, hip in zip(devices, hip_indices, strict=True)
                       if selector_matches(selector, kind, hip, d.uuid, d.pci_bus_id)]
            if len(matches) == 1:
                chosen.append(matches[0])
            else:
                problems.append(f"{selector!r} matches no single GPU of {len(devices)}")
        if problems:
            raise ValidationError(f"devices {', '.join(selectors)}: {'; '.join(problems)}",
                                  "pass --devices with HIP indices, GPU UUIDs or PCI bus ids of this node, or leave "
                                  "it to ROCR_VISIBLE_DEVICES / HIP_VISIBLE_DEVICES")
        return chosen

    def by_uuid(self, uuid: str) -> Device:
        """The device a state file names, whatever the job's selection was."""
        for index in range(len(self.handles)):
            device = self._device(index)
            if device.uuid == uuid:
                return device
        raise DeviceCallError(f"amdsmi finds no GPU {uuid}")

    def _try(self, query: Any) -> Any:
        try:
            return query()
        except self.smi.AmdSmiException:
            return None

    def read(self, device: Device) -> Reading:
        smi, handle = self.smi, device.handle
        cap = self._try(lambda: smi.amdsmi_get_power_cap_info(handle)) or {}
        clock = self._try(lambda: smi.amdsmi_get_clock_info(handle, smi.AmdSmiClkType.GFX)) or {}
        levels = self._try(lambda: smi.amdsmi_get_clk_freq(handle, smi.AmdSmiClkType.GFX)) or {}
        perf_level = self._try(lambda: smi.amdsmi_get_gpu_perf_level(handle))
        levels_mhz = [round(hz / 1e6) for hz in levels.get("frequency", []) if isinstance(hz, int | float) and hz > 0]
        low, high = _mhz(clock.get("min_clk")), _mhz(clock.get("max_clk"))
        return Reading(
            power_limit_mw=_milli(cap.get("power_cap")),
            enforced_power_limit_mw=_milli(cap.get("power_cap")),
            default_power_limit_mw=_milli(cap.get("default_power_cap")),
            power_limit_range_mw=_range(_milli(cap.get("min_power_cap")), _milli(cap.get("max_power_cap"))),
            sm_clock_mhz=_mhz(clock.get("clk")),
            supported_sm_clocks_mhz=(min(levels_mhz), max(levels_mhz)) if levels_mhz else (),
            clock_held_by_setting=None if perf_level is None else perf_level != PERF_LEVEL_AUTO,
            persistence_mode=None,  # no such mode: the amdgpu driver stays loaded
            application_clocks_restricted=None,
            sm_clocks_continuous=True,
            sm_clock_range_mhz=_range(low, high),
        )


def _milli(microwatts: Any) -> int | None:
    """µW (amdsmi) to mW (the shared Reading); "N/A" and other non-numbers to None."""
    return round(microwatts / 1000) if isinstance(microwatts, int | float) and microwatts > 0 else None


def _mhz(value: Any) -> int | None:
    return int(value) if isinstance(value, int | float) and 0 < value < 0xFFFF else None


def _range(low: int | None, high: int | None) -> tuple[int, int] | None:
    return None if low is None or high is None or low > high else (low, high)


class AmdsmiSetter(LibrarySetter):
    """Set and restore through amdsmi in this process (needs root: amdsmi writes the amdgpu driver's sysfs files)."""

    route = "amdsmi"
    library = "amdsmi"

    def __init__(self, devices: AmdsmiDevices) -> None:
        self.smi = devices.smi
        self.error = devices.smi.AmdSmiException

    def set_power_limit(self, index: int, handle: Any, milliwatts: int) -> None:
        self._call("amdsmi_set_power_cap", self.smi.amdsmi_set_power_cap, handle, POWER_SENSOR, milliwatts * 1000)

    def lock_sm_clock(self, index: int, handle: Any, mhz: int) -> None:
        self._call("amdsmi_set_gpu_clk_range", self.smi.amdsmi_set_gpu_clk_range, handle, mhz, mhz,
                   self.smi.AmdSmiClkType.GFX)

    def reset_sm_clock(self, index: int, handle: Any, prior_range_mhz: Sequence[int] | None) -> None:
        if prior_range_mhz is None:
            raise DeviceCallError("the state file holds no prior clock range for this AMD GPU, so it cannot be put "
                                  "back")
        low, high = prior_range_mhz
        self._call("amdsmi_set_gpu_clk_range", self.smi.amdsmi_set_gpu_clk_range, handle, int(low), int(high),
                   self.smi.AmdSmiClkType.GFX)
        self._call("amdsmi_set_gpu_perf_level", self.smi.amdsmi_set_gpu_perf_level, handle,
                   self.smi.AmdSmiDevPerfLevel.AUTO)
