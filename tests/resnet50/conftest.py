"""Helpers for resnet50 tests: run the real CLI in-process or as separate processes, read what it wrote."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.driver_helpers import free_port, parse_summary, read_record, run_cmd  # noqa: F401 (re-exported to tests)

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


def metered_run(out: Path, *extra: str, env: dict[str, str | None] | None = None) -> int:
    """A tiny ResNet-50 run in this process on the CPU, metered by the fake NVML replaying the recorded H100 trace
    (in-process sampler); `env`: variables set (or, with None, removed) for the run. Returns the exit code."""
    from resnet50.cli import main
    from tests.conftest import H100_TRACE_DIR

    with pytest.MonkeyPatch.context() as patch:
        import pynvml

        pynvml.configure(H100_TRACE_DIR)
        patch.setenv("JPWR_FAKE_NVML_TRACE", str(H100_TRACE_DIR))
        for name, value in (env or {}).items():
            patch.setenv(name, value) if value is not None else patch.delenv(name, raising=False)
        try:
            return main(["train", "--framework", "pytorch", *SMALL, "--precision", "fp32", "--out-dir", str(out),
                         "--energy-methods", "nvml", *extra])
        finally:
            pynvml.reset()


def assert_loss_decreased(record: dict) -> None:
    """Training on one fixed batch must lower the loss; every logged value must be finite."""
    losses = [loss for _step, loss in record["metrics"]["losses"]]
    assert len(losses) >= 3
    assert all(loss is not None and loss == loss and abs(loss) < 1e6 for loss in losses), losses
    assert losses[-1] < losses[0], losses
