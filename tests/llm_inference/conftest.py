"""Helpers for llm_inference tests: the driver as users run it (python -m, under `python -m jpwr --`)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

INFER = [sys.executable, "-m", "llm_inference"]
# The tiny preset and task on the CPU, short windows: a point takes a few seconds on 2 cores.
TINY = ["--preset", "tiny", "--task", "tiny", "--device", "cpu", "--min-window-s", "0.3", "--num-batches", "2"]


def run_cmd(cmd: Sequence[str], env: dict[str, str], cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run(list(cmd), env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)


def read_record(out_dir: Path) -> dict:
    return json.loads((out_dir / "run_record.json").read_text())


def summaries(stdout: str) -> list[dict[str, str]]:
    """key=value pairs of every JOULEBENCH_RESULT line; the last stdout line must be one."""
    lines = stdout.strip().splitlines()
    assert lines[-1].startswith("JOULEBENCH_RESULT "), f"last stdout line is not a summary: {lines[-1]!r}"
    return [dict(item.split("=", 1) for item in line.split()[1:])
            for line in lines if line.startswith("JOULEBENCH_RESULT ")]
