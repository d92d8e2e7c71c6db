"""The benchmark scripts end non-zero when a row failed, and a missing extra is the drivers' one-line error.

Real runs of the scripts on the CPU, each over in seconds: a row the driver refuses at once (a global batch of 0)
and an interpreter without torch or transformers (a venv of its own, no site-packages: only numpy and this checkout
import), where the scripts printed a traceback.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy

from benchmarks.common import exit_status

REPO = Path(__file__).resolve().parents[2]


def _bare_python(tmp_path: Path) -> tuple[str, dict[str, str]]:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "venv")], check=True, timeout=60)
    (tmp_path / "numpy").mkdir()
    for entry in Path(numpy.__file__).parent.parent.iterdir():
        if entry.name == "numpy" or entry.name.startswith(("numpy-", "numpy.libs")):
            (tmp_path / "numpy" / entry.name).symlink_to(entry)
    return str(tmp_path / "venv" / "bin" / "python"), {"PATH": os.environ["PATH"], "PYTHONPATH": os.pathsep.join(
        [str(REPO), str(tmp_path / "numpy")])}


def _script(python: str, env: dict[str, str], tmp_path: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([python, *argv], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)


def test_a_failed_row_ends_the_script_non_zero_with_the_drivers_error(tmp_path: Path) -> None:
    result = _script(sys.executable, {**os.environ, "PYTHONPATH": str(REPO)}, tmp_path,
                     str(REPO / "benchmarks" / "resnet50_h100.py"), "--out", str(tmp_path / "b"), "--device", "cpu",
                     "--methods", "auto", "--per-gpu-batch", "0", "--only", "eager")
    assert result.returncode == 1, result.stdout + result.stderr
    row = next(line for line in result.stdout.splitlines() if line.startswith("eager "))
    assert row.split(None, 1)[1] == ("no run record: python -m resnet50 train: error: argument --global-batch-size: 0 "
                                     "is out of range (expected a whole number in [1, 1048576])")


def test_a_missing_extra_is_one_line_not_a_traceback(tmp_path: Path) -> None:
    python, env = _bare_python(tmp_path)
    resnet = _script(python, env, tmp_path, str(REPO / "benchmarks" / "resnet50_h100.py"), "--out", "b",
                     "--device", "cpu")
    assert resnet.returncode == 69 and resnet.stderr.strip() == (
        "benchmarks/resnet50_h100.py: error: torch is not installed (an optional extra this command needs). Fix: pip "
        "install 'joulebench[resnet-pytorch]'")
    # the engine sweep's CPU smoke line (docs/llm_inference.md): its logits check and its driver each say it in a line
    engine = _script(python, env, tmp_path, str(REPO / "benchmarks" / "inference_engine_h100.py"), "--presets", "tiny",
                     "--batch-sizes", "2", "--engines", "static", "--device", "cpu", "--out-dir", "e")
    assert engine.returncode == 1 and "Traceback" not in engine.stderr, engine.stderr
    errors = [line for line in engine.stderr.splitlines() if ": error: " in line]
    assert errors == [
        "benchmarks/inference_engine_h100.py: error: torch is not installed (an optional extra this command needs). "
        "Fix: pip install 'joulebench[inference]'",
        "llm_inference: error: torch is not installed (an optional extra this command needs). Fix: pip install "
        "'joulebench[inference]'"], engine.stderr
    assert "| tiny | 2 | static | no record (exit 69) |" in engine.stdout
    assert max(map(len, engine.stdout.splitlines())) <= 160, engine.stdout  # its command, heading and tables (issue 62)


def test_no_rows_or_one_failed_row_is_a_failure() -> None:
    assert exit_status([{"status": "OK"}, {"status": "OK"}]) == 0
    assert exit_status([{"status": "OK"}, {"status": "FAILED"}]) == 1
    assert exit_status([]) == 1  # nothing measured is no success either

