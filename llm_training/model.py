"""GPT model on megatron-core's local (non-Transformer-Engine) layer spec.

Differences from `get_gpt_layer_local_spec()` and why:
* core attention is SDPACoreAttention (flash/cuDNN kernels instead of s×s baddbmm);
* LayerNorm is plain torch LayerNorm whose parameters are tagged `sequence_parallel` when sequence
  parallelism is on, so `finalize_model_grads` all-reduces their gradients over TP (megatron's
  WrappedTorchNorm refuses sequence parallel; apex's FusedLayerNorm is not available here);
* fusions that need apex/TE (masked softmax, gradient-accumulation, TE's RoPE) are off; on CUDA,
  RoPE is fused by torch.compile instead (`use_compiled_rope`), and the loss is our two-pass
  compiled cross-entropy (llm_training.cross_entropy) when `cross_entropy_fusion` is on.
"""

from __future__ import annotations

from typing import Any

import torch
from megatron.core.models.common.embeddings import rope_utils
from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.transformer import TransformerConfig
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.transformer_block import (
    TransformerBlock,
    TransformerBlockSubmodules,
    get_num_layers_to_build,
)

from llm_training.attention import SDPACoreAttention
from llm_training.config import CUDA_GRAPH_WARMUP, TrainConfig, on_for_cuda
from llm_training.cross_entropy import vocab_parallel_cross_entropy

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


class TaggedLayerNorm(torch.nn.LayerNorm):
    """torch LayerNorm with megatron's constructor signature and sequence-parallel parameter tags."""

    def __init__(self, config: TransformerConfig, hidden_size: int, eps: float = 1e-5, **_: object) -> None:
        super().__init__(hidden_size, eps=eps)
        for param in self.parameters():
            param.sequence_parallel = config.sequence_parallel


def transformer_config(cfg: TrainConfig, device_type: str) -> TransformerConfig:
    """megatron TransformerConfig for this run; fusions only on CUDA unless --bias-fusion says otherwise."""
    fusion = on_for_cuda(cfg.bias_fusion, device_type)
    recompute: dict[str, dict[str, Any]] = {"none": {}, "selective": {"recompute_granularity": "selective"},
                 "full": {"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1}}
    return TransformerConfig(
        num_layers=cfg.num_layers,
        hidden_size=cfg.hidden_size,
        num_attention_heads=cfg.num_attention_heads,
        ffn_hidden_size=cfg.ffn_hidden_size,
        tensor_model_parallel_size=cfg.tensor_parallel,
        pipeline_model_parallel_size=cfg.pipeline_parallel,
        sequence_parallel=cfg.sequence_parallel,
        params_dtype=DTYPES[cfg.precision],
        pipeline_dtype=DTYPES[cfg.precision],
        bf16=cfg.precision == "bf16",
        fp16=cfg.precision == "fp16",
        init_method_std=cfg.init_method_std,
        attention_dropout=cfg.attention_dropout,
        hidden_dropout=cfg.hidden_dropout,
        masked_softmax_fusion=False,
        gradient_accumulation_fusion=False,
        apply_rope_fusion=False,
        bias_activation_fusion=fusion,
        bias_dropout_fusion=fusion,
        use_cpu_initialization=device_type == "cpu",
        **recompute[cfg.recompute],
        **cuda_graph_settings(cfg.cuda_graphs),
    )


def cuda_graph_settings(choice: str) -> dict[str, Any]:
    """megatron's TransformerConfig fields of --cuda-graphs: its "local" implementation (no Transformer Engine), the
    whole layer (an empty scope, megatron's spelling) or the whole forward-backward ("full_iteration")."""
    if choice == "none":
        return {}
    return {"cuda_graph_impl": "local", "cuda_graph_scope": ["full_iteration"] if choice == "step" else [],
            "cuda_graph_warmup_steps": CUDA_GRAPH_WARMUP}


class FusedLossGPTModel(GPTModel):
    """GPTModel whose language-model loss is the compiled cross-entropy (same math, far less memory traffic)."""

    def compute_language_model_loss(self, labels: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """Loss [b, s] from labels [b, s] and logits [s, b, V/TP], as megatron's method returns it."""
        loss = vocab_parallel_cross_entropy(logits, labels.transpose(0, 1).contiguous(), self.pg_collection.tp)
        return loss.transpose(0, 1).contiguous()


def layer_spec(config: TransformerConfig, pp_rank: int | None = None, attention_backend: str = "auto") -> ModuleSpec:
    """Block spec: local layers with SDPA attention and tagged LayerNorms (final one included)."""
    layer = get_gpt_layer_local_spec()
    submodules = layer.submodules
    submodules.input_layernorm = TaggedLayerNorm
    submodules.pre_mlp_layernorm = TaggedLayerNorm
    submodules.self_attention.submodules.core_attention = ModuleSpec(
        module=SDPACoreAttention, params={"sdpa_backend": attention_backend})
    num_layers = get_num_layers_to_build(config, pp_rank=pp_rank)
    return ModuleSpec(
        module=TransformerBlock,
        submodules=TransformerBlockSubmodules(layer_specs=[layer] * num_layers, layer_norm=TaggedLayerNorm),
    )


def build_gpt(cfg: TrainConfig, config: TransformerConfig, pre_process: bool, post_process: bool,
              pp_rank: int | None = None, fused_cross_entropy: bool = False) -> GPTModel:
    """The GPT of one pipeline stage: tied input/output embeddings, RoPE, vocabulary padded for TP."""
    model_class = FusedLossGPTModel if fused_cross_entropy else GPTModel
    return model_class(
        config=config,
        transformer_layer_spec=layer_spec(config, pp_rank, cfg.attention_backend),
        vocab_size=cfg.padded_vocab_size,
        max_sequence_length=cfg.seq_length,
        pre_process=pre_process,
        post_process=post_process,
        share_embeddings_and_output_weights=True,
        position_embedding_type="rope",
    )


def use_compiled_rope(enabled: bool) -> None:
    """Route megatron's unfused RoPE (bshd) through torch.compile, or back to the original.

    Without Transformer Engine, `apply_rope_fusion` is unavailable and megatron applies RoPE as
    chunk/neg/cat/mul/add: ~8 memory passes over q and k per direction, ~0.28 s of a 2.0 s
    GPT-800M iteration on an H100 (benchmarks/results/2026-11-22-h100-perf/). Inductor turns the
    same function into one read and one write per tensor, forward and backward, with identical
    math. megatron looks the function up as a module global at call time, so swapping it there
    reaches every attention layer.
    """
    current = rope_utils._apply_rotary_pos_emb_bshd
    original = getattr(current, "_torchdynamo_orig_callable", current)  # see compiled_rope_active
    rope_utils._apply_rotary_pos_emb_bshd = torch.compile(original, dynamic=False) if enabled else original


def compiled_rope_active() -> bool:
    """True while megatron's RoPE goes through torch.compile (see `use_compiled_rope`)."""
    return hasattr(rope_utils._apply_rotary_pos_emb_bshd, "_torchdynamo_orig_callable")
