"""Parameter and FLOP counts from the real GPTModel (meta device), SDPA attention vs megatron's, CPU layer."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from joulebench.peaks import peak_flops
from llm_training.cli import build_parser
from llm_training.config import resolve
from llm_training.flops import caraml_nvidia_flops_per_token, model_flops_per_token, parameter_count

pytestmark = pytest.mark.usefixtures("megatron_world_of_one")


def _cfg(model: str):
    args = build_parser().parse_args(["train", "--model", model, "--tensor-parallel", "1", "--pipeline-parallel", "1"])
    return resolve(args, world_size=1)


def _real_parameter_count(model: str) -> int:
    """Parameters of the GPTModel the driver builds, on the meta device (no memory, any size)."""
    from llm_training.model import build_gpt, transformer_config

    cfg = _cfg(model)
    config = dataclasses.replace(transformer_config(cfg, "cpu"), perform_initialization=False)
    with torch.device("meta"):
        gpt = build_gpt(cfg, config, pre_process=True, post_process=True)
    return sum(p.numel() for p in gpt.parameters())


def test_gpt_800m_has_908_8m_parameters_and_6_258_gflop_per_token():
    params = _real_parameter_count("800M")
    # Stated independently (CARAML spec, anchors.md §6): 908.8 M with tied embeddings, 6.258 GFLOP/token.
    assert params / 1e6 == pytest.approx(908.8, abs=0.05)
    flops = model_flops_per_token(params, num_layers=16, hidden_size=2048, seq_length=2048)
    assert flops / 1e9 == pytest.approx(6.258, abs=0.0005)
    # CARAML's NVIDIA factor-4 count for the same model: 8.134 GFLOP/token.
    assert caraml_nvidia_flops_per_token(16, 2048, 2048, 50304) / 1e9 == pytest.approx(8.134, abs=0.0005)
    # 100 % MFU on an H100 SXM is ~158,105 tokens/s (anchors.md §6).
    assert peak_flops("NVIDIA H100 80GB HBM3", "bf16") / flops == pytest.approx(158_105, rel=1e-3)


@pytest.mark.parametrize("model", ["tiny", "117M", "13B", "175B"])
def test_parameter_formula_matches_the_real_model(model):
    cfg = _cfg(model)
    assert parameter_count(cfg.shape, cfg.padded_vocab_size) == _real_parameter_count(model)


def test_gpt2_small_shape_is_about_124m_with_tied_embeddings():
    # GPT-2 small is quoted as 124 M (117 M in the paper); RoPE here drops its 0.8 M position table.
    assert _real_parameter_count("117M") / 1e6 == pytest.approx(123.7, abs=0.1)


def test_sdpa_core_attention_matches_megatron_dot_product_attention():
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.dot_product_attention import DotProductAttention
    from megatron.core.transformer.enums import AttnMaskType
    from megatron.core.transformer.utils import get_default_causal_mask

    from llm_training.attention import SDPACoreAttention

    config = TransformerConfig(num_layers=1, hidden_size=64, num_attention_heads=4, attention_dropout=0.0,
                               masked_softmax_fusion=False, use_cpu_initialization=True)
    reference = DotProductAttention(config, 1, AttnMaskType.causal, "self")
    ours = SDPACoreAttention(config, 1, AttnMaskType.causal, "self")
    seq, batch = 12, 3
    q, k, v = (torch.randn(seq, batch, 4, 16) for _ in range(3))
    mask = get_default_causal_mask(seq).view(1, 1, seq, seq)
    expected = reference(q, k, v, mask)
    got = ours(q, k, v, None)
    assert got.shape == (seq, batch, 64)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    # Causality: changing the last position's key/value leaves earlier outputs unchanged.
    k2, v2 = k.clone(), v.clone()
    k2[-1] += 1.0
    v2[-1] -= 1.0
    torch.testing.assert_close(ours(q, k2, v2, None)[:-1], got[:-1])


def test_pinned_sdpa_backend_is_used_and_a_kernel_that_cannot_run_fails_loudly():
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.enums import AttnMaskType

    from llm_training.attention import SDPACoreAttention

    config = TransformerConfig(num_layers=1, hidden_size=64, num_attention_heads=4, attention_dropout=0.0,
                               masked_softmax_fusion=False, use_cpu_initialization=True)
    q, k, v = (torch.randn(8, 2, 4, 16) for _ in range(3))
    auto = SDPACoreAttention(config, 1, AttnMaskType.causal, "self")
    math = SDPACoreAttention(config, 1, AttnMaskType.causal, "self", sdpa_backend="math")
    torch.testing.assert_close(math(q, k, v, None), auto(q, k, v, None))
    cudnn_on_cpu = SDPACoreAttention(config, 1, AttnMaskType.causal, "self", sdpa_backend="cudnn")
    with pytest.raises(RuntimeError):  # no cuDNN kernel on the CPU: no silent fallback to another kernel
        cudnn_on_cpu(q, k, v, None)


def test_compiled_rope_matches_megatron_rope_forward_and_backward_and_switches_back():
    from megatron.core.models.common.embeddings import rope_utils

    from llm_training.model import use_compiled_rope

    original = rope_utils._apply_rotary_pos_emb_bshd
    freqs = torch.randn(16, 1, 1, 32)
    t = torch.randn(16, 2, 4, 32, requires_grad=True)
    expected = original(t, freqs)
    (expected_grad,) = torch.autograd.grad(expected.square().sum(), t)
    try:
        use_compiled_rope(True)
        use_compiled_rope(True)  # idempotent: wraps the original, not the compiled wrapper
        compiled = rope_utils._apply_rotary_pos_emb_bshd
        assert compiled is not original and compiled._torchdynamo_orig_callable is original
        got = compiled(t, freqs)
        (got_grad,) = torch.autograd.grad(got.square().sum(), t)
    finally:
        use_compiled_rope(False)
    assert rope_utils._apply_rotary_pos_emb_bshd is original
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(got_grad, expected_grad)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_compiled_cross_entropy_matches_megatron_loss_and_logit_gradient(dtype):
    from megatron.core import parallel_state, tensor_parallel

    from llm_training.cross_entropy import vocab_parallel_cross_entropy

    torch.manual_seed(0)
    logits = (torch.randn(16, 2, 96) * 4).to(dtype).requires_grad_()
    target = torch.randint(0, 96, (16, 2))
    grad_out = torch.rand(16, 2)
    expected = tensor_parallel.vocab_parallel_cross_entropy(logits.float(), target)  # megatron's GPTModel path
    (expected_grad,) = torch.autograd.grad(expected, logits, grad_out)
    got = vocab_parallel_cross_entropy(logits, target, parallel_state.get_tensor_model_parallel_group())
    (got_grad,) = torch.autograd.grad(got, logits, grad_out)
    assert got.dtype == torch.float32 and got_grad.dtype == dtype
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(got_grad, expected_grad)


def test_layernorms_are_tagged_for_sequence_parallel_gradient_reduction():
    from megatron.core.transformer import TransformerConfig

    from llm_training.model import TaggedLayerNorm

    on = TransformerConfig(num_layers=1, hidden_size=8, num_attention_heads=2, tensor_model_parallel_size=2,
                           sequence_parallel=True)
    off = dataclasses.replace(on, sequence_parallel=False)
    assert all(p.sequence_parallel for p in TaggedLayerNorm(on, 8).parameters())
    assert not any(p.sequence_parallel for p in TaggedLayerNorm(off, 8).parameters())
