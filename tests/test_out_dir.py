"""The drivers refuse an --out-dir that cannot hold the run record before any work (joulebench/out_dir.py).

Issue 32 (D01-D03): llm_training found out only when Megatron's data cache was made under it, printed three chained
tracebacks and sent the record elsewhere (exit 74); resnet50 already refused at once. Each driver's command line
with an --out-dir that is a file, lies under a file, or lies under /proc (no directory can be made there); the
check itself with all three.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from joulebench.out_dir import check_out_dir
from jpwr import OutputDirError

REPO = Path(__file__).resolve().parents[1]
COMMANDS = {
    "llm_training": ["llm_training", "train", "--model", "tiny", "--device", "cpu", "--iterations", "2"],
    "llm_inference run": ["llm_inference", "run", "--preset", "tiny", "--device", "cpu"],
    "llm_inference load": ["llm_inference", "load", "--preset", "tiny", "--device", "cpu", "--rate", "1"],
}


def _bad_dirs(tmp_path: Path) -> dict[str, Path]:
    blocker = tmp_path / "afile"
    blocker.write_text("not a directory")
    return {"a file": blocker, "under a file": blocker / "sub" / "run", "under /proc": Path("/proc/self/jbrun")}


@pytest.mark.parametrize(("command", "what"), [("llm_training", "a file"), ("llm_inference run", "under a file"),
                                             ("llm_inference load", "under /proc")])
def test_a_driver_refuses_an_unwritable_out_dir_before_any_work(tmp_path: Path, command: str, what: str) -> None:
    out_dir = _bad_dirs(tmp_path)[what]
    proc = subprocess.run([sys.executable, "-m", *COMMANDS[command], "--out-dir", str(out_dir)], cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 73, proc.stderr
    assert f"error: --out-dir {out_dir} cannot be written (" in proc.stderr, proc.stderr
    assert "pass a writable directory" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert "JOULEBENCH_RESULT" not in proc.stdout  # no run started, so no record and no result line


def test_the_check_creates_a_missing_directory_and_leaves_no_probe(tmp_path: Path) -> None:
    check_out_dir(tmp_path / "new" / "run")
    assert list((tmp_path / "new" / "run").iterdir()) == []
    for out_dir in _bad_dirs(tmp_path).values():
        with pytest.raises(OutputDirError, match="cannot be written"):
            check_out_dir(out_dir)
