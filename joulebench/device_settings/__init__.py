"""Power limit and locked SM clock of the job's GPUs as a benchmark dimension: probe, apply, restore.

Safety first, because a wrong setting outlives the job and this project's own GPU machines run as root:
* Opt-in per site. The profile key `device_settings = allowed` (default `off`) is the only way in; with it off, or
  with nothing requested, `authorize` refuses before NVML is initialised, and the set/reset functions are reachable
  only through `setter_for`, which demands the Authorization that `authorize` alone makes.
* The probe changes nothing: it reads the policy, this process's privileges (uid, CAP_SYS_ADMIN), the zeusd socket the
  profile names (presence, type, access, a listener), and per device the power limit with its range and default, the
  SM clocks, the clock event reasons, persistence mode and the application-clock API restriction. It calls no set
  function, not even with the current value.
* Every check runs before any change; the prior values of every device are saved to the state file (state.py) before
  the first set call, and a failure on any device rolls all of them back. `restore` undoes what the state file says was
  touched, from the job's exit paths or from a Slurm epilog after SIGKILL, OOM or node loss.
Mechanism: nvmlDeviceSetPowerManagementLimit for the power limit; nvmlDeviceSetGpuLockedClocks(f, f) locks the SM clock
and nvmlDeviceResetGpuLockedClocks undoes it (or the same calls through zeusd). NVML cannot read a locked range back:
the read-back is the SM clock just after the call, and a clock that some setting already holds before the sweep is
refused, since it could not be restored. AMD GPUs go through amdsmi (amdsmi.py: power cap, GFX clock range,
performance level), with the same checks, state file and restore.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

from joulebench.device_settings.amdsmi import AmdsmiDevices, AmdsmiSetter
from joulebench.device_settings.nvml import Device, DeviceCallError, NvmlDevices, NvmlSetter, Reading
from joulebench.device_settings.state import DeviceState, SettingsState, prepare_state_dir
from joulebench.device_settings.zeusd import ZeusdSetter, socket_problem
from jpwr import ExitCode, JpwrError, MethodUnavailableError, OutputDirError, ValidationError
from jpwr.output import fmt

PROFILE_KEY = "device_settings"
POLICIES = ("off", "allowed")


class Library(NamedTuple):
    """How one vendor's settings are changed in the job: its device access, the setter whose library name and route
    (what a state file records) it uses, and how a user without root gets a route."""

    devices: type[NvmlDevices | AmdsmiDevices]
    setter: type[NvmlSetter | AmdsmiSetter]
    no_root_fix: str


LIBRARIES = {
    "nvidia": Library(NvmlDevices, NvmlSetter, "ask the admins for zeusd and name its socket in the profile "
                                               "(zeusd_socket = /var/run/zeusd.sock), or run where jobs may change "
                                               "GPU settings (docs/sweeps.md)"),
    "amd": Library(AmdsmiDevices, AmdsmiSetter, "run where jobs may change GPU settings as root (docs/sweeps.md), or "
                                                "leave power_limit and sm_clock empty"),
}
VENDORS = tuple(LIBRARIES)
CAP_SYS_ADMIN = 21  # bit in /proc/<pid>/status CapEff
_TOKEN = object()


class SettingRefused(ValidationError):
    """A requested setting is not permitted on this system; nothing was changed."""

    exit_code = ExitCode.NO_PERMISSION

    def __init__(self, setting: str, reason: str, fix: str) -> None:
        super().__init__(f"{setting}: {reason}", fix)


class DeviceSettingFailed(JpwrError):
    """A device rejected or failed a set/reset call; the message says what was rolled back and what is left."""

    exit_code = ExitCode.IO

    def __init__(self, problem: str, fix: str) -> None:
        super().__init__(f"{problem.rstrip('.')}. Fix: {fix}")


@dataclasses.dataclass(frozen=True)
class Request:
    """The settings one sweep point asks for; None = the device's own setting, untouched."""

    power_limit_w: float | None = None
    sm_clock_mhz: int | None = None

    def __post_init__(self) -> None:
        for name, value, unit in (("power_limit", self.power_limit_w, "W"), ("sm_clock", self.sm_clock_mhz, "MHz")):
            if value is not None and not value > 0:
                raise ValidationError(f"{name}={value} {unit} is not a positive number",
                                      f"give {name} in {unit}, or leave it empty for the device's own setting")

    @property
    def is_empty(self) -> bool:
        return self.power_limit_w is None and self.sm_clock_mhz is None

    @property
    def names(self) -> str:
        """The requested settings as the messages name them, e.g. 'power_limit=300 W, sm_clock=1410 MHz'."""
        parts = [f"power_limit={fmt(self.power_limit_w)} W"] if self.power_limit_w is not None else []
        parts += [f"sm_clock={self.sm_clock_mhz} MHz"] if self.sm_clock_mhz is not None else []
        return ", ".join(parts) or "no setting"

    def to_dict(self) -> dict[str, Any]:
        return {"power_limit_w": self.power_limit_w, "sm_clock_mhz": self.sm_clock_mhz}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Request:
        return cls(data.get("power_limit_w"), data.get("sm_clock_mhz"))


@dataclasses.dataclass(frozen=True)
class Privileges:
    euid: int
    cap_sys_admin: bool

    @classmethod
    def of_this_process(cls) -> Privileges:
        effective = 0
        try:
            for line in Path("/proc/self/status").read_text().splitlines():
                if line.startswith("CapEff:"):
                    effective = int(line.split()[1], 16)
        except OSError:
            pass
        return cls(os.geteuid(), bool(effective >> CAP_SYS_ADMIN & 1))

    @property
    def may_set_devices(self) -> bool:
        """NVML's set functions and amdsmi's sysfs writes both need root or CAP_SYS_ADMIN."""
        return self.euid == 0 or self.cap_sys_admin

    def describe(self) -> str:
        return f"uid {self.euid}, {'with' if self.cap_sys_admin else 'without'} CAP_SYS_ADMIN"


@dataclasses.dataclass(frozen=True)
class Authorization:
    """Proof that the site allows settings and that this process has a route to the devices (made by authorize)."""

    route: str  # "nvml" or "amdsmi" (this process has the rights), or "zeusd"
    detail: str  # why the route works, for the log
    zeusd_socket: str | None = None
    token: object = dataclasses.field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.token is not _TOKEN:
            raise TypeError("only joulebench.device_settings.authorize grants an Authorization")


def check_policy(policy: str) -> None:
    if policy not in POLICIES:
        raise ValidationError(f"{PROFILE_KEY} = {policy!r} is not one of {', '.join(POLICIES)}",
                              f"set {PROFILE_KEY} = off (the default) or {PROFILE_KEY} = allowed in the profile")


def authorize(policy: str, request: Request, privileges: Privileges, zeusd_socket: str | None,
              vendor: str = "nvidia", socket_here: bool = True) -> Authorization:
    """The refusal path: raise SettingRefused naming the setting, the reason and the fix. Touches no device.
    socket_here=False: the zeusd socket lives on the GPU nodes, not here (a login node); apply checks it there."""
    check_policy(policy)
    setting = request.names
    if request.is_empty:
        raise ValueError("authorize() needs a requested setting")
    if vendor not in VENDORS:
        raise SettingRefused(setting, f"joulebench changes GPU settings on {' and '.join(VENDORS)} GPUs only, not "
                                      f"on {vendor} devices", "leave power_limit and sm_clock empty on this system")
    if policy != "allowed":
        raise SettingRefused(setting, f"device settings are off for this system (profile key {PROFILE_KEY} = "
                                      f"{policy})",
                             f"sweep power limits and clocks only on a system whose admins allow it ({PROFILE_KEY} = "
                             "allowed in its profile, docs/sweeps.md); here leave power_limit and sm_clock empty")
    if zeusd_socket and vendor != "nvidia":
        raise SettingRefused(setting, f"zeusd drives NVIDIA GPUs only, and this system's GPUs are {vendor}",
                             "remove zeusd_socket from the profile; jobs that may change AMD GPU settings run as root")
    if zeusd_socket and not socket_here:
        return Authorization("zeusd", f"through zeusd at {zeusd_socket} (the socket is checked on each GPU node "
                                      "when the job applies the setting)", zeusd_socket, _TOKEN)
    if zeusd_socket:
        problem = socket_problem(zeusd_socket)
        if problem:
            raise SettingRefused(setting, problem, "start zeusd on the node with a socket the job's user may write "
                                                   "(docs/sweeps.md), or remove zeusd_socket from the profile")
        return Authorization("zeusd", f"through zeusd at {zeusd_socket}", zeusd_socket, _TOKEN)
    library = LIBRARIES[vendor]
    name = library.setter.library
    if not privileges.may_set_devices:
        raise SettingRefused(setting, f"{name} set functions need root or CAP_SYS_ADMIN, and this process has "
                                      f"{privileges.describe()}", library.no_root_fix)
    return Authorization(library.setter.route, f"through {name} ({privileges.describe()})", None, _TOKEN)


Devices = NvmlDevices | AmdsmiDevices
Setter = NvmlSetter | AmdsmiSetter | ZeusdSetter


def open_devices(vendor: str) -> Devices:
    """The vendor's device access (initialises its library; MethodUnavailableError where it is missing)."""
    return LIBRARIES[vendor].devices()


def vendor_of_route(route: str) -> str:
    """The vendor whose devices a state file's route changed (zeusd drives NVIDIA GPUs)."""
    return next((vendor for vendor, library in LIBRARIES.items() if library.setter.route == route), "nvidia")


def setter_for(authorization: Authorization, devices: Devices) -> Setter:
    """The object that changes settings, for an authorised route only."""
    if not isinstance(authorization, Authorization) or authorization.token is not _TOKEN:
        raise TypeError("setter_for needs the Authorization that authorize() returned")
    if authorization.route == "zeusd":
        assert authorization.zeusd_socket is not None
        return ZeusdSetter(authorization.zeusd_socket)
    setter = LIBRARIES[vendor_of_route(authorization.route)].setter
    if setter is NvmlSetter and isinstance(devices, NvmlDevices):
        return NvmlSetter(devices)
    if setter is AmdsmiSetter and isinstance(devices, AmdsmiDevices):
        return AmdsmiSetter(devices)
    raise TypeError(f"route {authorization.route} does not match the devices opened ({type(devices).__name__})")


# ---- per device: the checks before any change ------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class DevicePlan:
    device: Device
    reading: Reading
    power_limit_mw: int | None  # to set, or None
    lock_mhz: int | None  # SM clock to lock, or None
    notes: tuple[str, ...] = ()


def plan_device(device: Device, reading: Reading, request: Request) -> DevicePlan:
    """What to set on `device`, or why not: range errors (ValidationError) and unsafe states (SettingRefused)."""
    setting = request.names
    if device.mig:
        raise SettingRefused(setting, f"{device.label} is in MIG mode, so a setting would change every instance on it",
                             "sweep on whole GPUs (MIG off)")
    if reading.persistence_mode is False:
        raise SettingRefused(setting, f"persistence mode is off on {device.label}: the driver may unload between the "
                                      "apply step and the run and drop the setting",
                             "ask the admins to run nvidia-persistenced (or nvidia-smi -pm 1)")
    power = lock = None
    notes: list[str] = []
    if request.power_limit_w is not None:
        limit_range = reading.power_limit_range_mw
        if reading.power_limit_mw is None or limit_range is None:
            raise SettingRefused(f"power_limit={fmt(request.power_limit_w)} W",
                                 f"{device.label} reports no power limit or range through NVML",
                                 "sweep sm_clock only on this GPU model")
        power = round(request.power_limit_w * 1000)
        low, high = (fmt(v / 1000) for v in limit_range)
        if not limit_range[0] <= power <= limit_range[1]:
            raise ValidationError(f"power_limit={fmt(request.power_limit_w)} W is outside the range of {device.label}, "
                                  f"{low}-{high} W", f"choose power limits within {low}-{high} W")
    if request.sm_clock_mhz is not None:
        wanted, clocks = request.sm_clock_mhz, reading.supported_sm_clocks_mhz
        if not clocks:
            raise SettingRefused(f"sm_clock={wanted} MHz", f"{device.label} reports no supported SM clocks through "
                                                           "NVML", "sweep power_limit only on this GPU model")
        if not clocks[0] <= wanted <= clocks[-1]:
            raise ValidationError(f"sm_clock={wanted} MHz is outside the supported SM clocks of {device.label}, "
                                  f"{clocks[0]}-{clocks[-1]} MHz", f"choose clocks within {clocks[0]}-{clocks[-1]} MHz")
        if reading.clock_held_by_setting:
            why, fix = (("its performance level is not AUTO", "amd-smi set --perf-level AUTO") if
                        reading.sm_clocks_continuous else
                        ("NVML clock event reason 'applications clocks setting'", "nvidia-smi -rgc, -rac"))
            raise SettingRefused(f"sm_clock={wanted} MHz", f"a clock setting already holds the clock of "
                                                           f"{device.label} ({why}), and it could not be restored "
                                                           "after the sweep",
                                 f"ask the admins to reset it ({fix}) before sweeping clocks, or sweep power_limit "
                                 "only")
        if reading.sm_clocks_continuous and reading.sm_clock_range_mhz is None:
            raise SettingRefused(f"sm_clock={wanted} MHz", f"{device.label} reports no current clock range, which "
                                                           "restore must write back", "sweep power_limit only on "
                                                                                      "this GPU model")
        lock = wanted if reading.sm_clocks_continuous else min(clocks, key=lambda c: (abs(c - wanted), -c))
        if lock != wanted:
            notes.append(f"{wanted} MHz is not a supported SM clock; locking the nearest, {lock} MHz")
    return DevicePlan(device, reading, power, lock, tuple(notes))


# ---- probe, apply, restore ---------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class ProbeResult:
    authorization: Authorization | None  # None: nothing requested
    readings: list[tuple[Device, Reading]] | None  # None: no NVML here (e.g. a login node)
    plans: list[DevicePlan]
    note: str | None = None


def probe(policy: str, request: Request, privileges: Privileges, zeusd_socket: str | None, vendor: str,
          selectors: Sequence[str] | None, login_node: bool = False) -> ProbeResult:
    """Can `request` be applied here? Reads only; raises the refusal or the range error, else says how.
    login_node: the GPUs (and a zeusd socket) are on other nodes: check the policy and the route only."""
    check_policy(policy)
    authorization = None if request.is_empty else authorize(policy, request, privileges, zeusd_socket, vendor,
                                                            socket_here=not login_node)
    if login_node:
        return ProbeResult(authorization, None, [], "login node: the device checks (ranges, persistence mode, clock "
                                                    "state) run in the job, on every GPU node, before any change")
    try:
        devices = open_devices(vendor)
    except MethodUnavailableError as exc:
        return ProbeResult(authorization, None, [], f"{exc}; the device checks (ranges, persistence mode, clock "
                                                    "state) run again in `apply` on the GPU node")
    try:
        readings = [(device, devices.read(device)) for device in devices.select(selectors)]
    finally:
        devices.close()
    plans = [] if request.is_empty else [plan_device(d, r, request) for d, r in readings]
    return ProbeResult(authorization, readings, plans)


def apply(authorization: Authorization, request: Request, devices: Devices, selectors: Sequence[str] | None,
          state_file: Path, job_id: str, node: str) -> tuple[SettingsState, list[dict[str, Any]]]:
    """Check every device, save the prior values, then set; on any failure roll every device back."""
    plans = [plan_device(d, devices.read(d), request) for d in devices.select(selectors)]
    if state_file.exists():
        raise ValidationError(f"state file {state_file} exists: settings of an earlier apply may still be in place",
                              f"run `python -m joulebench.device_settings restore --state {state_file}` first")
    setter = setter_for(authorization, devices)
    entries = [DeviceState(p.device.uuid, p.device.index, p.device.pci_bus_id, p.device.name,
                           p.reading.power_limit_mw, prior_sm_clock_range_mhz=None if p.reading.sm_clock_range_mhz
                           is None else list(p.reading.sm_clock_range_mhz)) for p in plans]
    state = SettingsState(state_file, job_id, node, authorization.route, request.to_dict(), entries)
    try:
        prepare_state_dir(state_file)
        state.save()
    except OSError as exc:
        raise OutputDirError(f"cannot write the state file {state_file} ({exc.strerror}); nothing was changed. Fix: "
                             "pass --state-dir (or --state) a directory this user may write") from exc
    try:
        for plan, entry in zip(plans, entries, strict=True):
            if plan.power_limit_mw is not None:
                state.touch(entry, "power_limit")
                setter.set_power_limit(plan.device.index, plan.device.handle, plan.power_limit_mw)
            if plan.lock_mhz is not None:
                state.touch(entry, "sm_clock")
                setter.lock_sm_clock(plan.device.index, plan.device.handle, plan.lock_mhz)
    except BaseException as exc:  # a failed call, or a signal turned into SystemExit: roll back either way
        failures = _restore_entries(state, devices, setter)
        rolled = ("every device is back at its prior settings" if not failures else
                  f"rolling back failed ({'; '.join(failures)}); state kept in {state_file}")
        if not isinstance(exc, Exception):
            raise
        raise DeviceSettingFailed(f"{request.names} failed on {_failed_device(plans, entries)}: {exc}; {rolled}",
                                  "check the reason; a permission error means this node does not grant what the "
                                  f"profile's {PROFILE_KEY} = allowed promises" + (
                                      "" if not failures else
                                      f"; then run `python -m joulebench.device_settings restore --state "
                                      f"{state_file}`")) from exc
    return state, [_applied(plan, devices.read(plan.device)) for plan in plans]


def _failed_device(plans: list[DevicePlan], entries: list[DeviceState]) -> str:
    """The device whose call failed: the last one with a touched setting."""
    touched = [p.device.label for p, e in zip(plans, entries, strict=True) if e.touched]
    return touched[-1] if touched else "the first device"


def _applied(plan: DevicePlan, after: Reading) -> dict[str, Any]:
    """One device's requested and read-back values, for the run record."""
    notes = list(plan.notes)
    if plan.power_limit_mw is not None and after.power_limit_mw != plan.power_limit_mw:
        notes.append(f"power limit read back {fmt(_w(after.power_limit_mw))} W, set {fmt(_w(plan.power_limit_mw))} W")
    return {
        "uuid": plan.device.uuid, "index": plan.device.index, "pci_bus_id": plan.device.pci_bus_id,
        "name": plan.device.name, "prior_power_limit_w": _w(plan.reading.power_limit_mw),
        "power_limit_w": _w(after.power_limit_mw), "enforced_power_limit_w": _w(after.enforced_power_limit_mw),
        "locked_sm_clock_mhz": plan.lock_mhz, "sm_clock_mhz_after_apply": after.sm_clock_mhz,
        "clock_held_by_setting": after.clock_held_by_setting, "notes": notes,
        # what analysis checks a recorded clock against (joulebench.analysis.plausible)
        "supported_sm_clock_range_mhz": [min(clocks), max(clocks)] if (clocks := plan.reading.supported_sm_clocks_mhz)
        else None,
    }


def _w(milliwatts: int | None) -> float | None:
    return None if milliwatts is None else milliwatts / 1000


def restore(state: SettingsState, devices: Devices, authorization: Authorization) -> list[str]:
    """Put back what the state file says was touched, verify by reading back, remove the file. A device that fails
    stays in the file (the others are restored) and DeviceSettingFailed says which."""
    setter = setter_for(authorization, devices)
    done_before = [e.label for e in state.devices]
    failures = _restore_entries(state, devices, setter)
    if failures:
        raise DeviceSettingFailed(f"restoring {state.path} failed on {'; '.join(failures)}; the state file keeps "
                                  "those devices", "check the reason, then run restore again (docs/sweeps.md, "
                                                   "'Restore by hand' if it keeps failing)")
    return done_before


def _restore_entries(state: SettingsState, devices: Devices, setter: Setter) -> list[str]:
    """Restore every device of the state; remove the file when all succeeded, else keep only the failed ones."""
    failures, remaining = [], []
    for entry in state.devices:
        try:
            _restore_device(entry, devices, setter)
        except DeviceCallError as exc:
            failures.append(f"{entry.label}: {exc}")
            remaining.append(entry)
    if remaining:
        state.devices = remaining
        state.save()
    else:
        state.remove()
    return failures


def _restore_device(entry: DeviceState, devices: Devices, setter: Setter) -> None:
    device = devices.by_uuid(entry.uuid)
    prior = entry.prior_power_limit_mw
    if "power_limit" in entry.touched and prior is not None and devices.read(device).power_limit_mw != prior:
        setter.set_power_limit(device.index, device.handle, prior)
    if "sm_clock" in entry.touched:
        setter.reset_sm_clock(device.index, device.handle, entry.prior_sm_clock_range_mhz)
    after = devices.read(device)
    if "power_limit" in entry.touched and after.power_limit_mw != entry.prior_power_limit_mw:
        raise DeviceCallError(f"power limit reads {fmt(_w(after.power_limit_mw))} W after the restore, prior "
                              f"{fmt(_w(entry.prior_power_limit_mw))} W")
    if "sm_clock" in entry.touched and after.clock_held_by_setting:
        raise DeviceCallError("a clock setting still holds the SM clock after the reset")
    prior_range = entry.prior_sm_clock_range_mhz
    if "sm_clock" in entry.touched and prior_range is not None and list(after.sm_clock_range_mhz or ()) != prior_range:
        raise DeviceCallError(f"the SM clock range reads {after.sm_clock_range_mhz} MHz after the restore, prior "
                              f"{tuple(prior_range)} MHz")
