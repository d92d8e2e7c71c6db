"""Helpers for resnet50 tests: run the real CLI in-process or as separate processes, read what it wrote."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
RESNET = [sys.executable, "-m", "resnet50"]
# Small and quick on 2 cores: 64 px, 8 images per step, fixed synthetic batch, a low rate that decreases the loss.
SMALL = ["--image-size", "64", "--global-batch-size", "8", "--device", "cpu", "--lr", "0.002", "--log-interval", "1"]
LAUNCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
               "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_JOB_ID", "SLURM_STEP_NODELIST",
               "SLURM_JOB_NODELIST", "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_JOB_NUM_NODES",
               "SLURM_NNODES", "TF_CONFIG", "JPWR_ADDR")


@pytest.fixture(autouse=True)
def single_process_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """In-process runs see no launcher (a CI runner under Slurm must not turn them into multi-rank runs)."""
    for name in LAUNCH_VARS:
        monkeypatch.delenv(name, raising=False)


def clean_env(**extra: str) -> dict[str, str]:
    """Environment for child processes: this checkout importable, no inherited launcher variables."""
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARS}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    env.update(extra)
    return env


def free_port(count: int = 1) -> int:
    """A port p such that p .. p+count-1 were free a moment ago (TF workers listen on consecutive ports)."""
    for _ in range(50):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            base = sock.getsockname()[1]
        if base + count < 65535 and all(_is_free(base + i) for i in range(1, count)):
            return base
    raise RuntimeError("no free consecutive ports")


def _is_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def run_cmd(cmd: Sequence[str], env: dict[str, str], cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run(list(cmd), env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)


def read_record(out_dir: Path) -> dict:
    return json.loads((out_dir / "run_record.json").read_text())


def parse_summary(stdout: str) -> dict[str, str]:
    """key=value pairs of the JOULEBENCH_RESULT line, which must be the last line of stdout."""
    last = stdout.strip().splitlines()[-1]
    assert last.startswith("JOULEBENCH_RESULT "), f"last stdout line is not the summary: {last!r}"
    return dict(item.split("=", 1) for item in last.split()[1:])


def assert_loss_decreased(record: dict) -> None:
    """Training on one fixed batch must lower the loss; every logged value must be finite."""
    losses = [loss for _step, loss in record["metrics"]["losses"]]
    assert len(losses) >= 3
    assert all(loss is not None and loss == loss and abs(loss) < 1e6 for loss in losses), losses
    assert losses[-1] < losses[0], losses
