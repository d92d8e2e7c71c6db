"""ResNet-50 v1.5's convolution shapes and how often each occurs, for the issue 58 GPU scripts that time them
(benchmarks/cudnn_fusion_probe_h100.py: all 53; benchmarks/conv_stats_sweep_h100.py: the 36 1x1s)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ConvShape:
    """One convolution shape of ResNet-50 v1.5 and how often it occurs: `count` in the network, `after_bn_relu`
    of them reading a batch norm + ReLU output (conv2 and conv3 of a bottleneck: MLPerf folds that apply into the
    convolution, case (c)); the others read the max-pool or a block's output (residual add + ReLU), case (b)."""

    cin: int
    cout: int
    side: int  # input height = width
    kernel: int
    stride: int
    count: int
    after_bn_relu: int

    @property
    def label(self) -> str:
        k = self.kernel
        return f"{k}x{k}/{self.cin}-{self.cout}@{self.side}" + ("" if self.stride == 1 else f"/s{self.stride}")

    @property
    def padding(self) -> int:
        return self.kernel // 2

    @property
    def out_side(self) -> int:
        return (self.side + 2 * self.padding - self.kernel) // self.stride + 1

    def bytes_moved(self, batch: int, itemsize: int) -> int:
        """Input, weights and output, each once: what the fused form must move at least."""
        return itemsize * (batch * self.cin * self.side ** 2 + self.cout * self.cin * self.kernel ** 2
                           + batch * self.cout * self.out_side ** 2)


# ResNet-50 v1.5 (stride in the 3x3), all 53 convolutions; issue 58's twelve first, as a time budget may cut the tail.
SHAPES = (
    ConvShape(64, 256, 56, 1, 1, 4, 3), ConvShape(256, 64, 56, 1, 1, 2, 0), ConvShape(512, 128, 28, 1, 1, 3, 0),
    ConvShape(128, 512, 28, 1, 1, 4, 4), ConvShape(1024, 256, 14, 1, 1, 5, 0), ConvShape(256, 1024, 14, 1, 1, 6, 6),
    ConvShape(2048, 512, 7, 1, 1, 2, 0), ConvShape(512, 2048, 7, 1, 1, 3, 3), ConvShape(64, 64, 56, 3, 1, 3, 3),
    ConvShape(128, 128, 28, 3, 1, 3, 3), ConvShape(256, 256, 14, 3, 1, 5, 5), ConvShape(512, 512, 7, 3, 1, 2, 2),
    ConvShape(64, 64, 56, 1, 1, 1, 0), ConvShape(256, 128, 56, 1, 1, 1, 0), ConvShape(512, 256, 28, 1, 1, 1, 0),
    ConvShape(1024, 512, 14, 1, 1, 1, 0), ConvShape(128, 128, 56, 3, 2, 1, 1), ConvShape(256, 256, 28, 3, 2, 1, 1),
    ConvShape(512, 512, 14, 3, 2, 1, 1), ConvShape(256, 512, 56, 1, 2, 1, 0), ConvShape(512, 1024, 28, 1, 2, 1, 0),
    ConvShape(1024, 2048, 14, 1, 2, 1, 0), ConvShape(3, 64, 224, 7, 2, 1, 0))
