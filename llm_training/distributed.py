"""Process-group and model-parallel setup: NCCL on GPUs (RCCL on ROCm builds of torch), gloo on CPU."""

from __future__ import annotations

import datetime as dt

import torch
import torch.distributed as dist
from megatron.core import parallel_state, tensor_parallel

from joulebench.launch import LaunchEnv
from llm_training.config import TrainConfig

INIT_TIMEOUT = dt.timedelta(minutes=10)


def init_distributed(launch: LaunchEnv, device: torch.device, cfg: TrainConfig) -> None:
    """World process group, then megatron's TP/PP/DP groups and per-rank RNG streams."""
    if device.type == "cuda":
        torch.cuda.set_device(launch.local_rank % torch.cuda.device_count())
    backend = "nccl" if device.type == "cuda" else "gloo"
    if launch.world_size == 1:
        # No rendezvous port needed (tests and laptops may run several single-process jobs at once).
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=INIT_TIMEOUT)
    else:
        launch.export_torch_env()
        dist.init_process_group(
            backend, init_method="env://", rank=launch.rank, world_size=launch.world_size, timeout=INIT_TIMEOUT
        )
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=cfg.tensor_parallel, pipeline_model_parallel_size=cfg.pipeline_parallel
    )
    # CUDA graphs replay the dropout of megatron's RNG streams only from graph-safe generator states
    tensor_parallel.model_parallel_cuda_manual_seed(cfg.seed, use_cudagraphable_rng=cfg.cuda_graphs != "none")


def shutdown_distributed() -> None:
    """Ranks leave together: rank 0 writes the run record before the others exit, so that a launcher that ends
    the job at the first non-zero exit (srun --kill-on-bad-exit, with TIMEOUT's 124) cannot cut the write short."""
    if dist.is_initialized():
        dist.barrier()
    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
    if dist.is_initialized():
        dist.destroy_process_group()
