"""Parameter and FLOP counts: one documented formula for every vendor.

Model FLOPs per token = 6·N + 12·L·h·s (PaLM appendix B convention, also MosaicML/llm.c):
6·N for the forward and backward matrix products over all N parameters (embeddings included, the
tied output projection counted once), 12·L·h·s for the attention score and value products.
Recompute is never counted, so the figure does not change with the memory-saving strategy.
GPT-800M: N = 908.76 M, 6.258 GFLOP/token.

CARAML's NVIDIA patch reports 96·L·h²·(1 + s/(6h) + V/(16·L·h)) per token (the factor-4 "full
recompute" hardware count, applied for any recompute setting): 8.134 GFLOP/token for GPT-800M.
It is reported only in a separate, labelled field for comparison with CARAML's tables.
"""

from __future__ import annotations

from llm_training.presets import ModelShape


def parameter_count(shape: ModelShape, padded_vocab: int) -> int:
    """Parameters of the GPT built by llm_training.model (RoPE: no position table; tied embeddings).

    Per layer: two LayerNorms (2h each), QKV (3h² + 3h), output projection (h² + h), MLP
    (2·h·f + f + h); plus the final LayerNorm and the V·h embedding. tests/llm_training checks this
    against the parameters of a real GPTModel.
    """
    h, f = shape.hidden_size, shape.ffn_hidden_size
    per_layer = 4 * h + (3 * h * h + 3 * h) + (h * h + h) + (2 * h * f + f + h)
    return shape.num_layers * per_layer + 2 * h + padded_vocab * h


def model_flops_per_token(parameters: int, num_layers: int, hidden_size: int, seq_length: int) -> float:
    """6N + 12·L·h·s: the suite's model FLOPs per trained token (forward + backward)."""
    return 6.0 * parameters + 12.0 * num_layers * hidden_size * seq_length


def caraml_nvidia_flops_per_token(num_layers: int, hidden_size: int, seq_length: int, padded_vocab: int) -> float:
    """CARAML's NVIDIA-patch count, 96·L·h²·(1 + s/(6h) + V/(16·L·h)), for comparison only."""
    h = hidden_size
    return 96.0 * num_layers * h * h * (1.0 + seq_length / (6.0 * h) + padded_vocab / (16.0 * num_layers * h))
