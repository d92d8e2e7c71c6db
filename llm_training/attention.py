"""Causal core attention on torch's scaled_dot_product_attention, for the local (non-TE) layer spec.

megatron-core's local DotProductAttention materialises the s×s score matrix with baddbmm and needs
an apex fused softmax to be fast. SDPA dispatches to flash / memory-efficient / cuDNN kernels on
GPUs (and a math kernel on CPU) and never stores the scores, which matters at seq 2048, head dim 256.
"""

from __future__ import annotations

import contextlib

import torch
from megatron.core import tensor_parallel
from megatron.core.transformer.dot_product_attention import DotProductAttention
from megatron.core.transformer.enums import AttnMaskType
from torch import Tensor
from torch.nn.attention import SDPBackend, sdpa_kernel

BACKENDS = {
    "flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH,
}


class SDPACoreAttention(DotProductAttention):
    """DotProductAttention with the same constructor and state, computing causal attention via SDPA.

    `sdpa_backend` pins one SDPA kernel ("auto" keeps torch's choice): at head dim 256 the flash,
    cuDNN and memory-efficient kernels differ in speed, and pinning makes a run fail loudly rather
    than fall back silently when the kernel cannot take the inputs.
    """

    def __init__(self, *args: object, sdpa_backend: str = "auto", **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.sdpa_backend = sdpa_backend

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        attention_mask: Tensor | None,
        attn_mask_type: AttnMaskType | None = None,
        attention_bias: Tensor | None = None,
        packed_seq_params: object | None = None,
    ) -> Tensor:
        """Inputs [s, b, heads, head_dim] (per TP partition); output [s, b, heads·head_dim].

        The mask argument is ignored: GPT training here is always causal without padding, and the
        causal flag lets the kernels skip the upper triangle instead of reading a mask tensor.
        """
        if packed_seq_params is not None or attention_bias is not None:
            raise NotImplementedError("SDPACoreAttention supports plain causal attention only")
        groups = self.num_attention_heads_per_partition // self.num_query_groups_per_partition
        if groups > 1:
            key = key.repeat_interleave(groups, dim=2)
            value = value.repeat_interleave(groups, dim=2)
        # [s, b, n, d] -> [b, n, s, d]
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))
        dropout_p = self.attention_dropout.p if self.training else 0.0
        if dropout_p > 0.0 and not self.config.sequence_parallel:
            # Different TP ranks hold different heads: draw dropout from the model-parallel RNG stream.
            with tensor_parallel.get_cuda_rng_tracker().fork():
                context = self._sdpa(q, k, v, dropout_p)
        else:
            context = self._sdpa(q, k, v, dropout_p)
        # [b, n, s, d] -> [s, b, n·d]
        context = context.permute(2, 0, 1, 3).contiguous()
        return context.view(context.size(0), context.size(1), self.hidden_size_per_partition)

    def _sdpa(self, q: Tensor, k: Tensor, v: Tensor, dropout_p: float) -> Tensor:
        pinned = BACKENDS.get(self.sdpa_backend)
        with sdpa_kernel(pinned) if pinned is not None else contextlib.nullcontext():
            return torch.nn.functional.scaled_dot_product_attention(
                q, k, v, dropout_p=dropout_p, is_causal=True, scale=self.softmax_scale
            )
