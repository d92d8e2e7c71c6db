"""The hwmon_gh backend on fake Grace Hopper hwmon trees; GPU domains come from the nvml backend on the fake pynvml."""

from __future__ import annotations

import shutil

import pytest
import sysfs_trees

from jpwr.backends import create_backend
from jpwr.clock import VirtualClock
from jpwr.domains import Kind, Signal, Status

TWO_SOCKETS = [
    ("Module Power Socket 0", 650_000_000, 50),
    ("Grace Power Socket 0", 120_000_000, 50),
    ("CPU Power Socket 0", 90_000_000, 50),
    ("SysIO Power Socket 0", 30_000_000, 50),
    ("Module Power Socket 1", 600_000_000, 50),
]


@pytest.fixture
def gpu_domains(fake_pynvml, h100_trace_dir):
    clock = VirtualClock()
    fake_pynvml.configure(h100_trace_dir, clock, devices=2)
    backend = create_backend("nvml", clock)
    domains = backend.discover().domains
    backend.close()
    return domains


def _discover(root, gpu_domains=()):
    backend = create_backend("gh", VirtualClock(), sysfs_root=root, gpu_domains=gpu_domains)
    return backend, backend.discover()


def test_labels_kinds_windows_and_module_contains_its_gpu(tmp_path, gpu_domains) -> None:
    _, disc = _discover(sysfs_trees.gh_hwmon(tmp_path, TWO_SOCKETS), gpu_domains)
    by_label = {d.name: d for d in disc.domains}
    assert [d.kind for d in disc.domains] == [Kind.MODULE, Kind.CPU_PACKAGE, Kind.CPU_PACKAGE, Kind.OTHER, Kind.MODULE]
    gpu0, gpu1 = sorted(gpu_domains, key=lambda d: d.index)
    assert by_label["Module Power Socket 0"].contains == (gpu0.id,)
    assert by_label["Module Power Socket 1"].contains == (gpu1.id,)
    assert by_label["Grace Power Socket 0"].contains == ()
    assert by_label["Module Power Socket 0"].id == "hwmon_gh:module_power_socket_0"
    assert all(s.signal is Signal.POWER_AVERAGE and s.avg_window_s == 0.05 for s in disc.sensors)


def test_power_in_watts_and_files_directly_in_hwmon(tmp_path) -> None:
    root = sysfs_trees.gh_hwmon(tmp_path, [("Module Power Socket 0", 612_345_678, 1000)], in_device=False)
    backend, disc = _discover(root)
    assert backend.read(disc.sensors)[0].value == pytest.approx(612.345678)
    sysfs_trees.set_gh_power(root, "hwmon0", 100_000_000)
    assert backend.read(disc.sensors)[0].value == pytest.approx(100.0)
    assert disc.sensors[0].avg_window_s == 1.0


def test_single_module_contains_every_gpu_given(tmp_path, gpu_domains) -> None:
    _, disc = _discover(sysfs_trees.gh_hwmon(tmp_path, [("Module Power Socket 0", 1, 50)]), gpu_domains)
    assert set(disc.domains[0].contains) == {d.id for d in gpu_domains}


def test_vanishing_hwmon_gives_error_readings_not_a_crash(tmp_path) -> None:
    root = sysfs_trees.gh_hwmon(tmp_path, TWO_SOCKETS[:2])
    backend, disc = _discover(root)
    shutil.rmtree(root / "class" / "hwmon" / "hwmon0")
    statuses = [r.status for r in backend.read(disc.sensors)]
    assert statuses == [Status.ERROR, Status.OK]


def test_machine_without_power_meters_is_unavailable(tmp_path) -> None:
    root = sysfs_trees.gh_hwmon(tmp_path, [])  # only an unrelated hwmon
    _, disc = _discover(root)
    assert disc.sensors == [] and "no ACPI power meter" in disc.unavailable[0]
