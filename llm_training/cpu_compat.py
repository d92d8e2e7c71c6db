"""CPU compatibility layer: lets megatron-core run on CPU (tests, laptops) when `--device cpu` is chosen.

megatron-core has no CPU path: it allocates with `device=torch.cuda.current_device()` or the literal
"cuda", seeds and forks the CUDA RNG, synchronises CUDA, and checks `torch.cuda.*Tensor` types. Inside
`cpu_mode()` those calls are redirected to the CPU:

* a TorchFunctionMode rewrites every CUDA device argument of torch functions and tensor methods
  (factories, `.to`, `.cuda`) to "cpu";
* `torch.cuda` functions megatron calls (current_device, set_device, synchronize, RNG state,
  streams, empty_cache, ...) are replaced by CPU equivalents or no-ops;
* megatron's private CUDA RNG helpers fork the CPU generator instead (so the "CUDA" and CPU
  streams are one generator; megatron's notice about that is filtered);
* `torch.cuda.FloatTensor` and friends are aliased to their CPU types, and `tensor.type()` names CPU
  tensors as their CUDA types, for megatron's type checks.

Everything is restored on exit. The layer refuses to start when the run's device is not the CPU,
so it can never be active on a GPU run. It changes process-global state: use it in the process
that runs the CPU training, never around GPU work.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

_CPU = torch.device("cpu")


def _is_cuda_device(value: Any) -> bool:
    if isinstance(value, torch.device):
        return value.type == "cuda"
    if isinstance(value, str):
        return value.startswith("cuda")
    # A bare integer as device means "CUDA device N" to torch.
    return isinstance(value, int) and not isinstance(value, bool)


class _CudaToCpuMode(TorchFunctionMode):
    """Rewrites CUDA device arguments of torch calls to the CPU."""

    def __torch_function__(self, func: Callable, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = dict(kwargs or {})
        if func is torch.Tensor.cuda:
            return args[0]
        if func is torch.Tensor.type and len(args) == 1 and not kwargs:
            # megatron's optimizers compare type strings with "torch.cuda.FloatTensor" etc.
            return func(*args).replace("torch.", "torch.cuda.", 1)
        if "device" in kwargs and _is_cuda_device(kwargs["device"]):
            kwargs["device"] = _CPU
        if kwargs.get("pin_memory"):
            kwargs["pin_memory"] = False  # pinning needs a CUDA driver
        if func is torch.Tensor.to and len(args) > 1 and _is_cuda_device(args[1]):
            args = (args[0], _CPU, *args[2:])
        return func(*args, **kwargs)


class _NullStream:
    """Stands in for torch.cuda.Stream: CPU work is already ordered."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def wait_stream(self, other: Any) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def record_event(self, event: Any = None) -> Any:
        return event

    def __enter__(self) -> _NullStream:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


def _cuda_replacements() -> dict[str, Any]:
    # One distinct function per name: torch._dynamo indexes torch.cuda's functions and rejects one
    # object registered under two names.
    return {
        # A device object, not 0: autograd runs backward functions outside the TorchFunctionMode
        # (a mode is suspended while it handles torch.autograd.backward), and megatron's backward
        # passes allocate with device=torch.cuda.current_device().
        "current_device": lambda: _CPU,
        "set_device": lambda device: None,
        "synchronize": lambda device=None: None,
        "empty_cache": lambda: None,
        "device_count": lambda: 1,
        # The CPU default generator stands in for the CUDA one (torch.manual_seed would call back
        # into torch.cuda.manual_seed_all, hence the generator methods).
        "get_rng_state": lambda device="cuda": torch.default_generator.get_state(),
        "set_rng_state": lambda state, device="cuda": torch.default_generator.set_state(state),
        "manual_seed": lambda seed: torch.default_generator.manual_seed(seed),
        "manual_seed_all": lambda seed: torch.default_generator.manual_seed(seed),
        "current_stream": lambda device=None: _NullStream(),
        "default_stream": lambda device=None: _NullStream(),
        "Stream": _NullStream,
        "stream": lambda stream=None: contextlib.nullcontext(),
        "memory_allocated": lambda device=None: 0,
        "max_memory_allocated": lambda device=None: 0,
        "FloatTensor": torch.FloatTensor,
        "HalfTensor": torch.HalfTensor,
        "BFloat16Tensor": torch.BFloat16Tensor,
    }


def _megatron_rng_replacements() -> dict[str, Any]:
    def get_state(device: Any = "cuda", clone: bool = False, graph_safe: bool = False) -> torch.Tensor:
        return torch.default_generator.get_state()

    def set_state(new_state: torch.Tensor, device: int = -1, graph_safe: bool = False) -> None:
        torch.default_generator.set_state(new_state)

    return {"_get_cuda_rng_state": get_state, "_set_cuda_rng_state": set_state}


@contextlib.contextmanager
def _patched(target: Any, replacements: dict[str, Any]) -> Iterator[None]:
    missing = object()
    saved = {name: getattr(target, name, missing) for name in replacements}
    try:
        for name, value in replacements.items():
            setattr(target, name, value)
        yield
    finally:
        for name, value in saved.items():
            if value is missing:
                delattr(target, name)
            else:
                setattr(target, name, value)


class _SharedGeneratorNotice(logging.Filter):
    """Drops megatron's "CPU RNG state changed within GPU RNG context": here the two are one generator."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "CPU RNG state changed within GPU RNG context" not in record.getMessage()


@contextlib.contextmanager
def _filtered(logger: logging.Logger, log_filter: logging.Filter) -> Iterator[None]:
    logger.addFilter(log_filter)
    try:
        yield
    finally:
        logger.removeFilter(log_filter)


@contextlib.contextmanager
def _borrowed_grad_warning_ignored() -> Iterator[None]:
    """megatron's distributed optimizer reads `.grad` of its non-leaf shard views in zero_grad (its own comment says
    "throws grad-access warning"): through this layer's TorchFunctionMode that 565-column torch warning is reported
    as raised here, on every CPU run. Only the one reported from this module is dropped; a GPU run still shows it as
    megatron's."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"The \.grad attribute of a Tensor that is not a leaf",
                                category=UserWarning, module=r"llm_training\.cpu_compat")
        yield


@contextlib.contextmanager
def cpu_mode(device: torch.device | str) -> Iterator[None]:
    """Run megatron-core on the CPU inside this block; `device` must be the CPU."""
    if torch.device(device).type != "cpu":
        raise RuntimeError(f"the CPU compatibility layer was asked to run for device {device}: it is CPU-only")
    from megatron.core.tensor_parallel import random as megatron_random

    with (
        _patched(torch.cuda, _cuda_replacements()),
        _patched(megatron_random, _megatron_rng_replacements()),
        _filtered(logging.getLogger(megatron_random.__name__), _SharedGeneratorNotice()),
        _borrowed_grad_warning_ignored(),
        _CudaToCpuMode(),
    ):
        yield
