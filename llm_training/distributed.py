"""Process-group and model-parallel setup: NCCL on GPUs (RCCL on ROCm builds of torch), gloo on CPU."""

from __future__ import annotations

import datetime as dt
import platform

import torch
import torch.distributed as dist
from megatron.core import parallel_state, tensor_parallel

from jpwr.errors import ValidationError
from jpwr.launch import LaunchEnv
from llm_training.config import TrainConfig

INIT_TIMEOUT = dt.timedelta(minutes=10)


def resolve_device(requested: str) -> torch.device:
    """`auto` is CUDA when torch sees a GPU (ROCm GPUs appear as CUDA too), else the CPU."""
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if requested == "cuda" and not torch.cuda.is_available():
        raise ValidationError("--device cuda but torch sees no GPU", "run on a GPU node, or use --device cpu")
    return torch.device(requested)


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
    tensor_parallel.model_parallel_cuda_manual_seed(cfg.seed)


def shutdown_distributed() -> None:
    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
    if dist.is_initialized():
        dist.destroy_process_group()


def hardware_info(device: torch.device, launch: LaunchEnv) -> dict[str, object]:
    """What the run ran on, as the framework reports it (the peak table is keyed by `device_name`)."""
    info: dict[str, object] = {
        "device_type": device.type, "devices": launch.world_size, "nodes": launch.num_nodes,
        "devices_per_node": launch.local_world_size, "host_cpu": platform.processor() or platform.machine(),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        info.update(
            device_name=props.name, device_memory_gib=props.total_memory / 1024**3,
            compute_capability=f"{props.major}.{props.minor}",
        )
    else:
        info.update(device_name=f"cpu ({info['host_cpu']})", device_memory_gib=None)
    return info
