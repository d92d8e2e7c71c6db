"""Compact decoder code for the static engine: Llama and GPT-2 families, weights taken from a transformers model.

Why own code rather than transformers' modules: the static engine captures one decode step as a CUDA
graph and replays it, so every tensor the step touches must keep its shape and address (a KV cache
allocated once, no per-step allocation outside the graph's pool, no host synchronisation), and its
attention must read only the filled part of the cache. The code here is the forward pass alone, as
pure functions of the weights: one matmul for Q, K and V together, one for the MLP's gate and up
projections (Llama), RoPE applied to Q and K in one pass. tests/llm_inference checks its logits
against transformers' (fp32, CPU); benchmarks/inference_engine_h100.py checks them in bf16 on a GPU.

Attention itself (and the cache) lives in llm_inference/static_engine.py: this module turns hidden
states into per-head Q/K/V and back. Under tensor parallelism (`tp`, llm_inference/tensor_parallel.py) a model holds
one rank's heads and MLP columns: `heads` and `kv_heads` are the rank's, the output projections' partial sums are
all-reduced and the logits gathered over the vocabulary (llm_inference/shards.py builds such a model).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.nn.functional as F

from llm_inference.tensor_parallel import TensorParallel

# Rotary-embedding types whose frequencies do not change with the sequence (dynamic and longrope do).
STATIC_ROPE_TYPES = ("default", "llama3", "linear")
GPT2_ACTIVATIONS = ("gelu_new", "gelu_pytorch_tanh")


@dataclasses.dataclass(frozen=True)
class Affine:
    """A linear map or a norm's scale: weight and optional bias, as F.linear / F.layer_norm take them."""

    weight: torch.Tensor
    bias: torch.Tensor | None = None


@dataclasses.dataclass(frozen=True)
class Layer:
    norm1: Affine
    qkv: Affine  # [Q; K; V] rows
    out: Affine
    norm2: Affine
    up: Affine  # Llama: [gate; up] rows; GPT-2: c_fc
    down: Affine


def _cat(parts: list[Affine]) -> Affine:
    biases = [p.bias for p in parts]
    bias = None if all(b is None for b in biases) else torch.cat([
        b if b is not None else p.weight.new_zeros(p.weight.shape[0]) for p, b in zip(parts, biases, strict=True)])
    return Affine(torch.cat([p.weight for p in parts]), bias)


def _linear(module: torch.nn.Module) -> Affine:
    return Affine(module.weight.detach(), None if module.bias is None else module.bias.detach())


def _conv1d(module: torch.nn.Module) -> Affine:
    """GPT-2's Conv1D stores (in, out); F.linear wants (out, in)."""
    return Affine(module.weight.detach().t().contiguous(), module.bias.detach())


def _norm(module: torch.nn.Module) -> Affine:
    bias = getattr(module, "bias", None)
    return Affine(module.weight.detach(), None if bias is None else bias.detach())


def llama_rope(config: Any, rotary: Any) -> tuple[torch.Tensor, float]:
    """(inverse frequencies in fp32, attention scaling) of a transformers Llama config and its rotary embedding,
    refusing what the compact code does not cover (frequencies that change with the sequence, an activation other
    than silu)."""
    if rotary.rope_type not in STATIC_ROPE_TYPES or config.hidden_act != "silu":
        raise ValueError(f"rope type {rotary.rope_type!r} / activation {config.hidden_act!r} is not covered by "
                         f"the static engine (rope {', '.join(STATIC_ROPE_TYPES)}; silu)")
    return rotary.inv_freq.detach().float(), float(rotary.attention_scaling)


def check_gpt2(config: Any) -> None:
    """Refuse a GPT-2 variant whose attention or activation the compact code does not compute."""
    if (config.activation_function not in GPT2_ACTIVATIONS or config.scale_attn_by_inverse_layer_idx
            or config.reorder_and_upcast_attn or not config.scale_attn_weights):
        raise ValueError("this GPT-2 variant (activation, attention scaling or upcast options) is not covered "
                         "by the static engine")


@dataclasses.dataclass(frozen=True)
class CompactModel:
    """A decoder's weights and shape; the methods are the forward pass outside attention."""

    family: str  # "llama" or "gpt2"
    heads: int
    kv_heads: int
    head_dim: int
    norm_eps: float
    embed: torch.Tensor
    position_embed: torch.Tensor | None  # GPT-2's learned positions
    layers: tuple[Layer, ...]
    final_norm: Affine
    lm_head: torch.Tensor
    inv_freq: torch.Tensor | None  # Llama's RoPE frequencies (fp32), as transformers computed them
    rope_scale: float
    tp: TensorParallel | None = None  # this rank's place when the model is split over ranks (None: one device)

    @classmethod
    def from_transformers(cls, model: torch.nn.Module) -> CompactModel:
        """Weights of a transformers LlamaForCausalLM or GPT2LMHeadModel (fused copies where fused)."""
        config = model.config
        if config.model_type == "gpt2":
            return cls._from_gpt2(model)
        if config.model_type != "llama":
            raise ValueError(f"the static engine has code for llama and gpt2 models, not {config.model_type!r}")
        inv_freq, rope_scale = llama_rope(config, model.model.rotary_emb)
        layers = tuple(Layer(
            norm1=_norm(block.input_layernorm),
            qkv=_cat([_linear(getattr(block.self_attn, f"{name}_proj")) for name in "qkv"]),
            out=_linear(block.self_attn.o_proj),
            norm2=_norm(block.post_attention_layernorm),
            up=_cat([_linear(block.mlp.gate_proj), _linear(block.mlp.up_proj)]),
            down=_linear(block.mlp.down_proj),
        ) for block in model.model.layers)
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        return cls("llama", config.num_attention_heads, config.num_key_value_heads, head_dim, config.rms_norm_eps,
                   model.model.embed_tokens.weight.detach(), None, layers, _norm(model.model.norm),
                   model.lm_head.weight.detach(), inv_freq, rope_scale)

    @classmethod
    def _from_gpt2(cls, model: torch.nn.Module) -> CompactModel:
        config = model.config
        check_gpt2(config)
        body = model.transformer
        layers = tuple(Layer(
            norm1=_norm(block.ln_1), qkv=_conv1d(block.attn.c_attn), out=_conv1d(block.attn.c_proj),
            norm2=_norm(block.ln_2), up=_conv1d(block.mlp.c_fc), down=_conv1d(block.mlp.c_proj),
        ) for block in body.h)
        heads = config.n_head
        return cls("gpt2", heads, heads, config.n_embd // heads, config.layer_norm_epsilon, body.wte.weight.detach(),
                   body.wpe.weight.detach(), layers, _norm(body.ln_f), model.lm_head.weight.detach(), None, 1.0)

    @property
    def vocab_size(self) -> int:
        """The whole vocabulary (the embedding is never split; a rank's LM head may hold a part of it)."""
        return self.embed.shape[0]

    @property
    def groups(self) -> int:
        """Query heads per KV head (grouped-query attention)."""
        return self.heads // self.kv_heads

    def norm(self, x: torch.Tensor, scale: Affine) -> torch.Tensor:
        if self.family == "gpt2":
            return F.layer_norm(x, x.shape[-1:], scale.weight, scale.bias, self.norm_eps)
        return F.rms_norm(x, x.shape[-1:], scale.weight, self.norm_eps)

    def rope_tables(self, positions: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(cos, signed sin) per position, shape (positions, head_dim), in the model's dtype; None without RoPE.

        transformers rotates by x·cos + rotate_half(x)·sin with rotate_half(x) = [−x₂, x₁]; here
        rotate_half(x)·sin = roll(x, d/2)·[−sin₁, sin₂], so one roll and one multiply-add do it.
        """
        if self.inv_freq is None:
            return None
        angles = torch.arange(positions, dtype=torch.float32, device=self.inv_freq.device)[:, None] * self.inv_freq
        cos, sin = angles.cos() * self.rope_scale, angles.sin() * self.rope_scale
        return torch.cat([cos, cos], -1).to(dtype), torch.cat([-sin, sin], -1).to(dtype)

    def step_inputs(self, tokens: torch.Tensor, positions: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]
                    | None) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
        """A decode step's hidden states (rows, 1, hidden) for one new token per row, and RoPE's rows for its
        positions (rows, 1, d); tokens and positions (rows,)."""
        rows = None if rope is None else (rope[0][positions][:, None], rope[1][positions][:, None])
        return self.embed_tokens(tokens[:, None], positions[:, None]), rows

    def embed_tokens(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        x = F.embedding(tokens, self.embed)
        return x if self.position_embed is None else x + F.embedding(positions, self.position_embed)

    def attention_inputs(self, layer: Layer, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None
                         ) -> tuple[torch.Tensor, torch.Tensor]:
        """Q (b, s, heads, d) and K/V together (b, s, 2, kv_heads, d) of one layer, RoPE applied; rope: (cos, sin)
        (b, s, d). K and V in one tensor so that the cache takes them in one write (compiled: one fused kernel)."""
        b, s, _ = x.shape
        qkv = F.linear(self.norm(x, layer.norm1), layer.qkv.weight, layer.qkv.bias)
        qkv = qkv.view(b, s, self.heads + 2 * self.kv_heads, self.head_dim)
        qk, v = qkv[:, :, :self.heads + self.kv_heads], qkv[:, :, self.heads + self.kv_heads:]
        if rope is not None:
            cos, sin = (t.unsqueeze(2) for t in rope)
            qk = torch.addcmul(qk * cos, qk.roll(self.head_dim // 2, dims=-1), sin)
        kv = torch.cat([qk[:, :, self.heads:], v], dim=2).view(b, s, 2, self.kv_heads, self.head_dim)
        return qk[:, :, :self.heads], kv

    def attention_output_and_mlp(self, layer: Layer, x: torch.Tensor, attention: torch.Tensor) -> torch.Tensor:
        """The rest of one layer: output projection, residual, norm, MLP, residual; attention (b, s, heads·d). Split
        over ranks, each projection's partial sum is all-reduced (one collective after attention, one after the MLP)."""
        x = x + self.summed(F.linear(attention, layer.out.weight, layer.out.bias))
        hidden = F.linear(self.norm(x, layer.norm2), layer.up.weight, layer.up.bias)
        if self.family == "gpt2":
            hidden = F.gelu(hidden, approximate="tanh")
        else:
            gate, up = hidden.chunk(2, dim=-1)
            hidden = F.silu(gate) * up
        return x + self.summed(F.linear(hidden, layer.down.weight, layer.down.bias))

    def summed(self, partial: torch.Tensor) -> torch.Tensor:
        """An output projection's result: as it is on one device, summed over the ranks when split."""
        return partial if self.tp is None else self.tp.reduce(partial)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """(rows, vocabulary) logits of (rows, hidden) states: the ranks' vocabulary parts gathered when split."""
        local = F.linear(self.norm(x, self.final_norm), self.lm_head)
        return local if self.tp is None else self.tp.gather_columns(local, self.vocab_size)
