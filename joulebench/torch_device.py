"""Device choice and hardware facts for PyTorch drivers (torch is imported by the caller, not by jpwr).

`auto` is CUDA when torch sees a GPU (ROCm GPUs appear as CUDA too), else the CPU; the peak table
(joulebench.peaks) is keyed by the `device_name` recorded here.
"""

from __future__ import annotations

import platform
from typing import Any

from joulebench.launch import LaunchEnv
from joulebench.node_facts import gpu_node_facts
from joulebench.record_types import HardwareBlock
from jpwr import ValidationError


def no_gpu_error() -> ValidationError:
    """--device cuda where the framework sees no GPU: the same words from every driver and framework."""
    return ValidationError("--device cuda but no CUDA/ROCm device is visible",
                           "run on a GPU node, or pass --device cpu or auto")


def resolve_device(requested: str) -> Any:
    """torch.device for "auto", "cuda" or "cpu"; asking for CUDA without a GPU is a ValidationError."""
    import torch

    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if requested == "cuda" and not torch.cuda.is_available():
        raise no_gpu_error()
    return torch.device(requested)


def device_type(requested: str, device_memory_gib: float | None = None) -> str:
    """The device type `validate` checks a run of --device `requested` for: `auto` resolved as resolve_device
    resolves it for the run on this host (torch imported for it), so that `validate --device auto` (JUBE's default)
    holds a CPU run to the host's memory as the run is; with a device memory given (--device-memory-gib), `auto`
    is the accelerator of that memory (a GPU layout validated on a host without one)."""
    if requested != "auto":
        return requested
    return "cuda" if device_memory_gib is not None else str(resolve_device(requested).type)


def hardware_info(device: Any, launch: LaunchEnv) -> HardwareBlock:
    """What the run ran on, as the framework reports it."""
    import torch

    info: HardwareBlock = {
        "device_type": device.type, "devices": launch.world_size, "nodes": launch.num_nodes,
        "devices_per_node": launch.local_world_size, "host_cpu": platform.processor() or platform.machine(),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        info.update({"device_name": props.name, "device_memory_gib": props.total_memory / 1024**3,
                     "compute_capability": f"{props.major}.{props.minor}"})
        info.update(gpu_node_facts(device.type))
    else:
        info.update({"device_name": f"cpu ({info['host_cpu']})", "device_memory_gib": None})
    return info
