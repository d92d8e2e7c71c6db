"""The state file: each device's prior settings, written before the first change, so that any later process can
put them back (the job's own exit paths, or a Slurm epilog after SIGKILL, OOM or node loss).

It is a write-ahead log: the file exists, with every device's prior power limit, before any set call; a setting is
marked `touched` on its device before the call that changes it; restore undoes exactly the touched settings and
removes the file. Every write is atomic (temporary file + rename), so a crash leaves the old or the new content.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

from jpwr import FormatError, ValidationError
from jpwr.output import utc_now, write_json_atomic

STATE_KIND = "joulebench.device_settings_state"
STATE_VERSION = 1
DEFAULT_STATE_DIR = "/var/tmp/joulebench-device-settings"
SETTINGS = ("power_limit", "sm_clock")


@dataclasses.dataclass
class DeviceState:
    """One device as the state file keeps it: identity, prior power limit (and clock range), settings possibly
    changed."""

    uuid: str
    index: int
    pci_bus_id: str
    name: str
    prior_power_limit_mw: int | None  # None: unreadable (then only the clocks may be changed)
    touched: list[str] = dataclasses.field(default_factory=list)
    prior_sm_clock_range_mhz: list[int] | None = None  # AMD: the clock range restore writes back (NVML resets)

    @property
    def label(self) -> str:
        return f"device {self.index} ({self.name}, {self.uuid})"


@dataclasses.dataclass
class SettingsState:
    path: Path
    job_id: str
    node: str
    route: str
    request: dict[str, Any]
    devices: list[DeviceState]
    created_at: str = dataclasses.field(default_factory=utc_now)

    def save(self) -> None:
        write_json_atomic(self.path, {
            "kind": STATE_KIND, "version": STATE_VERSION, "job_id": self.job_id, "node": self.node,
            "route": self.route, "request": self.request, "created_at": self.created_at,
            "devices": [dataclasses.asdict(d) for d in self.devices],
        })

    def touch(self, device: DeviceState, setting: str) -> None:
        """Mark `setting` of `device` as possibly changed, on disk, before the call that changes it."""
        if setting not in device.touched:
            device.touched.append(setting)
            self.save()

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)

    @classmethod
    def load(cls, path: Path) -> SettingsState:
        try:
            data = json.loads(path.read_text())
            if data.get("kind") != STATE_KIND or data.get("version") != STATE_VERSION:
                raise ValueError(f"kind {data.get('kind')!r}, version {data.get('version')!r}")
            return cls(path, str(data["job_id"]), str(data["node"]), str(data["route"]), dict(data["request"]),
                       [DeviceState(**d) for d in data["devices"]], str(data["created_at"]))
        except (UnicodeDecodeError, ValueError, AttributeError, KeyError, TypeError) as exc:
            raise FormatError(f"{path} is not a joulebench device-settings state file of version {STATE_VERSION} "
                              f"({exc})", "restore by hand (docs/sweeps.md, 'Restore by hand') and delete the file"
                              ) from None


def state_path(explicit: str | None, state_dir: str, job_id: str, node: str) -> Path:
    """The state file of this job on this node: explicit, else <state_dir>/<job id>.<node>.json."""
    return Path(explicit) if explicit else Path(state_dir) / f"{job_id}.{node}.json"


def prepare_state_dir(path: Path) -> None:
    """Create the state directory world-writable with the sticky bit (like /tmp) when we are first, so that every
    user's jobs can keep state there and none can remove another's."""
    directory = path.parent
    if not directory.exists():
        directory.mkdir(parents=True, exist_ok=True)
        os.chmod(directory, 0o1777)


def check_owner(path: Path, euid: int, job_uid: str | None) -> None:
    """A privileged restore (epilog) trusts only files written by root or by the job's own user: any other user could
    otherwise plant settings for someone else's job."""
    if euid != 0:
        return
    owner = path.lstat().st_uid
    allowed = {0} | ({int(job_uid)} if job_uid and job_uid.isdigit() else set())
    if path.is_symlink() or owner not in allowed:
        raise ValidationError(
            f"state file {path} is owned by uid {owner}{' (a symlink)' if path.is_symlink() else ''}, not by root or "
            f"the job's user ({job_uid or 'SLURM_JOB_UID unset'})",
            "restore only files the job wrote; remove this one after checking it",
        )
