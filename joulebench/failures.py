"""A failed run's reason: the exception in one line, with the fix where the failure has a known one.

Why: the frameworks' own messages are long and name no fix a benchmark user can act on. Out of GPU memory is the one
seen on shared nodes: validation sized the run for the whole device, and another process (a co-tenant on a node whose
GPUs are not isolated) holds most of it, or the batch is too large.
"""

from __future__ import annotations

# What PyTorch and ROCm say when the device has no memory left (torch.OutOfMemoryError, or a CUDA call's error code)
_OUT_OF_MEMORY = ("CUDA out of memory", "HIP out of memory", "CUDA error: out of memory", "HIP error: out of memory")
_ALLOCATOR_DETAIL = " Including non-PyTorch memory"  # where torch's message turns to its allocator's statistics


def failure_reason(exc: BaseException) -> str:
    """`Type: message` on one line; out of GPU memory as such, with the device's figures and the fix."""
    name, text = type(exc).__name__, " ".join(str(exc).split())
    if name != "OutOfMemoryError" and not any(marker in text for marker in _OUT_OF_MEMORY):
        return f"{name}: {text}"
    facts = text.split(_ALLOCATOR_DETAIL)[0]
    return (f"out of GPU memory ({name}: {facts}). Fix: free the device (another process may hold its memory: "
            "`nvidia-smi` lists them), or ask for less (a smaller micro-batch or batch size)")
