"""benchmarks/slurm_gpu_h100.py's own pieces on the CPU: the .deb unpacker it uses where a GPU machine has no apt (a
real package built with dpkg-deb, a library link inside it), the per-request agreement of a JUBE row with an in-process
run (the recorded H100 requests tables), and its refusal of an unknown part. Its GPU run is docs/BENCHMARKS.md's."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.slurm_gpu_h100 import quantiles_agree, request_quantiles, unpack_debs

REPO = Path(__file__).resolve().parents[2]
RAW = REPO / "benchmarks" / "results" / "2026-12-06-slurm-gpu" / "call4-inference-per-request"


@pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="needs dpkg-deb to build a package")
def test_a_package_s_files_and_links_are_unpacked_under_the_root(tmp_path: Path) -> None:
    tree = tmp_path / "pkg"
    (tree / "DEBIAN").mkdir(parents=True)
    (tree / "DEBIAN" / "control").write_text("Package: jb-test\nVersion: 1.0\nArchitecture: all\n"
                                             "Maintainer: tests <t@example.org>\nDescription: a test\n")
    (tree / "usr" / "lib").mkdir(parents=True)
    (tree / "usr" / "lib" / "libjb.so.2.0.0").write_text("library")
    (tree / "usr" / "lib" / "libjb.so.2").symlink_to("libjb.so.2.0.0")
    (tmp_path / "debs").mkdir()
    subprocess.run(["dpkg-deb", "--build", "--root-owner-group", str(tree), str(tmp_path / "debs" / "jb.deb")],
                   check=True, capture_output=True)
    unpack_debs(tmp_path / "debs", tmp_path / "root")
    unpacked = tmp_path / "root" / "usr" / "lib"
    assert (unpacked / "libjb.so.2").read_text() == "library" and (unpacked / "libjb.so.2").is_symlink()
    assert not (tmp_path / "root" / "DEBIAN").exists()  # the control part is not unpacked


def test_the_recorded_jube_row_and_in_process_run_agree_within_their_intervals() -> None:
    jube = request_quantiles(RAW / "inference" / "000000" / "000003_submit" / "work" / "run" / "requests.h5")
    own = request_quantiles(RAW / "inference-in-process" / "requests.h5")
    for quantiles in (jube, own):
        assert all(low <= value <= high for low, value, high in quantiles.values()), quantiles
    assert jube["p50"][1] == pytest.approx(24.581, abs=1e-3) and own["p90"][1] == pytest.approx(34.770, abs=1e-3)
    assert quantiles_agree(jube, own) == {"p50": True, "p90": True}
    shifted = {q: [v + 2.0 for v in values] for q, values in own.items()}  # 2 J more than both half-widths allow
    assert quantiles_agree(jube, shifted) == {"p50": False, "p90": False}


def test_an_unknown_part_is_refused_before_any_cluster_starts(tmp_path: Path) -> None:
    refused = subprocess.run([sys.executable, str(REPO / "benchmarks" / "slurm_gpu_h100.py"), "--out", str(tmp_path),
                              "--parts", "pair,bogus"], capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "unknown part(s) bogus" in refused.stderr
    assert not list(tmp_path.iterdir())
