"""tests/venv.sh (the test command's first step) never changes the torch of a venv: a working torch/torchvision pair
stays (the extras go in under a constraint of exactly its versions), a broken pair is named with its fix and nothing
is installed (exit 69), and only a venv without torch gets the pinned build (CI's fresh machine).

Each venv is a real one of its own without pip or site-packages (`python -m venv --without-pip`, under a second),
holding stand-ins at the third-party boundary: a `torch` and a `torchvision` (the broken one raises the real error of a
CUDA torchvision beside a CPU torch) with their distribution metadata, and a `pip` that records what it was asked to
install instead of downloading gigabytes.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
VENV_SH = REPO / "tests" / "venv.sh"
# what it was asked, one line, then each line of a constraint file it was given (venv.sh removes that file on exit)
FAKE_PIP = """import os, sys
with open(os.environ["FAKE_PIP_LOG"], "a") as log:
    log.write(" ".join(sys.argv[1:]) + "\\n")
    if "-c" in sys.argv:
        log.writelines(f"constraint {line}" for line in open(sys.argv[sys.argv.index("-c") + 1]))
"""
TORCHVISION = {"working": "", "broken": 'raise RuntimeError("operator torchvision::nms does not exist")\n'}


def _package(site: Path, name: str, version: str, code: str) -> None:
    (site / name).mkdir()
    (site / name / "__init__.py").write_text(f"__version__ = {version!r}\n{code}")
    info = site / f"{name}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


def _venv(tmp_path: Path, torch: str | None, torchvision: str | None) -> tuple[Path, Path]:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    site = next(venv.glob("lib/python3*/site-packages"))
    (site / "pip").mkdir()
    (site / "pip" / "__main__.py").write_text(FAKE_PIP)
    if torch:
        _package(site, "torch", torch, "")
    if torchvision:
        _package(site, "torchvision", "0.29.1", TORCHVISION[torchvision])
    return venv, tmp_path / "pip.log"


def _prepare(venv: Path, log: Path) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    env = {"PATH": os.environ["PATH"], "FAKE_PIP_LOG": str(log), "HOME": str(venv.parent)}
    result = subprocess.run(["bash", str(VENV_SH), str(venv)], env=env, capture_output=True, text=True, timeout=120)
    return result, log.read_text().splitlines() if log.exists() else []


def test_a_working_pair_stays_and_constrains_the_extras(tmp_path: Path) -> None:
    venv, log = _venv(tmp_path, torch="2.13.0+cpu", torchvision="working")
    result, calls = _prepare(venv, log)
    assert result.returncode == 0, result.stderr
    assert len(calls) == 3 and calls[0].startswith("install -q -c ") and f"-e {REPO}[test," in calls[0], calls
    assert calls[1:] == ["constraint torch==2.13.0+cpu", "constraint torchvision==0.29.1"]  # exactly the venv's pair
    assert "installing the pinned" not in result.stderr


@pytest.mark.parametrize("case", ["broken torchvision", "no torchvision"])
def test_a_broken_pair_is_named_with_its_fix_and_nothing_installed(case: str, tmp_path: Path) -> None:
    venv, log = _venv(tmp_path, torch="2.13.0+cpu", torchvision="broken" if case == "broken torchvision" else None)
    result, calls = _prepare(venv, log)
    assert result.returncode == 69 and calls == [], (result.stderr, calls)
    line = result.stderr.strip()
    assert line.startswith(f"tests/venv.sh: error: torch and torchvision of {venv} do not import together (")
    assert ("torchvision::nms does not exist" if case == "broken torchvision" else "No module named 'torchvision'") \
        in line
    assert "Fix: pip install --force-reinstall --no-deps 'torchvision==0.28.*' --index-url " \
           "https://download.pytorch.org/whl/cpu" in line and f"{venv}/bin/joulebench doctor" in line


def test_a_venv_without_torch_gets_the_pinned_build(tmp_path: Path) -> None:
    venv, log = _venv(tmp_path, torch=None, torchvision=None)
    result, calls = _prepare(venv, log)
    assert result.returncode == 0, result.stderr
    assert calls[0] == "install -q torch==2.14.1 torchvision==0.29.1" and calls[1].startswith("install -q -c "), calls
