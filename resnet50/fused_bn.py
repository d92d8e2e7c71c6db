"""ResNet-50 v1.5 whose batch norms run our own Triton kernels in training, with the ReLU and the residual add fused.

torchvision's `resnet50` is `ResNet(Bottleneck, [3, 4, 6, 3])`; here the same constructor gets a Bottleneck whose
forward hands each convolution's output to one BatchNormAct (batch norm, then the residual add, then the ReLU, in
one apply pass) and batch norms of that class. With `conv_stats` (`--bn-kernels triton-conv`) the 1×1 convolutions
(conv1, conv3 and the downsample's, three of each block's four) run resnet50/conv_stats.py's GEMM, which hands its
batch norm the batch statistics as well, so that norm skips its reduction pass; the 3×3s and the stem stay cuDNN's.
Construction draws the same random numbers in the same order, so a seed gives the same weights as torchvision's
model, and parameter and buffer names (state_dict) are unchanged. Imported only for `--bn-kernels triton[-conv]`
(it loads Triton).
"""

from __future__ import annotations

from typing import cast

import torch
import torch.nn.functional as F
from torch import nn
from torchvision.models.resnet import Bottleneck, ResNet

import resnet50.conv_stats  # noqa: F401 (registers joulebench::conv1x1_batch_norm_stats and bn_kernels' ops)

RESNET50_LAYERS = [3, 4, 6, 3]
Stats = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # per channel: batch mean, 1/std, unbiased variance


class BatchNormAct(nn.BatchNorm2d):
    """BatchNorm2d, then an optional residual add, then an optional ReLU; training runs the Triton kernels and updates
    the running statistics as torch does (momentum, unbiased variance for running_var)."""

    relu = False  # set per instance where a ReLU follows

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None, stats: Stats | None = None
                ) -> torch.Tensor:
        """`stats`: x's batch statistics where its convolution computed them (training only; else measured here)."""
        if not self.training:
            out = F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias, False, 0.0, self.eps)
            out = out if residual is None else out + residual
            return F.relu(out) if self.relu else out
        mean, invstd, var = stats or torch.ops.joulebench.batch_norm_stats(x.detach(), self.eps)
        y = torch.ops.joulebench.bn_act_apply(x, self.weight, self.bias, residual, mean, invstd, self.relu)
        self._update_running_stats(mean, var)
        return y

    @torch.no_grad()
    def _update_running_stats(self, mean: torch.Tensor, var: torch.Tensor) -> None:
        if self.running_mean is None or self.running_var is None or self.num_batches_tracked is None:
            return  # track_running_stats=False: nothing kept
        self.num_batches_tracked.add_(1)
        factor = self.momentum if self.momentum is not None else 1.0 / float(self.num_batches_tracked)
        self.running_mean.mul_(1 - factor).add_(mean, alpha=factor)
        self.running_var.mul_(1 - factor).add_(var, alpha=factor)


def gemm_shaped(conv: nn.Conv2d) -> bool:
    """A 1×1 convolution without padding, dilation, groups or bias (any equal stride): a GEMM over (strided) rows."""
    return (conv.kernel_size == (1, 1) and conv.padding == (0, 0) and conv.dilation == (1, 1) and conv.groups == 1
            and conv.bias is None and conv.stride[0] == conv.stride[1])


class FusedBottleneck(Bottleneck):
    """torchvision's Bottleneck (v1.5: stride in the 3×3) with ReLU and residual add inside its batch norms."""

    conv_stats = False  # the 1×1 convolutions compute their batch norm's statistics (ConvStatsBottleneck)

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        for norm in (self.bn1, self.bn2, self.bn3):
            norm.relu = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x
        if self.downsample is not None:  # its batch norm has neither add nor ReLU
            conv, norm = cast(nn.Sequential, self.downsample)
            identity = self._conv_norm(conv, norm, x)
        out = self._conv_norm(self.conv1, self.bn1, x)
        out = self.bn2(self.conv2(out))
        return self._conv_norm(self.conv3, self.bn3, out, identity)

    def _conv_norm(self, conv: nn.Conv2d, norm: BatchNormAct, x: torch.Tensor,
                   residual: torch.Tensor | None = None) -> torch.Tensor:
        if self.conv_stats and norm.training and gemm_shaped(conv):
            y, mean, invstd, var = torch.ops.joulebench.conv1x1_batch_norm_stats(x, conv.weight.to(x.dtype),
                                                                                 conv.stride[0], norm.eps)
            return norm(y, residual, (mean, invstd, var))
        return norm(conv(x), residual)


class ConvStatsBottleneck(FusedBottleneck):
    """FusedBottleneck whose 1×1 convolutions hand their batch norms the batch statistics (`--bn-kernels
    triton-conv`)."""

    conv_stats = True


def fused_resnet50(conv_stats: bool = False) -> ResNet:
    """ResNet-50 v1.5 as torchvision builds it, with BatchNormAct throughout; the stem's ReLU moves into its norm."""
    model = ResNet(ConvStatsBottleneck if conv_stats else FusedBottleneck, RESNET50_LAYERS, norm_layer=BatchNormAct)
    model.bn1.relu = True
    model.relu = nn.Identity()
    return model
