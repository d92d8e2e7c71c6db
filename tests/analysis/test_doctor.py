"""`joulebench doctor` names a broken torch/torchvision pair and each missing extra, with the fix, and exits 69; a
sound install exits 0. The demo checks its extras the same way before it trains.

The broken pair is a torchvision that raises the real error of a CUDA torchvision beside a CPU torch (a package on
PYTHONPATH, ahead of the installed one: the third-party boundary); transformers then fails with its own real message,
as it did on the machine of issue 62. The missing extras are real: a Python environment without site-packages, only
numpy (what the meter itself imports) and this checkout on its path.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy

from jpwr.errors import WIDTH

REPO = Path(__file__).resolve().parents[2]
BROKEN_TORCHVISION = 'raise RuntimeError("operator torchvision::nms does not exist")\n'


def _doctor(python: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([python, "-m", "joulebench", "doctor"], env=env, cwd=cwd, capture_output=True, text=True,
                            timeout=180)
    assert all(len(line) <= WIDTH for line in result.stdout.splitlines()), result.stdout
    return result


def _finding(stdout: str, start: str) -> str:
    """The finding whose first line starts with `start`, its wrapped lines joined."""
    findings = [line for line in stdout.replace("\n    ", " ").splitlines() if line.startswith(start)]
    assert len(findings) == 1, stdout
    return findings[0]


def test_a_broken_torch_pair_is_named_with_its_fix_and_the_sensor_found(tmp_path: Path, fake_env,
                                                                        h100_trace_dir: Path) -> None:
    (tmp_path / "broken" / "torchvision").mkdir(parents=True)
    (tmp_path / "broken" / "torchvision" / "__init__.py").write_text(BROKEN_TORCHVISION)
    env = fake_env(JPWR_FAKE_NVML_TRACE=str(h100_trace_dir))
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path / "broken"), env["PYTHONPATH"]])
    result = _doctor(sys.executable, env, tmp_path)
    assert result.returncode == 69, result.stdout + result.stderr
    pair = _finding(result.stdout, "FIX   torch ")
    assert "and torchvision" in pair and "do not belong together" in pair and "torchvision::nms does not exist" in pair
    assert "Fix: pip install --force-reinstall --no-deps 'torchvision==0." in pair
    assert "pip uninstall torchvision" in pair
    hf = _finding(result.stdout, "note  transformers ")
    assert "Could not import module 'LlamaConfig'" in hf and "the torchvision above is why" in hf
    assert _finding(result.stdout, "ok    the quick start")  # its extras are all there: the pair alone blocks
    assert "nvml: 1 domain(s) (gpu NVIDIA H100" in _finding(result.stdout, "ok    sensors: ")  # the fake H100
    assert result.stdout.splitlines()[-1].startswith("joulebench doctor: 1 problem(s) marked FIX block the quick start")


def _bare_python(tmp_path: Path) -> tuple[str, dict[str, str]]:
    """A venv of its own (no site-packages) and an environment in which only numpy and this checkout import, so
    neither torch nor the report libraries are installed."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "venv")], check=True, timeout=60)
    (tmp_path / "numpy").mkdir()
    numpy_dir = Path(numpy.__file__).parent
    for entry in numpy_dir.parent.iterdir():  # numpy and its dist-info (and numpy.libs where the wheel has one)
        if entry.name == "numpy" or entry.name.startswith(("numpy-", "numpy.libs")):
            (tmp_path / "numpy" / entry.name).symlink_to(entry)
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": os.pathsep.join([str(REPO), str(tmp_path / "numpy")])}
    return str(tmp_path / "venv" / "bin" / "python"), env


def test_missing_extras_are_named_with_the_pip_line(tmp_path: Path) -> None:
    result = _doctor(*_bare_python(tmp_path), tmp_path)
    assert result.returncode == 69, result.stdout + result.stderr
    quick = _finding(result.stdout, "FIX   the quick start")
    assert "llm: torch, megatron-core" in quick and "reports: matplotlib, pandas" in quick
    assert quick.endswith("Fix: pip install 'joulebench[llm,reports]'")
    assert "resnet-pytorch: torch, torchvision" in _finding(result.stdout, "note  the JUBE workflows")
    assert "torch " not in result.stdout.partition("\n")[2].split("FIX   the quick start")[0]  # no torch to import


def test_a_sound_install_exits_0(tmp_path: Path) -> None:
    result = _doctor(sys.executable, {**os.environ, "PYTHONPATH": str(REPO)}, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "FIX" not in result.stdout and _finding(result.stdout, "ok    torch ")
    assert result.stdout.splitlines()[-1].startswith("joulebench doctor: nothing blocks the quick start (exit 0)")


def test_the_demo_checks_its_extras_before_it_trains(tmp_path: Path) -> None:
    """All missing extras at once, before the training (the plot step needs reports: it stopped there, after
    training, and the next demo was refused for the directory the first had left)."""
    python, env = _bare_python(tmp_path)
    result = subprocess.run([python, "-m", "joulebench", "demo", "--out", "demo"], env=env, cwd=tmp_path,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 69 and result.stdout == "", result.stdout + result.stderr
    assert result.stderr.strip() == (
        "joulebench demo: error: joulebench demo needs extras that are not installed (llm: torch, megatron-core, "
        "psutil, tokenizers; reports: matplotlib, pandas). Fix: pip install 'joulebench[llm,reports]'")
    assert not (tmp_path / "demo").exists()
