"""Builders for fake sysfs trees (powercap RAPL, Grace Hopper hwmon), passed to backends as a root path.

Files hold what the kernel would print; tests change them between reads. Permission faults: chmod 000
does not stop root, so `deny` removes read permission and tests that need a real PermissionError read the
tree as an unprivileged user (see tests/jpwr/test_backend_rapl.py).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path


def powercap(root: Path, zones: dict[str, tuple[str, int, int]]) -> Path:
    """zones: {"intel-rapl:0": ("package-0", energy_uj, max_energy_range_uj), "intel-rapl:0:0": ("core", ...)}.

    Real /sys/class/powercap lists every zone (sub-zones too) flat, as symlinks; plain directories suffice.
    """
    base = root / "class" / "powercap"
    (base / "intel-rapl").mkdir(parents=True, exist_ok=True)  # the control-type directory, not a zone
    for zone, (name, energy_uj, max_uj) in zones.items():
        (base / zone).mkdir(parents=True, exist_ok=True)
        (base / zone / "name").write_text(name + "\n")
        (base / zone / "energy_uj").write_text(f"{energy_uj}\n")
        (base / zone / "max_energy_range_uj").write_text(f"{max_uj}\n")
    return root


def set_energy(root: Path, zone: str, energy_uj: int) -> None:
    """Replace the counter as the kernel does: a reader sees the old value or the new one, never half a line."""
    path = root / "class" / "powercap" / zone / "energy_uj"
    tmp = path.with_name(".energy_uj.tmp")
    tmp.write_text(f"{energy_uj}\n")
    os.replace(tmp, path)


@contextlib.contextmanager
def drawing(root: Path, watts: Mapping[str, float], tick_s: float = 0.01) -> Iterator[None]:
    """Zones whose counters climb at constant power (µJ from wall time, every `tick_s`) while the block runs,
    as RAPL's do under a steady load; for a process that meters the tree (JPWR_SYSFS_ROOT)."""
    start = {zone: int((root / "class" / "powercap" / zone / "energy_uj").read_text()) for zone in watts}
    t0 = time.monotonic()
    stop = threading.Event()

    def climb() -> None:
        while not stop.wait(tick_s):
            elapsed = time.monotonic() - t0
            for zone, power in watts.items():
                set_energy(root, zone, start[zone] + int(power * elapsed * 1e6))

    thread = threading.Thread(target=climb, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def deny(path: Path) -> None:
    """Make a file unreadable for non-root users (mode 000), as energy_uj is since CVE-2020-8694."""
    path.chmod(0)


def gh_hwmon(root: Path, meters: Sequence[tuple[str, int, int]], in_device: bool = True, first: int = 0) -> Path:
    """meters: [(power1_oem_info label, power1_average µW, power1_average_interval ms), ...].

    Each becomes hwmon<first+i> named "power_meter"; files go in hwmonK/device/ (older kernels) or hwmonK/.
    A non-meter hwmon (a temperature sensor) is added first so discovery has to skip it.
    """
    base = root / "class" / "hwmon"
    other = base / f"hwmon{first + len(meters)}"
    other.mkdir(parents=True, exist_ok=True)
    (other / "name").write_text("nvme\n")
    (other / "temp1_input").write_text("35000\n")
    for i, (label, microwatts, interval_ms) in enumerate(meters):
        hwmon = base / f"hwmon{first + i}"
        folder = hwmon / "device" if in_device else hwmon
        folder.mkdir(parents=True, exist_ok=True)
        (hwmon / "name").write_text("power_meter\n")
        (folder / "power1_oem_info").write_text(label + "\n")
        (folder / "power1_average").write_text(f"{microwatts}\n")
        (folder / "power1_average_interval").write_text(f"{interval_ms}\n")
    return root


def set_gh_power(root: Path, hwmon: str, microwatts: int) -> None:
    base = root / "class" / "hwmon" / hwmon
    folder = base / "device" if (base / "device" / "power1_average").exists() else base
    (folder / "power1_average").write_text(f"{microwatts}\n")
