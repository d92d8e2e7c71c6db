"""NVML access for device settings: read-only queries, and the one class that calls set/reset functions.

`NvmlDevices` only reads (power limit, its range and default, SM clocks, clock event reasons, persistence mode, the
application-clock API restriction). `NvmlSetter` holds the only references to nvmlDeviceSetPowerManagementLimit,
nvmlDeviceSetGpuLockedClocks and nvmlDeviceResetGpuLockedClocks in joulebench; it is built by
`joulebench.device_settings.setter_for`, which demands an Authorization.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from jpwr import MethodUnavailableError, ValidationError
from jpwr.devices import resolve_gpus

CLOCK_SM = 1  # NVML_CLOCK_SM
CLOCK_MEM = 2  # NVML_CLOCK_MEM
REASON_APPLICATIONS_CLOCKS_SETTING = 0x2  # nvmlClocksEventReasonApplicationsClocksSetting: a clock setting holds it
RESTRICTED_API_SET_APPLICATION_CLOCKS = 0  # NVML_RESTRICTED_API_SET_APPLICATION_CLOCKS


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


class DeviceCallError(Exception):
    """A device (through NVML or zeusd) refused or failed one call; the message names the call and the reason."""


@dataclasses.dataclass(frozen=True)
class Device:
    index: int  # NVML index in this process
    uuid: str
    pci_bus_id: str
    name: str
    handle: Any
    mig: bool = False

    @property
    def label(self) -> str:
        return f"device {self.index} ({self.name}, {self.uuid})"


@dataclasses.dataclass(frozen=True)
class Reading:
    """What NVML says about one device's settings; None where the query is not supported."""

    power_limit_mw: int | None
    enforced_power_limit_mw: int | None
    default_power_limit_mw: int | None
    power_limit_range_mw: tuple[int, int] | None
    sm_clock_mhz: int | None
    supported_sm_clocks_mhz: tuple[int, ...]
    clock_held_by_setting: bool | None  # clock event reason "applications clocks setting" active now
    persistence_mode: bool | None
    application_clocks_restricted: bool | None
    sm_clocks_continuous: bool = False  # any MHz between the supported min and max can be locked (AMD), not a list
    sm_clock_range_mhz: tuple[int, int] | None = None  # the clock range a setting narrows (AMD); NVML has none

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["supported_sm_clocks_mhz"] = [min(self.supported_sm_clocks_mhz, default=None),
                                           max(self.supported_sm_clocks_mhz, default=None)]
        return data


class NvmlDevices:
    """An initialised NVML, the devices it resolves, and read-only queries."""

    def __init__(self) -> None:
        try:
            import pynvml
        except ImportError as exc:
            raise MethodUnavailableError("NVML: nvidia-ml-py (module pynvml) is not installed") from exc
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise MethodUnavailableError(f"NVML: nvmlInit failed: {exc} (no NVIDIA driver or GPU here)") from exc
        self.nv = pynvml

    def close(self) -> None:
        self.nv.nvmlShutdown()

    def _device(self, index: int, handle: Any, mig: bool) -> Device:
        nv = self.nv
        return Device(index, _text(nv.nvmlDeviceGetUUID(handle)), _text(nv.nvmlDeviceGetPciInfo(handle).busId),
                      _text(nv.nvmlDeviceGetName(handle)), handle, mig)

    def select(self, selectors: Sequence[str] | None) -> list[Device]:
        """The job's devices: selectors as CUDA_VISIBLE_DEVICES holds them (None = every GPU of the node)."""
        gpus, problems = resolve_gpus(self.nv, selectors)
        if problems:
            raise ValidationError(f"devices {', '.join(selectors or ())}: {'; '.join(problems)}",
                                  "pass --devices with NVML indices or GPU UUIDs of this node, or leave it to "
                                  "CUDA_VISIBLE_DEVICES")
        if not gpus:
            raise ValidationError("no GPU selected on this node", "run on a GPU node, or check --devices / "
                                                                  "CUDA_VISIBLE_DEVICES")
        return [self._device(index, handle, mig) for index, handle, mig in gpus]

    def by_uuid(self, uuid: str) -> Device:
        """The device a state file names; its NVML index may differ from the job's (an epilog sees every GPU)."""
        try:
            handle = self.nv.nvmlDeviceGetHandleByUUID(uuid)
            return self._device(int(self.nv.nvmlDeviceGetIndex(handle)), handle, False)
        except self.nv.NVMLError as exc:
            raise DeviceCallError(f"NVML finds no GPU {uuid}: {exc}") from exc

    def _try(self, query: Any) -> Any:
        try:
            return query()
        except self.nv.NVMLError:
            return None

    def read(self, device: Device) -> Reading:
        nv, handle = self.nv, device.handle
        limit_range = self._try(lambda: nv.nvmlDeviceGetPowerManagementLimitConstraints(handle))
        reasons = self._try(lambda: nv.nvmlDeviceGetCurrentClocksEventReasons(handle))
        persistence = self._try(lambda: nv.nvmlDeviceGetPersistenceMode(handle))
        restricted = self._try(lambda: nv.nvmlDeviceGetAPIRestriction(handle, RESTRICTED_API_SET_APPLICATION_CLOCKS))
        return Reading(
            power_limit_mw=self._try(lambda: int(nv.nvmlDeviceGetPowerManagementLimit(handle))),
            enforced_power_limit_mw=self._try(lambda: int(nv.nvmlDeviceGetEnforcedPowerLimit(handle))),
            default_power_limit_mw=self._try(lambda: int(nv.nvmlDeviceGetPowerManagementDefaultLimit(handle))),
            power_limit_range_mw=None if limit_range is None else (int(limit_range[0]), int(limit_range[1])),
            sm_clock_mhz=self._try(lambda: int(nv.nvmlDeviceGetClockInfo(handle, CLOCK_SM))),
            supported_sm_clocks_mhz=tuple(sorted(self._supported_sm_clocks(handle))),
            clock_held_by_setting=None if reasons is None else bool(reasons & REASON_APPLICATIONS_CLOCKS_SETTING),
            persistence_mode=None if persistence is None else bool(persistence),
            application_clocks_restricted=None if restricted is None else bool(restricted),
        )

    def _supported_sm_clocks(self, handle: Any) -> list[int]:
        """SM clocks the device supports at its highest memory clock (the one a training run uses)."""
        nv = self.nv
        memory = self._try(lambda: max(nv.nvmlDeviceGetSupportedMemoryClocks(handle)))
        if memory is None:
            return []
        return [int(c) for c in self._try(lambda: nv.nvmlDeviceGetSupportedGraphicsClocks(handle, memory)) or []]


class LibrarySetter:
    """Calls one of a vendor library's set functions; the library's error becomes a DeviceCallError naming the call."""

    library = ""
    error: type[Exception] = Exception

    def _call(self, what: str, function: Any, *args: Any) -> None:
        try:
            function(*args)
        except self.error as exc:
            raise DeviceCallError(f"{self.library} {what}: {exc}") from exc


class NvmlSetter(LibrarySetter):
    """Set and reset through NVML in this process (needs root or CAP_SYS_ADMIN)."""

    route = "nvml"
    library = "NVML"

    def __init__(self, devices: NvmlDevices) -> None:
        self.nv = devices.nv
        self.error = devices.nv.NVMLError

    def set_power_limit(self, index: int, handle: Any, milliwatts: int) -> None:
        self._call("nvmlDeviceSetPowerManagementLimit", self.nv.nvmlDeviceSetPowerManagementLimit, handle, milliwatts)

    def lock_sm_clock(self, index: int, handle: Any, mhz: int) -> None:
        self._call("nvmlDeviceSetGpuLockedClocks", self.nv.nvmlDeviceSetGpuLockedClocks, handle, mhz, mhz)

    def reset_sm_clock(self, index: int, handle: Any, prior_range_mhz: Sequence[int] | None) -> None:
        """NVML's reset returns the device's own clock behaviour: no prior range is needed."""
        self._call("nvmlDeviceResetGpuLockedClocks", self.nv.nvmlDeviceResetGpuLockedClocks, handle)
