"""NVIDIA Grace Hopper (GH200) module, CPU and SoC power through the ACPI power-meter hwmon devices.

Each meter has `power1_average` (µW, the mean over the last `power1_average_interval` ms) and a label in
`power1_oem_info`: "Module Power Socket N", "Grace Power Socket N", "CPU Power Socket N" or
"SysIO Power Socket N". Depending on the kernel the files sit in `hwmonK/` or `hwmonK/device/`; both are read.

Coverage: Module = GPU + HBM + CPU + LPDDR + regulator loss, so the Module domain `contains` the NVML GPU
domain(s) of its socket and totals never add both. Socket N's module is paired with the NVML GPU whose
index is N (NVML enumerates in PCI order, which follows the socket order on GH200 nodes: an assumption,
recorded in the domain's attrs); a node with one module pairs it with every GPU given. Grace and CPU become
CPU_PACKAGE domains, SysIO OTHER. No counter: each reading is an average over the interval before it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from jpwr.backends._base import SysfsMicroBackend, read_sysfs, unavailable
from jpwr.clock import Clock
from jpwr.domains import Discovery, Domain, Kind, Sensor, Signal

NAME = "hwmon_gh"
_KINDS = {"module": Kind.MODULE, "grace": Kind.CPU_PACKAGE, "cpu": Kind.CPU_PACKAGE, "sysio": Kind.OTHER}


def _hwmon_number(path: Path) -> int:
    suffix = path.name[len("hwmon") :]
    return int(suffix) if suffix.isdigit() else -1


class HwmonGhBackend(SysfsMicroBackend):
    name = NAME

    def __init__(self, clock: Clock, sysfs_root: Path = Path("/sys"), gpu_domains: Sequence[Domain] = ()) -> None:
        self._clock = clock
        self._base = Path(sysfs_root) / "class" / "hwmon"
        self._gpus = [d for d in gpu_domains if d.kind is Kind.GPU]
        self._files: dict[str, Path] = {}  # sensor id -> power1_average

    def discover(self) -> Discovery:
        disc = Discovery(NAME)
        hwmons = sorted(self._base.glob("hwmon*"), key=_hwmon_number) if self._base.is_dir() else []
        meters: list[tuple[str, Path, float | None]] = []  # label, directory, averaging interval
        self._files = {}
        for hwmon in hwmons:
            folder = next((d for d in (hwmon, hwmon / "device") if (d / "power1_oem_info").is_file()), None)
            if folder is None:
                continue
            try:
                label = read_sysfs(folder / "power1_oem_info")
                read_sysfs(folder / "power1_average")
            except OSError as exc:
                disc.unavailable.append(unavailable(NAME, f"{hwmon.name}: {exc}"))
                continue
            try:
                interval_s: float | None = int(read_sysfs(folder / "power1_average_interval")) / 1000.0
            except (OSError, ValueError):
                interval_s = None
            meters.append((label, folder, interval_s))
        if not meters:
            disc.unavailable.append(unavailable(NAME, f"no ACPI power meter with power1_oem_info under {self._base}"))
            return disc
        modules = sum(label.lower().startswith("module") for label, _, _ in meters)
        for label, folder, interval_s in meters:
            domain = self._domain(label, folder, modules)
            sensor = Sensor(f"{domain.id}/power_average", domain.id, Signal.POWER_AVERAGE,
                            est_update_s=interval_s, avg_window_s=interval_s, resolution=1e-6)
            self._files[sensor.id] = folder / "power1_average"
            disc.domains.append(domain)
            disc.sensors.append(sensor)
        return disc

    def _domain(self, label: str, folder: Path, modules: int) -> Domain:
        kind = _KINDS.get(label.split()[0].lower(), Kind.OTHER)
        slug = re.sub(r"[^a-z0-9]+", "_", label.lower()).strip("_")
        contains: tuple[str, ...] = ()
        attrs = [("sysfs", str(folder)), ("oem_info", label)]
        if kind is Kind.MODULE and self._gpus:
            socket = re.search(r"socket\s*(\d+)", label, re.IGNORECASE)
            if modules == 1:
                contains = tuple(d.id for d in self._gpus)
            elif socket:
                contains = tuple(d.id for d in self._gpus if d.index == int(socket.group(1)))
                attrs.append(("gpu_pairing", "socket N = NVML index N (assumed)"))
        return Domain(f"{NAME}:{slug}", NAME, kind, label, contains=contains, attrs=tuple(attrs))
