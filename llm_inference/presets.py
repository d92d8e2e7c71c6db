"""Model presets: architecture configs of real models, built with random weights.

No model hub is reachable from the benchmark machines, so presets are architecture configs
(shapes as published for Llama-3.2-1B, Llama-3.1-8B, Llama-3.1-70B and GPT-2 small) instantiated with random
weights. With the output length forced (no early end-of-sequence), the kernels run, and hence time
and energy, do not depend on the weight values. A local checkpoint directory (`--checkpoint`)
replaces the preset's config and weights when the user has one.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any


@dataclasses.dataclass(frozen=True)
class ModelPreset:
    """Shape of one decoder-only model; `family` picks the transformers config class."""

    name: str
    family: str  # "llama" or "gpt2"
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    vocab_size: int
    max_positions: int
    tie_word_embeddings: bool
    source: str  # where the shape comes from

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def parameter_count(self) -> int:
        """Weights of the model (embeddings counted once when tied); used for FLOPs and memory."""
        h, layers, vocab = self.hidden_size, self.num_layers, self.vocab_size
        kv = self.num_key_value_heads * self.head_dim
        if self.family == "gpt2":
            per_layer = 4 * h * h + 4 * h + 2 * h * self.intermediate_size + self.intermediate_size + h + 4 * h
            embeddings = vocab * h + self.max_positions * h
            return layers * per_layer + embeddings + 2 * h + (0 if self.tie_word_embeddings else vocab * h)
        per_layer = 2 * h * h + 2 * h * kv + 3 * h * self.intermediate_size + 2 * h
        return layers * per_layer + vocab * h + h + (0 if self.tie_word_embeddings else vocab * h)

    def rank_parameter_count(self, tensor_parallel: int) -> int:
        """Weights one of `tensor_parallel` ranks holds (llm_inference/tensor_parallel.py): the layers' matrices and
        their biases split, norms and embeddings replicated, the LM head split by vocabulary rows (a padded copy of
        the embedding's rows when tied)."""
        if tensor_parallel == 1:
            return self.parameter_count()
        h, ffn, vocab = self.hidden_size, self.intermediate_size, self.vocab_size
        if self.family == "gpt2":
            split, replicated = 4 * h * h + 3 * h + 2 * h * ffn + ffn, 6 * h
            embeddings, final = vocab * h + self.max_positions * h, 2 * h
        else:
            split, replicated = 2 * h * h + 2 * h * self.num_key_value_heads * self.head_dim + 3 * h * ffn, 2 * h
            embeddings, final = vocab * h, h
        return (self.num_layers * (split // tensor_parallel + replicated) + embeddings + final
                + math.ceil(vocab / tensor_parallel) * h)

    def kv_bytes_per_token(self, bytes_per_element: int) -> int:
        """KV-cache bytes one token occupies (keys and values of every layer)."""
        return 2 * self.num_layers * self.num_key_value_heads * self.head_dim * bytes_per_element

    def hf_config_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of the transformers config class for this family."""
        if self.family == "gpt2":
            return {"n_embd": self.hidden_size, "n_layer": self.num_layers, "n_head": self.num_attention_heads,
                    "n_inner": self.intermediate_size, "vocab_size": self.vocab_size,
                    "n_positions": self.max_positions, "tie_word_embeddings": self.tie_word_embeddings,
                    "bos_token_id": self.vocab_size - 1, "eos_token_id": self.vocab_size - 1}
        return {"hidden_size": self.hidden_size, "num_hidden_layers": self.num_layers,
                "num_attention_heads": self.num_attention_heads, "num_key_value_heads": self.num_key_value_heads,
                "intermediate_size": self.intermediate_size, "vocab_size": self.vocab_size,
                "max_position_embeddings": self.max_positions, "tie_word_embeddings": self.tie_word_embeddings,
                "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "bos_token_id": 1, "eos_token_id": 2}


LLAMA3_VOCAB = 128256

PRESETS: dict[str, ModelPreset] = {
    "tiny": ModelPreset("tiny", "llama", 2, 64, 4, 2, 128, 512, 4096, True, "test shape (CPU, CI)"),
    "gpt2": ModelPreset("gpt2", "gpt2", 12, 768, 12, 12, 3072, 50257, 1024, True, "GPT-2 small (124M)"),
    "llama-1b": ModelPreset("llama-1b", "llama", 16, 2048, 32, 8, 8192, LLAMA3_VOCAB, 131072, True,
                            "Llama-3.2-1B config (1.24B parameters)"),
    "llama-8b": ModelPreset("llama-8b", "llama", 32, 4096, 32, 8, 14336, LLAMA3_VOCAB, 131072, False,
                            "Llama-3.1-8B config (8.03B parameters)"),
    "llama-70b": ModelPreset("llama-70b", "llama", 80, 8192, 64, 8, 28672, LLAMA3_VOCAB, 131072, False,
                             "Llama-3.1-70B config (70.6B parameters; tensor parallel over 4 or more GPUs)"),
}


def preset_from_checkpoint(config: dict[str, Any], name: str) -> ModelPreset:
    """The shape of a local checkpoint's config.json (Llama-like or GPT-2 keys), for memory and FLOPs."""
    if config.get("model_type") == "gpt2":
        hidden, heads = int(config["n_embd"]), int(config["n_head"])
        return ModelPreset(name, "gpt2", int(config["n_layer"]), hidden, heads, heads,
                           int(config.get("n_inner") or 4 * hidden), int(config["vocab_size"]),
                           int(config["n_positions"]), bool(config.get("tie_word_embeddings", True)), "checkpoint")
    heads = int(config["num_attention_heads"])
    return ModelPreset(name, "llama", int(config["num_hidden_layers"]), int(config["hidden_size"]), heads,
                       int(config.get("num_key_value_heads") or heads), int(config["intermediate_size"]),
                       int(config["vocab_size"]), int(config.get("max_position_embeddings") or 2048),
                       bool(config.get("tie_word_embeddings", False)), "checkpoint")
