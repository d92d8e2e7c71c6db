"""Helpers for llm_training tests: run the real driver as users do (python -m / torchrun / under jpwr)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

LLM = [sys.executable, "-m", "llm_training"]
# Small and quick on 2 cores; every run uses the tiny preset on the CPU.
TINY = ["--model", "tiny", "--device", "cpu"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def torchrun(nproc: int) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
            "--master-addr", "127.0.0.1", "--master-port", str(free_port())]


def run_cmd(cmd: Sequence[str], env: dict[str, str], cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run(list(cmd), env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)


def read_record(out_dir: Path) -> dict:
    return json.loads((out_dir / "run_record.json").read_text())


def parse_summary(stdout: str) -> dict[str, str]:
    """key=value pairs of the JOULEBENCH_RESULT line, which must be the last line of stdout."""
    last = stdout.strip().splitlines()[-1]
    assert last.startswith("JOULEBENCH_RESULT "), f"last stdout line is not the summary: {last!r}"
    return dict(item.split("=", 1) for item in last.split()[1:])


@pytest.fixture(scope="module")
def megatron_world_of_one() -> Iterator[None]:
    """megatron-core initialised in this process (world size 1, gloo, CPU compat layer), torn down after."""
    import torch.distributed as dist
    from megatron.core import parallel_state, tensor_parallel

    from llm_training import cpu_compat, model  # noqa: F401 (megatron imports outside the compat layer, as in train)

    with cpu_compat.cpu_mode("cpu"):
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        parallel_state.initialize_model_parallel(1, 1)
        tensor_parallel.model_parallel_cuda_manual_seed(1234)
        try:
            yield
        finally:
            parallel_state.destroy_model_parallel()
            dist.destroy_process_group()
