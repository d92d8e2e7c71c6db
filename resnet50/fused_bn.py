"""ResNet-50 v1.5 whose batch norms run our own Triton kernels in training, with the ReLU and the residual add fused.

torchvision's `resnet50` is `ResNet(Bottleneck, [3, 4, 6, 3])`; here the same constructor gets a Bottleneck whose
forward hands each convolution's output to one BatchNormAct (batch norm, then the residual add, then the ReLU, in
one apply pass) and batch norms of that class. Construction draws the same random numbers in the same order, so a
seed gives the same weights as torchvision's model, and parameter and buffer names (state_dict) are unchanged.
Imported only for `--bn-kernels triton` (it loads Triton).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torchvision.models.resnet import Bottleneck, ResNet

import resnet50.bn_kernels  # noqa: F401 (registers torch.ops.joulebench.bn_act_forward)

RESNET50_LAYERS = [3, 4, 6, 3]


class BatchNormAct(nn.BatchNorm2d):
    """BatchNorm2d, then an optional residual add, then an optional ReLU; training runs the Triton kernels and updates
    the running statistics as torch does (momentum, unbiased variance for running_var)."""

    relu = False  # set per instance where a ReLU follows

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        if not self.training:
            out = F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias, False, 0.0, self.eps)
            out = out if residual is None else out + residual
            return F.relu(out) if self.relu else out
        y, mean, _invstd, var = torch.ops.joulebench.bn_act_forward(x, self.weight, self.bias, residual, self.eps,
                                                                     self.relu)
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


class FusedBottleneck(Bottleneck):
    """torchvision's Bottleneck (v1.5: stride in the 3×3) with ReLU and residual add inside its batch norms."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        for norm in (self.bn1, self.bn2, self.bn3):
            norm.relu = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)  # its batch norm has neither add nor ReLU
        out = self.bn1(self.conv1(x))
        out = self.bn2(self.conv2(out))
        return self.bn3(self.conv3(out), identity)


def fused_resnet50() -> ResNet:
    """ResNet-50 v1.5 as torchvision builds it, with BatchNormAct throughout; the stem's ReLU moves into its norm."""
    model = ResNet(FusedBottleneck, RESNET50_LAYERS, norm_layer=BatchNormAct)
    model.bn1.relu = True
    model.relu = nn.Identity()
    return model
