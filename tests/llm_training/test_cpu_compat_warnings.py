"""The CPU layer raises no warning of its own on a CPU training run (issue 62 item 4: a 565-column torch warning on
every run): megatron's distributed optimizer reads `.grad` of non-leaf views in zero_grad, and through the layer's
TorchFunctionMode torch reported that as raised in llm_training/cpu_compat.py."""

from __future__ import annotations

import warnings

import torch
from megatron.core.optimizer.optimizer import _zero_grad_group_helper

from llm_training.cpu_compat import cpu_mode


def test_megatron_s_grad_access_is_not_reported_as_the_cpu_layer_s_warning() -> None:
    view = torch.zeros(4, requires_grad=True)[:2]  # not a leaf, as the optimizer's shard views
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with cpu_mode("cpu"):
            _zero_grad_group_helper([view], set_to_none=True)
        _zero_grad_group_helper([view], set_to_none=True)  # outside the layer: torch's warning, megatron's own
    ours = [w for w in seen if w.filename.endswith("cpu_compat.py")]
    assert not ours, [str(w.message)[:80] for w in ours]
    assert any(".grad attribute" in str(w.message) for w in seen)  # the access itself is real, and shown as megatron's
