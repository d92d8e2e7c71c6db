"""The CPU compatibility layer's scope, the peak-FLOP table, and the memory-fit estimate."""

from __future__ import annotations

import pytest
import torch

from joulebench.peaks import peak_flops
from llm_training import cpu_compat
from llm_training.cli import build_parser
from llm_training.config import resolve
from llm_training.memory import estimate_memory, fit_warning


def test_cpu_layer_redirects_cuda_calls_only_inside_and_restores_everything():
    original = torch.cuda.current_device
    with cpu_compat.cpu_mode("cpu"):
        assert torch.zeros(2, device="cuda").device.type == "cpu"
        assert torch.empty(2, device=torch.cuda.current_device()).device.type == "cpu"
        assert torch.ones(1).cuda().device.type == "cpu"
        assert torch.ones(1).to("cuda").device.type == "cpu"
        assert torch.ones(1).type() == "torch.cuda.FloatTensor"  # megatron's optimizer type check
        state = torch.cuda.get_rng_state()
        a = torch.rand(3)
        torch.cuda.set_rng_state(state)
        assert torch.equal(torch.rand(3), a)
    assert torch.cuda.current_device is original
    assert torch.ones(1).type() == "torch.FloatTensor"
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError):
            torch.zeros(1, device="cuda")


def test_cpu_layer_refuses_a_gpu_device():
    with pytest.raises(RuntimeError, match="CPU-only"), cpu_compat.cpu_mode("cuda:0"):
        pass


@pytest.mark.parametrize(
    ("name", "precision", "expected"),
    [
        ("NVIDIA H100 80GB HBM3", "bf16", 989e12),  # SXM
        ("NVIDIA H100 PCIe", "bf16", 756e12),
        ("NVIDIA H100 NVL", "fp16", 835e12),
        ("NVIDIA H200", "bf16", 989e12),
        ("NVIDIA GH200 480GB", "bf16", 989e12),
        ("NVIDIA A100-SXM4-40GB", "fp16", 312e12),
        ("AMD Instinct MI250X", "bf16", 191.5e12),
        ("AMD Instinct MI250", "bf16", 181e12),
        ("AMD Instinct MI300X", "bf16", 1307.4e12),
        ("NVIDIA H100 80GB HBM3", "fp32", None),  # TF32 or not: no single peak, MFU n/a
        ("cpu (x86_64)", "bf16", None),
        ("", "bf16", None),
    ],
)
def test_peak_flops_by_reported_device_name(name, precision, expected):
    assert peak_flops(name, precision) == expected


def _cfg(*args: str, world: int = 1):
    return resolve(build_parser().parse_args(["train", *args]), world)


def test_memory_estimate_orders_configurations_sensibly():
    base = estimate_memory(_cfg("--model", "800M"))
    # Parameter state of GPT-800M with bf16 weights, fp32 grads and Adam: 18 bytes/param ≈ 15.2 GiB.
    assert base.weights_gib + base.gradients_gib + base.optimizer_gib == pytest.approx(908.76e6 * 18 / 2**30, 1e-3)
    assert estimate_memory(_cfg("--model", "800M", "--micro-batch-size", "4")).total_gib < base.total_gib
    assert estimate_memory(_cfg("--model", "800M", "--recompute", "full")).activations_gib < base.activations_gib / 5
    sharded = estimate_memory(_cfg("--model", "800M", "--global-batch-size", "128", world=2))
    assert sharded.optimizer_gib == pytest.approx(base.optimizer_gib / 2)
    assert fit_warning(_cfg("--model", "800M"), 80.0) is None
    assert fit_warning(_cfg("--model", "800M"), None) is None
    assert "needs about" in fit_warning(_cfg("--model", "13B", "--tensor-parallel", "1", "--pipeline-parallel", "1",
                                             "--no-sequence-parallel"), 80.0)
