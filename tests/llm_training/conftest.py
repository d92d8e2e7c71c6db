"""Helpers for llm_training tests: run the real driver as users do (python -m / torchrun / under jpwr)."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest

from tests.driver_helpers import free_port, parse_summary, read_record, run_cmd  # noqa: F401 (re-exported to tests)

LLM = [sys.executable, "-m", "llm_training"]
# Small and quick on 2 cores; every run uses the tiny preset on the CPU.
TINY = ["--model", "tiny", "--device", "cpu"]


def torchrun(nproc: int) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
            "--master-addr", "127.0.0.1", "--master-port", str(free_port())]


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
