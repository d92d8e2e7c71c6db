"""Dense peak FLOP/s per device, keyed by the name the framework reports (not by a system tag).

MFU = achieved model FLOP/s ÷ this peak. Values are dense (no sparsity) tensor-core peaks for
bf16/fp16, per device as the framework sees it (one MI250 GCD, not the two-die OAM). Sources:
the reference note shared/reference/anchors.md §1 (vendor datasheets, llm.c mfu.h). fp32 has no entry: its
peak depends on whether TF32 tensor cores are used, so MFU is reported as n/a rather than guessed.
Patterns are tried in order, so specific names (GH200, H100 PCIe, MI250X) come before generic ones.
"""

from __future__ import annotations

import re

_HALF = ("bf16", "fp16")

# (pattern on the reported device name, dense bf16/fp16 peak in FLOP/s)
_PEAKS: tuple[tuple[str, float], ...] = (
    (r"GH200", 989e12),
    (r"H200", 989e12),
    (r"H100.*PCIe", 756e12),
    (r"H100.*NVL", 835e12),
    (r"H100", 989e12),  # SXM5 ("NVIDIA H100 80GB HBM3"): 989.4 TFLOP/s
    (r"A100", 312e12),
    (r"B200", 2250e12),  # derived: FP8 dense 4.5 PF / 2
    (r"MI300X", 1307.4e12),
    (r"MI250X", 191.5e12),  # per GCD
    (r"MI250", 181e12),  # per GCD
    (r"GC200", 250e12),  # FP16.16 per IPU
)


def peak_flops(device_name: str, precision: str) -> float | None:
    """Dense peak FLOP/s of one device for `precision` ("bf16", "fp16", "fp32"), or None when unknown."""
    if precision not in _HALF or not device_name:
        return None
    for pattern, peak in _PEAKS:
        if re.search(pattern, device_name, flags=re.IGNORECASE):
            return peak
    return None
