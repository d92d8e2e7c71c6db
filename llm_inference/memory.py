"""Device-memory estimate of one (model, task, batch size, engine) point, to refuse batches that cannot fit.

First order, meant to catch batch sizes off by large factors before any device work:

* weights: parameters × bytes per element (2 in bf16/fp16, 4 in fp32);
* KV cache: 2 · layers · KV heads · head dim · bytes per token, for batch × (longest prompt + output);
  the static engine allocates it once, its cache positions rounded up to POSITION_BUCKET;
* prefill activations of one layer: tokens × (4·hidden + 3·intermediate) elements (the MLP's gate,
  up and product dominate; attention runs in SDPA without storing the score matrix). `hf` prefills the
  whole batch at once; `static` prefills groups of rows of at most PREFILL_CHUNK_TOKENS tokens (each group at
  its own longest prompt, the cheapest split: `prefill_groups`), bounded here by that many tokens of the longest
  prompt;
* logits: batch × vocabulary in fp32 twice (last-position logits and the processed scores);
* static only, the CUDA graphs' pool: one decode step's temporaries, twice over (Q/K/V, the MLP's
  gate and up, the logits in the model's dtype);
* +10 % and 1 GiB for the CUDA context, workspaces and fragmentation.

Under tensor parallelism (`tensor_parallel` ranks) the estimate is one rank's: its part of the weights
(ModelPreset.rank_parameter_count), of the KV cache (its KV heads) and of the MLP's and Q/K/V activations; the
hidden states and the gathered logits are whole on every rank. Every rank holds every row, so the batch a rank
admits is the job's.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Sequence

from llm_inference.presets import ModelPreset

GIB = 1024**3
CONTEXT_OVERHEAD_GIB = 1.0
FRAGMENTATION = 1.10
BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
ENGINES = ("static", "hf")
# Static engine shapes (the engine and this estimate share them): cache positions come in multiples of
# POSITION_BUCKET (one captured decode graph per multiple); prefill runs at most this many padded tokens at once.
POSITION_BUCKET = 64
PREFILL_CHUNK_TOKENS = 16384
# What one more prefill group costs, in tokens of computation: its forward pass reads every weight once, and in that
# time the device computes about (peak matrix FLOP/s) / (memory bandwidth) tokens' worth (H100: ~800e12 / 3.35e12
# ≈ 240; A100 ~150, MI300X ~250). A split pays when it saves more padding than this.
PREFILL_GROUP_COST_TOKENS = 256


def cache_positions(sequence_tokens: int) -> int:
    """Cache positions an engine allocates per row for sequences of up to `sequence_tokens` tokens."""
    return math.ceil(sequence_tokens / POSITION_BUCKET) * POSITION_BUCKET


def prefill_rows_per_chunk(prompt_tokens: int) -> int:
    """Rows the static engine prefills together when prompts are padded to `prompt_tokens` (the estimate's bound:
    a group of `prefill_groups` never holds more tokens than this many rows of the longest prompt)."""
    return max(1, PREFILL_CHUNK_TOKENS // prompt_tokens)


def prefill_groups(prompt_lengths: Sequence[int]) -> list[tuple[list[int], int]]:
    """The static engine's prefill groups: (row indices, width), rows sorted by prompt length, longest first.

    Why: a batch is left-padded to its longest prompt, and prefilling every row at that width computes the
    padding too (chat at batch 448: 512 positions per row for 221 real ones on average; at batch 8: 4,096 for
    1,977). Each group runs at its own longest prompt; the split is the cheapest one (`_group_ends`).
    """
    order = sorted(range(len(prompt_lengths)), key=lambda row: -prompt_lengths[row])
    ends = _group_ends(tuple(prompt_lengths[row] for row in order), PREFILL_CHUNK_TOKENS, PREFILL_GROUP_COST_TOKENS)
    groups, begin = [], 0
    for end in ends:
        groups.append((order[begin:end], prompt_lengths[order[begin]]))
        begin = end
    return groups


@functools.lru_cache(maxsize=64)  # a point's batches repeat every pass: split once, at the warm-up's prefill
def _group_ends(lengths: tuple[int, ...], chunk_tokens: int, group_cost_tokens: int) -> tuple[int, ...]:
    """Ends of the cheapest split of `lengths` (longest first) into runs of consecutive rows, by dynamic programming.

    A group costs its rows × its longest prompt (the tokens it computes, padding included) plus
    `group_cost_tokens` (each group's forward pass reads every weight once), and holds at most `chunk_tokens`
    tokens unless it is a single row.
    """
    best = [0] + [math.inf] * len(lengths)
    begin_of = [0] * (len(lengths) + 1)
    for end in range(1, len(lengths) + 1):
        for begin in range(end - 1, -1, -1):
            rows = end - begin
            if rows > 1 and rows * lengths[begin] > chunk_tokens:
                break  # longer rows and more of them further back: every earlier begin is over the bound too
            cost = best[begin] + rows * lengths[begin] + group_cost_tokens
            if cost < best[end]:
                best[end], begin_of[end] = cost, begin
    ends, end = [], len(lengths)
    while end:
        ends.append(end)
        end = begin_of[end]
    return tuple(reversed(ends))


@dataclasses.dataclass(frozen=True)
class MemoryEstimate:
    weights_gib: float
    kv_cache_gib: float
    activations_gib: float
    logits_gib: float
    graphs_gib: float

    @property
    def total_gib(self) -> float:
        parts = self.weights_gib + self.kv_cache_gib + self.activations_gib + self.logits_gib + self.graphs_gib
        return parts * FRAGMENTATION + CONTEXT_OVERHEAD_GIB


def estimate_memory(preset: ModelPreset, precision: str, batch_size: int, prompt_tokens: int,
                    sequence_tokens: int, engine: str, tensor_parallel: int = 1) -> MemoryEstimate:
    """`prompt_tokens`: longest (padded) prompt; `sequence_tokens`: longest prompt + output; `tensor_parallel`:
    ranks the model is split over (the estimate is one rank's)."""
    width = BYTES[precision]
    static = engine == "static"
    positions = cache_positions(sequence_tokens) if static else sequence_tokens
    prefill_rows = min(batch_size, prefill_rows_per_chunk(prompt_tokens)) if static else batch_size
    ffn = preset.intermediate_size // tensor_parallel
    per_token = (4 * preset.hidden_size + 3 * ffn) * width
    qkv = (preset.num_attention_heads + 2 * preset.num_key_value_heads) * preset.head_dim // tensor_parallel
    step = batch_size * (qkv + 2 * ffn + preset.vocab_size) * width
    return MemoryEstimate(
        weights_gib=preset.rank_parameter_count(tensor_parallel) * width / GIB,
        kv_cache_gib=batch_size * positions * preset.kv_bytes_per_token(width) / tensor_parallel / GIB,
        activations_gib=prefill_rows * prompt_tokens * per_token / GIB,
        logits_gib=2 * batch_size * preset.vocab_size * 4 / GIB,
        graphs_gib=2 * step / GIB if static else 0.0,
    )


def largest_fitting_batch(estimate_gib: Callable[[int], float], memory_gib: float) -> int:
    """The largest power of two whose estimate (GiB, by batch size) fits (0 when not even batch 1 fits)."""
    size = 0
    while estimate_gib(max(1, 2 * size)) <= memory_gib and size < 2**16:
        size = max(1, 2 * size)
    return size
