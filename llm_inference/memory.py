"""Device-memory estimate of one (model, task, batch size) point, to refuse batches that cannot fit.

First order, meant to catch batch sizes off by large factors before any device work:

* weights: parameters × bytes per element (2 in bf16/fp16, 4 in fp32);
* KV cache: 2 · layers · KV heads · head dim · bytes per token, for batch × (longest prompt + output);
* prefill activations of one layer: batch × longest prompt × (4·hidden + 3·intermediate) elements
  (the MLP's gate, up and product dominate; attention runs in SDPA without storing the score matrix);
* logits: batch × vocabulary in fp32 twice (last-position logits and the processed scores);
* +10 % and 1 GiB for the CUDA context, workspaces and fragmentation.
"""

from __future__ import annotations

import dataclasses

from llm_inference.presets import ModelPreset

GIB = 1024**3
CONTEXT_OVERHEAD_GIB = 1.0
FRAGMENTATION = 1.10
BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}


@dataclasses.dataclass(frozen=True)
class MemoryEstimate:
    weights_gib: float
    kv_cache_gib: float
    activations_gib: float
    logits_gib: float

    @property
    def total_gib(self) -> float:
        parts = self.weights_gib + self.kv_cache_gib + self.activations_gib + self.logits_gib
        return parts * FRAGMENTATION + CONTEXT_OVERHEAD_GIB


def estimate_memory(preset: ModelPreset, precision: str, batch_size: int, prompt_tokens: int,
                    sequence_tokens: int) -> MemoryEstimate:
    """`prompt_tokens`: longest (padded) prompt; `sequence_tokens`: longest prompt + output."""
    width = BYTES[precision]
    activations = batch_size * prompt_tokens * (4 * preset.hidden_size + 3 * preset.intermediate_size) * width
    return MemoryEstimate(
        weights_gib=preset.parameter_count() * width / GIB,
        kv_cache_gib=batch_size * sequence_tokens * preset.kv_bytes_per_token(width) / GIB,
        activations_gib=activations / GIB,
        logits_gib=2 * batch_size * preset.vocab_size * 4 / GIB,
    )


def largest_fitting_batch(preset: ModelPreset, precision: str, prompt_tokens: int, sequence_tokens: int,
                          memory_gib: float) -> int:
    """The largest power of two whose estimate fits (0 when not even batch 1 fits)."""
    size = 0
    while estimate_memory(preset, precision, max(1, 2 * size), prompt_tokens, sequence_tokens).total_gib \
            <= memory_gib and size < 2**16:
        size = max(1, 2 * size)
    return size
