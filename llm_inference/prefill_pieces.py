"""The prefill's layer pieces, compiled by inductor with the prompt group's rows and width as dynamic dimensions.

Why (issue 59): the decode step's pieces were compiled, the prefill's were not. In llama-8b chat at batch 512 on an H100
the prefill takes 3.3 s of each 9.3 s batch and its eager element-wise kernels (the RMS norms, RoPE's multiplies, roll
and multiply-add, SiLU and its product with up, the residual adds) ≈ 0.7 s of that (benchmarks/kernel_profile.py,
2026-12-07, docs/perf-notes.md): inductor fuses them as it fuses the decode step's.

Prompt groups come in every shape (rows × width), so each piece compiles once with both dimensions dynamic. torch
specialises a dimension of size 1, so the set-up (`warm`) compiles the four cases, rows and width each 1 or more,
before any window (an engine used without a set-up, as the logits checks use one, warms at its first prefill); the
engine detail's `compiles_after_setup` counts every compile after the set-up (0 expected).
The pieces are functions of their own rather than the model's methods: dynamo keeps compiled code per function, so
the prefill's few dynamic entries never share a cache with the decode variants' per-shape ones.

On by default on CUDA since one H100 measured it (2026-12-07, docs/perf-notes.md "Issue 59, fourth lever"): llama-8b
chat at batch 512 0.0470 -> 0.0454 J per output token, serving at 256 slots 0.0559 -> 0.0541, the logits check passes,
no compile after the set-up.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import torch

from joulebench.compile_cache import frame_compiles
from llm_inference.compact_model import CompactModel, Layer

COMPILED = True  # on CUDA, compile the prefill's pieces (engines' default; `compile_prefill` overrides it)
WARM_SHAPES = ((2, 3), (1, 3), (2, 1), (1, 1))  # (rows, width): every case of torch's size-1 specialisation
BACKEND = "inductor"  # torch.compile's backend (the CPU test of the shape cases takes "aot_eager": dynamo's same
                      # graphs and guards without inductor's minutes of C++ compiles on two cores)
Rope = tuple[torch.Tensor, torch.Tensor] | None


def attention_inputs(model: CompactModel, layer: Layer, x: torch.Tensor, rope: Rope
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """`model.attention_inputs` for a prompt group (x: rows × width × hidden)."""
    return model.attention_inputs(layer, x, rope)


def attention_output_and_mlp(model: CompactModel, layer: Layer, x: torch.Tensor, attention: torch.Tensor
                             ) -> torch.Tensor:
    """`model.attention_output_and_mlp` for a prompt group."""
    return model.attention_output_and_mlp(layer, x, attention)


@dataclasses.dataclass
class PrefillPieces:
    """The two pieces a prefill layer calls around attention; `compile_s`: the set-up's compile seconds (None: not
    compiled, or not yet)."""

    attention_inputs: Callable[[CompactModel, Layer, torch.Tensor, Rope], tuple[torch.Tensor, torch.Tensor]]
    attention_output_and_mlp: Callable[[CompactModel, Layer, torch.Tensor, torch.Tensor], torch.Tensor]
    compiled: bool
    compile_s: float | None = None

    @classmethod
    def build(cls, compiled: bool) -> PrefillPieces:
        if not compiled:
            return cls(attention_inputs, attention_output_and_mlp, False)
        return cls(torch.compile(attention_inputs, backend=BACKEND),
                   torch.compile(attention_output_and_mlp, backend=BACKEND), True)

    def warm(self, model: CompactModel) -> None:
        """Compile every case of WARM_SHAPES once (set-up, outside every window), on zeros through the first layer."""
        if not self.compiled or self.compile_s is not None:
            return
        started = time.monotonic()
        layer, dtype, device = model.layers[0], model.embed.dtype, model.embed.device
        for rows, width in WARM_SHAPES:
            def zeros(size: int, rows: int = rows, width: int = width) -> torch.Tensor:
                return torch.zeros(rows, width, size, dtype=dtype, device=device)

            x, attention = zeros(model.embed.shape[1]), zeros(model.heads * model.head_dim)
            rope = None if model.inv_freq is None else (zeros(model.head_dim), zeros(model.head_dim))
            for tensor in (x, attention, *(rope or ())):
                _dynamic_rows_and_width(tensor)
            self.attention_inputs(model, layer, x, rope)
            self.attention_output_and_mlp(model, layer, x, attention)
        self.compile_s = time.monotonic() - started


def _dynamic_rows_and_width(tensor: torch.Tensor) -> None:
    """Dims 0 and 1 dynamic where they exceed 1 (`maybe`: a size-1 dimension specialises rather than fails)."""
    import torch._dynamo

    for dim in (0, 1):
        torch._dynamo.maybe_mark_dynamic(tensor, dim)


def detail(pieces: PrefillPieces, setup_compiles: int | None) -> dict[str, Any]:
    """The engine detail's prefill entries: compiled or not, the set-up's compile seconds, compiles since set-up."""
    return {"compiled_prefill": pieces.compiled,
            "prefill_compile_s": None if pieces.compile_s is None else round(pieces.compile_s, 3),
            "compiles_after_setup": None if setup_compiles is None else frame_compiles() - setup_compiles}
