"""The rapl backend on fake powercap trees: kinds and overlaps, J and wrap_at, permissions, vanishing zones."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest
import sysfs_trees

from jpwr.backends import create_backend
from jpwr.clock import VirtualClock
from jpwr.domains import Kind, Signal, Status
from jpwr.trace_io import TraceData
from jpwr.windows import WindowSpan, window_energy

MAX_UJ = 262_143_328_850
ZONES = {
    "intel-rapl:0": ("package-0", 1_000_000, MAX_UJ),
    "intel-rapl:0:0": ("core", 400_000, MAX_UJ),
    "intel-rapl:0:1": ("uncore", 50_000, MAX_UJ),
    "intel-rapl:0:2": ("dram", 200_000, 65_532_610_987),
    "intel-rapl:1": ("package-1", 2_000_000, MAX_UJ),
    "intel-rapl:2": ("psys", 9_000_000, MAX_UJ),
}


def _discover(root: Path):
    backend = create_backend("rapl", VirtualClock(), sysfs_root=root)
    return backend, backend.discover()


def test_zones_kinds_overlaps_and_wrap(tmp_path) -> None:
    _, disc = _discover(sysfs_trees.powercap(tmp_path, ZONES))
    domains = {d.id: d for d in disc.domains}
    assert {d.id: d.kind for d in disc.domains} == {
        "rapl:intel-rapl:0": Kind.CPU_PACKAGE, "rapl:intel-rapl:0:0": Kind.CPU_CORE,
        "rapl:intel-rapl:0:1": Kind.OTHER, "rapl:intel-rapl:0:2": Kind.DRAM,
        "rapl:intel-rapl:1": Kind.CPU_PACKAGE, "rapl:intel-rapl:2": Kind.OTHER,
    }
    assert domains["rapl:intel-rapl:0"].contains == ("rapl:intel-rapl:0:0", "rapl:intel-rapl:0:1")  # not dram
    assert domains["rapl:intel-rapl:0:2"].name == "package-0/dram"
    dram = next(s for s in disc.sensors if s.domain_id == "rapl:intel-rapl:0:2")
    assert dram.signal is Signal.ENERGY_COUNTER and dram.wrap_at == pytest.approx(65_532.610988)
    assert disc.unavailable == []


def test_raw_counter_in_joules_including_a_wrap(tmp_path) -> None:
    root = sysfs_trees.powercap(tmp_path, ZONES)
    backend, disc = _discover(root)
    package = [s for s in disc.sensors if s.domain_id == "rapl:intel-rapl:0"]
    assert backend.read(package)[0].value == pytest.approx(1.0)
    sysfs_trees.set_energy(root, "intel-rapl:0", 123)  # wrapped: the estimator unwraps with wrap_at
    (reading,) = backend.read(package)
    assert reading.status is Status.OK and reading.value == pytest.approx(123e-6)


def test_amd_rapl_names_accepted_mmio_duplicates_skipped(tmp_path) -> None:
    zones = {"amd-rapl:0": ("package-0", 5, 100), "intel-rapl-mmio:0": ("package-0", 5, 100)}
    root = sysfs_trees.powercap(tmp_path, zones)
    _, disc = _discover(root)
    assert [d.id for d in disc.domains] == ["rapl:amd-rapl:0"]


def test_no_powercap_is_unavailable(tmp_path) -> None:
    _, disc = _discover(tmp_path)
    assert disc.sensors == [] and disc.unavailable[0].startswith("rapl: unavailable: no RAPL zones")


def test_vanished_zone_reads_as_error(tmp_path) -> None:
    root = sysfs_trees.powercap(tmp_path, ZONES)
    backend, disc = _discover(root)
    shutil.rmtree(root / "class" / "powercap" / "intel-rapl:1")
    readings = {r.sensor_id: r for r in backend.read(disc.sensors)}
    gone = readings["rapl:intel-rapl:1/energy_counter"]
    assert gone.status is Status.ERROR and gone.value is None
    assert readings["rapl:intel-rapl:0/energy_counter"].status is Status.OK


def _discover_as_nobody(root: Path) -> list:
    """Root reads mode-000 files anyway, so a forked child drops to uid 65534 and discovers there."""
    backend = create_backend("rapl", VirtualClock(), sysfs_root=root)  # imported before the fork
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: no exec needed, so the interpreter's own permissions do not matter
        try:
            os.setgid(65534)
            os.setuid(65534)
            disc = backend.discover()
            os.write(write_end, json.dumps([len(disc.sensors), disc.unavailable]).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as fh:
        data = fh.read()
    os.waitpid(pid, 0)
    return json.loads(data)


@pytest.mark.machine_wide  # a jpwr-rapl-* directory in /tmp
def test_root_only_energy_uj_is_unavailable_permission() -> None:
    if os.geteuid() != 0:
        pytest.skip("covered by test_root_only_energy_uj_as_this_user")
    base = Path(tempfile.mkdtemp(prefix="jpwr-rapl-"))  # outside pytest's 0700 tmp dirs, so uid 65534 can enter
    try:
        base.chmod(0o755)
        root = sysfs_trees.powercap(base, {"intel-rapl:0": ("package-0", 1, 100)})
        sysfs_trees.deny(root / "class" / "powercap" / "intel-rapl:0" / "energy_uj")
        sensors, unavailable = _discover_as_nobody(root)
        assert sensors == 0 and len(unavailable) == 1
        assert unavailable[0].startswith("rapl: unavailable: intel-rapl:0: permission (")
        assert "CVE-2020-8694" in unavailable[0]
    finally:
        shutil.rmtree(base)


def test_root_only_energy_uj_as_this_user(tmp_path) -> None:
    if os.geteuid() == 0:
        pytest.skip("root can read mode-000 files; covered by test_root_only_energy_uj_is_unavailable_permission")
    root = sysfs_trees.powercap(tmp_path, {"intel-rapl:0": ("package-0", 1, 100)})
    sysfs_trees.deny(root / "class" / "powercap" / "intel-rapl:0" / "energy_uj")
    _, disc = _discover(root)
    assert disc.sensors == [] and "permission" in disc.unavailable[0] and "CVE-2020-8694" in disc.unavailable[0]


@pytest.mark.machine_wide  # a jpwr-rapl-* directory in /tmp
def test_rapl_needing_root_is_one_short_reason_for_the_headline(tmp_path) -> None:
    """With no accelerator and RAPL root-only, the window's energy is n/a for one short reason that says so;
    the backend's long line (the fix in full) is for `jpwr info` and the sampler's start, not every record."""
    if os.geteuid() == 0:
        base = Path(tempfile.mkdtemp(prefix="jpwr-rapl-"))  # outside pytest's 0700 tmp dirs, so uid 65534 can enter
        base.chmod(0o755)
    else:
        base = tmp_path
    try:
        root = sysfs_trees.powercap(base, {"intel-rapl:0": ("package-0", 1, 100), "intel-rapl:0:0": ("dram", 1, 100)})
        for zone in ("intel-rapl:0", "intel-rapl:0:0"):
            sysfs_trees.deny(root / "class" / "powercap" / zone / "energy_uj")
        unavailable = _discover_as_nobody(root)[1] if os.geteuid() == 0 else _discover(root)[1].unavailable
    finally:
        if base != tmp_path:
            shutil.rmtree(base)
    no_domains = TraceData(domains=[], sensors=[], info={}, readings={}, metrics=[], marks=[])
    energy = window_energy(no_domains, WindowSpan("steady", 0, 10**9, 1, {}), 0.1, "n1",
                           ["nvml: unavailable: nvmlInit failed", *unavailable])
    assert energy.energy_j is None and energy.domain is None
    assert energy.unavailable_reason == ("no accelerator sensor on node n1, and RAPL's energy_uj needs root: run as "
                                         "root or make it readable (`jpwr info` says how)")
