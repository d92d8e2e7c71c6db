"""Kernel classes: GPU kernel names grouped by what they do, for the kernel profile and the attribution fit.

First match wins, on lower-cased kernel names: attention comes first so cuDNN's SDPA kernels
("..._sdpa_..._flash_fprop_...") are not taken for convolutions; convolution comes before gemm because
cuDNN's convolutions are implicit GEMMs named "sm90_xmma_fprop_implicit_gemm..." or "cutlass_..._s16816fprop_...";
it skips Triton kernels, whose names list the fused ATen ops ("triton_poi_fused_convolution_..." is an
epilogue, not a convolution). Inductor fusions that contain a batch norm
("triton_red_fused__native_batch_norm_legit_functional_relu_0") get their own class "triton (batch-norm fusions)":
a fused kernel also does the ReLU/add, so counting it as batchnorm would overstate BN, yet lumping it with the
other fusions would hide that compiled ResNet time is mostly BN. "batchnorm" itself is the eager kernels (ATen
batch_norm_*, cuDNN bn_fw/bn_bw/batchnorm_*); "welford" is not a pattern since layer-norm kernels use Welford too.
The order is also the priority when kernels of two classes run at the same time (attribution fit).
"""

from __future__ import annotations

import re

CATEGORIES = [
    ("attention", r"flash|fmha|sdpa|cudnn.*attn|attention|efficient_attention"),
    ("convolution", r"^(?!triton).*(conv(?!ert)|implicit_gemm|fprop|dgrad|wgrad|winograd)"),
    ("gemm", r"gemm|sm90_xmma|cutlass|nvjet|cublas|matmul"),
    ("optimizer", r"adam|multi_tensor|foreach|l2norm"),
    ("communication", r"nccl"),
    ("memcpy/memset", r"memcpy|memset"),
    ("triton (batch-norm fusions)", r"^triton.*batch_norm"),
    ("triton (compiled fusions)", r"triton"),
    ("batchnorm", r"batch_norm|batchnorm|bn_fw|bn_bw"),
    ("elementwise/other", r".*"),
]
CATEGORY_NAMES = tuple(label for label, _ in CATEGORIES)


def category(name: str) -> str:
    lowered = name.lower()
    return next(label for label, pattern in CATEGORIES if re.search(pattern, lowered))
