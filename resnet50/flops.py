"""Model FLOPs per image of the two ResNet-50 variants, counted from the architecture.

Convention (stated in every run record): forward FLOPs = 2 × multiply-accumulates of the
convolution and fully connected layers (batch norm, ReLU, pooling, residual adds and biases
are not counted); one training step costs 3 × forward (backward = 2 × forward, the usual
convention of MLPerf and NVIDIA's tables). The count is analytic so that `validate` needs no
framework; tests check it against torch's FLOP counter and against Keras' layer shapes.

The variants differ only in where the stride-2 of a down-sampling bottleneck sits:
- "v1" (Keras `keras.applications.ResNet50`, the original paper): on the first 1×1 conv;
- "v1.5" (torchvision `resnet50`, MLPerf): on the 3×3 conv, so its 1×1 conv runs at the
  input resolution and costs more (4.09 vs 3.86 GMAC at 224 px).
"""

from __future__ import annotations

import dataclasses

from joulebench.record_types import ResNetFlopsFigures

STAGES = ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2))  # (width, blocks, stride of first block)
EXPANSION = 4
NUM_CLASSES = 1000
TRAINING_FACTOR = 3
CONVENTION = (
    "forward = 2 x MACs of conv and dense layers (BN, ReLU, pooling, adds, biases not counted); "
    "training step = 3 x forward"
)
ARCHITECTURES = {
    "v1": "keras ResNet50 v1 (stride on the first 1x1 conv of a down-sampling block)",
    "v1.5": "torchvision resnet50 v1.5 (stride on the 3x3 conv of a down-sampling block)",
}


@dataclasses.dataclass(frozen=True)
class FlopCount:
    variant: str
    image_size: int
    forward: float  # FLOPs per image, forward pass
    training: float  # FLOPs per image, forward + backward

    def to_dict(self) -> ResNetFlopsFigures:
        return {
            "architecture": ARCHITECTURES[self.variant], "variant": self.variant, "image_size": self.image_size,
            "flops_per_image_forward": self.forward, "flops_per_image_training": self.training,
            "flops_convention": CONVENTION,
        }


def _out(size: int, kernel: int, stride: int, pad: int) -> int:
    return (size + 2 * pad - kernel) // stride + 1


def _conv_macs(out_size: int, c_in: int, c_out: int, kernel: int) -> int:
    return out_size * out_size * c_in * c_out * kernel * kernel


def _bottleneck_macs(size: int, c_in: int, width: int, stride: int, variant: str) -> tuple[int, int]:
    """MACs of one bottleneck block and its output resolution."""
    out = _out(size, 3, stride, 1)  # equals _out(size, 1, stride, 0) for 1x1 convs: same resolution either way
    c_out = width * EXPANSION
    first_size = out if variant == "v1" else size
    macs = _conv_macs(first_size, c_in, width, 1) + _conv_macs(out, width, width, 3) + _conv_macs(out, width, c_out, 1)
    if stride != 1 or c_in != c_out:
        macs += _conv_macs(out, c_in, c_out, 1)  # projection shortcut
    return macs, out


def resnet50_flops(variant: str, image_size: int) -> FlopCount:
    """FLOPs per image of ResNet-50 `variant` ("v1" or "v1.5") on square `image_size` inputs, 1000 classes."""
    if variant not in ARCHITECTURES:
        raise ValueError(f"unknown ResNet-50 variant {variant!r}")
    size = _out(image_size, 7, 2, 3)
    macs = _conv_macs(size, 3, 64, 7)
    size = _out(size, 3, 2, 1)  # max pool
    c_in = 64
    for width, blocks, stride in STAGES:
        for block in range(blocks):
            block_macs, size = _bottleneck_macs(size, c_in, width, stride if block == 0 else 1, variant)
            macs += block_macs
            c_in = width * EXPANSION
    macs += c_in * NUM_CLASSES
    forward = 2.0 * macs
    return FlopCount(variant, image_size, forward, TRAINING_FACTOR * forward)
