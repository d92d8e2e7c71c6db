"""CPU and DRAM energy through Linux powercap RAPL (`<sysfs>/class/powercap/intel-rapl:N[:M]`).

Each zone has `name` (package-N, core, uncore, dram, psys), `energy_uj` (cumulative µJ) and
`max_energy_range_uj`. The raw counter is reported in J with `wrap_at` = (max_energy_range_uj + 1) / 1e6;
the estimator unwraps it (read at least twice per wrap period). AMD Zen CPUs use the same driver and
directory names since Linux 5.8; `amd-rapl:*` zones are accepted too. `intel-rapl-mmio:*` zones duplicate
the MSR package zones and are skipped. The old `amd_energy` hwmon driver is not supported (not done).

Overlaps: core and uncore lie inside their package (`contains`); dram does not (it sits under the
package in sysfs but is a separate rail); psys (platform) is reported as OTHER without overlap claims.

`energy_uj` is root-only since CVE-2020-8694 (PLATYPUS): a non-root sampler gets "unavailable: permission".
"""

from __future__ import annotations

import re
from pathlib import Path

from jpwr.backends._base import SysfsMicroBackend, read_sysfs, unavailable
from jpwr.clock import Clock
from jpwr.domains import Discovery, Domain, Kind, Sensor, Signal
from jpwr.node import boot_id

NAME = "rapl"
_ZONE_DIR = re.compile(r"^(intel|amd)-rapl:(\d+)(?::(\d+))?$")
_KINDS = {"package": Kind.CPU_PACKAGE, "core": Kind.CPU_CORE, "uncore": Kind.OTHER, "dram": Kind.DRAM,
          "psys": Kind.OTHER}
_INSIDE_PACKAGE = ("core", "uncore")
PERMISSION_FIX = (
    "permission (energy_uj is root-only since CVE-2020-8694; run the sampler as root, or let a group read it, "
    "e.g. a udev/tmpfiles rule 'chmod 0440 + chgrp' on /sys/class/powercap/intel-rapl:*/energy_uj)"
)


class RaplBackend(SysfsMicroBackend):
    name = NAME

    def __init__(self, clock: Clock, sysfs_root: Path = Path("/sys")) -> None:
        self._clock = clock
        self._base = Path(sysfs_root) / "class" / "powercap"
        self._files: dict[str, Path] = {}  # sensor id -> energy_uj

    def discover(self) -> Discovery:
        disc = Discovery(NAME)
        zones = sorted(p for p in self._base.glob("*-rapl:*") if _ZONE_DIR.match(p.name)) if self._base.is_dir() else []
        if not zones:
            disc.unavailable.append(unavailable(NAME, f"no RAPL zones under {self._base} (no intel_rapl driver?)"))
            return disc
        names: dict[str, str] = {}
        denied: list[str] = []
        self._files = {}
        for zone in zones:
            try:
                name = read_sysfs(zone / "name")
                read_sysfs(zone / "energy_uj")
                max_range_uj = int(read_sysfs(zone / "max_energy_range_uj"))
            except PermissionError:
                denied.append(zone.name)
                continue
            except (OSError, ValueError) as exc:
                disc.unavailable.append(unavailable(NAME, f"{zone.name}: {exc}"))
                continue
            names[zone.name] = name
            domain_id = f"{NAME}:{zone.name}"
            sensor = Sensor(f"{domain_id}/energy_counter", domain_id, Signal.ENERGY_COUNTER,
                            est_update_s=0.001, resolution=1e-6, wrap_at=(max_range_uj + 1) / 1e6)
            self._files[sensor.id] = zone / "energy_uj"
            disc.sensors.append(sensor)
        host = boot_id()
        for zone_dir, name in names.items():
            parent = zone_dir.rsplit(":", 1)[0] if zone_dir.count(":") == 2 else None
            label = f"{names.get(parent, parent)}/{name}" if parent else name
            children = tuple(f"{NAME}:{z}" for z, n in names.items()
                             if z.startswith(zone_dir + ":") and n in _INSIDE_PACKAGE)
            kind = _KINDS.get(name.split("-")[0], Kind.OTHER)
            disc.domains.append(Domain(f"{NAME}:{zone_dir}", NAME, kind, label, contains=children,
                                       device_uuid=f"{NAME}:{host}:{zone_dir}",  # node identities share a host
                                       attrs=(("sysfs", str(self._base / zone_dir)),)))
        if denied:
            disc.unavailable.append(unavailable(NAME, f"{', '.join(denied)}: {PERMISSION_FIX}"))
        return disc
