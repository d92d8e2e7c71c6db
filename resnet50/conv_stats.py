"""A 1×1 convolution whose GEMM also measures its batch norm's statistics (`--bn-kernels triton-conv`).

Why: the following batch norm otherwise reads the convolution's output once more only to sum it (issue 58,
docs/perf-notes.md). Over channels-last activations a 1×1 convolution of stride 1 is the GEMM (N·H·W, Cin) ×
(Cin, Cout); of stride s, the same GEMM over every s-th row and column of each image (ResNet-50 v1.5's downsample
convolutions, stride 2, are included: their norms hold 0.77 of 5.69 GB of batch-norm bytes). Each program computes
output tiles of BLOCK_M rows × BLOCK_N channels for a run of consecutive row tiles, writes them (bf16 under autocast),
and merges each tile's moments of the values as written (mean and squared deviations from it, fp32) into its own;
bn_kernels' finalize merges the programs' moments (Chan's formula: no cancellation) into the mean, 1/std and
unbiased variance the norm uses. Backward stays torch's: aten.convolution_backward (cuDNN's dgrad and wgrad, as
for torch's own convolution); the statistics have no gradient of their own, the norm's backward covers them.
Registered as the custom op `joulebench::conv1x1_batch_norm_stats` so torch.compile keeps it in its graph.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from resnet50.bn_kernels import (
    as_rows,
    channel_stats_like,
    check_rows,
    finalize_stats,
    merge_moments,
    program_channels,
    slices,
)

BLOCK_M = 128  # output rows per tile: the wgmma-friendly height
MAX_BLOCK_N, MAX_BLOCK_K = 128, 64  # output channels per tile; input channels per step of the GEMM's inner loop
# Shared memory the pipeline's stages may take (an H100 block has 227 KiB; the rest is left for the epilogue's
# layout conversion): fp32 tiles (--precision fp32) are twice bf16's, so they get half the stages
PIPELINE_SHARED_BYTES = 192 * 1024


@triton.jit
def conv1x1_gemm_with_batch_norm_stats(x_ptr, w_ptr, y_ptr, partial_ptr, rows, in_channels, out_channels, height,
                                       width, out_height, out_width, stride, tiles_per_program,
                                       STRIDED: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                                       BLOCK_K: tl.constexpr, FLATTEN: tl.constexpr = False):
    """y = x·wᵀ over BLOCK_M-row tiles; partial[program] = (mean, squared deviations) of its tiles' y per channel.
    FLATTEN: Triton pipelines the tile and K loops as one, so the next tile's loads are in flight during a tile's
    epilogue (a 1x1 convolution's K loop is one to eight steps; issue 58's sweep measures it)."""
    cols, col_ok = program_channels(0, out_channels, BLOCK_N)
    mean = tl.zeros([BLOCK_N], dtype=tl.float32)
    m2 = tl.zeros([BLOCK_N], dtype=tl.float32)
    count = tl.zeros([], dtype=tl.float32)
    first = tl.program_id(1) * tiles_per_program
    for tile in tl.range(first, tl.minimum(first + tiles_per_program, tl.cdiv(rows, BLOCK_M)), flatten=FLATTEN):
        row = tile * BLOCK_M + tl.arange(0, BLOCK_M).to(tl.int64)
        row_ok = row < rows
        source = row
        if STRIDED:  # output (n, h, w) reads input (n, h·stride, w·stride)
            image_row = row // out_width
            source = ((image_row // out_height) * height + (image_row % out_height) * stride) * width + (
                row % out_width) * stride
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for k in range(0, in_channels, BLOCK_K):
            ks = k + tl.arange(0, BLOCK_K)
            k_ok = ks < in_channels
            a = tl.load(x_ptr + source[:, None] * in_channels + ks[None, :], mask=row_ok[:, None] & k_ok[None, :],
                        other=0.0)
            b = tl.load(w_ptr + cols[None, :] * in_channels + ks[:, None], mask=k_ok[:, None] & col_ok[None, :],
                        other=0.0)
            acc = tl.dot(a, b, acc)
        y = acc.to(y_ptr.dtype.element_ty)
        ok = row_ok[:, None] & col_ok[None, :]
        tl.store(y_ptr + row[:, None] * out_channels + cols[None, :], y, mask=ok)
        values = tl.where(ok, y.to(tl.float32), 0.0)  # the moments of what the norm will read
        tile_count = tl.minimum(rows - tile * BLOCK_M, BLOCK_M).to(tl.float32)
        tile_mean = tl.sum(values, axis=0) / tile_count
        deviation = tl.where(ok, values - tile_mean[None, :], 0.0)
        mean, m2, count = merge_moments(mean, m2, count, tile_mean, tl.sum(deviation * deviation, axis=0),
                                        tile_count)
    out = partial_ptr + tl.program_id(1) * 2 * out_channels + cols
    tl.store(out, mean, mask=col_ok)
    tl.store(out + out_channels, m2, mask=col_ok)


def tile_width(widest: int, channels: int) -> int:
    """The widest tile of at most `widest` that these channels fill (a power of two; tl.dot needs 16 or more)."""
    return max(16, min(widest, triton.next_power_of_2(channels)))


def launch_config(in_channels: int, out_channels: int, element_bytes: int) -> dict[str, int]:
    """Tile and launch parameters: the widest tiles these channel counts fill (tl.dot needs 16 or more), 8 warps for
    the 128 × 128 accumulator (64 fp32 registers a thread), pipeline stages only as deep as the K loop and as
    PIPELINE_SHARED_BYTES holds for tiles of this element size."""
    block_n, block_k = tile_width(MAX_BLOCK_N, out_channels), tile_width(MAX_BLOCK_K, in_channels)
    stage_bytes = (BLOCK_M + block_n) * block_k * element_bytes  # one stage: an x tile and a weight tile
    stages = min(4, triton.cdiv(in_channels, block_k), PIPELINE_SHARED_BYTES // stage_bytes)
    return {"BLOCK_M": BLOCK_M, "BLOCK_N": block_n, "BLOCK_K": block_k, "num_warps": 8 if block_n == 128 else 4,
            "num_stages": max(2, stages)}


@torch.library.custom_op("joulebench::conv1x1_batch_norm_stats", mutates_args=())
def conv1x1_batch_norm_stats(x: torch.Tensor, weight: torch.Tensor, stride: int, eps: float
                             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(y, batch mean, batch 1/std, batch unbiased variance): the 1×1 convolution (no bias) of x (N, Cin, H, W) with
    weight (Cout, Cin, 1, 1) at this stride, channels-last, and the per-channel statistics of y for its batch norm."""
    x = as_rows(x)
    batch, in_channels, height, width = x.shape
    out_channels = weight.shape[0]
    out_height, out_width = (height - 1) // stride + 1, (width - 1) // stride + 1
    rows = batch * out_height * out_width
    check_rows(rows, (batch, out_channels, out_height, out_width))
    y = torch.empty((batch, out_channels, out_height, out_width), dtype=x.dtype, device=x.device,
                    memory_format=torch.channels_last)
    config = launch_config(in_channels, out_channels, x.element_size())
    channel_blocks = triton.cdiv(out_channels, config["BLOCK_N"])
    slice_count, per_slice = slices(rows, channel_blocks, BLOCK_M)
    partial = x.new_empty((slice_count, 2, out_channels), dtype=torch.float32)
    conv1x1_gemm_with_batch_norm_stats[(channel_blocks, slice_count)](
        x, weight.reshape(out_channels, in_channels).contiguous(), y, partial, rows, in_channels, out_channels, height,
        width, out_height, out_width, stride, per_slice // BLOCK_M, STRIDED=stride != 1, **config)
    return (y, *finalize_stats(partial, rows, per_slice, eps))


@conv1x1_batch_norm_stats.register_fake
def _(x: torch.Tensor, weight: torch.Tensor, stride: int, eps: float
      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    batch, _in_channels, height, width = x.shape
    shape = (batch, weight.shape[0], (height - 1) // stride + 1, (width - 1) // stride + 1)
    y = torch.empty(shape, dtype=x.dtype, device=x.device, memory_format=torch.channels_last)
    return (y, *channel_stats_like(x, weight.shape[0]))


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: tuple[torch.Tensor, ...]) -> None:
    x, weight, stride, _eps = inputs
    ctx.save_for_backward(x, weight)
    ctx.stride = stride
    ctx.mark_non_differentiable(*output[1:])  # the statistics: the batch norm's backward accounts for them
    ctx.set_materialize_grads(False)


def _backward(ctx: Any, dy: torch.Tensor, *_stat_grads: Any) -> tuple[Any, ...]:
    """dx and dweight of the convolution by torch (cuDNN on GPUs), as torch's own Conv2d computes them."""
    x, weight = ctx.saved_tensors
    dx, dweight, _ = torch.ops.aten.convolution_backward(dy, x, weight, None, [ctx.stride] * 2, [0, 0], [1, 1], False,
                                                         [0, 0], 1, [True, True, False])
    return dx, dweight, None, None


conv1x1_batch_norm_stats.register_autograd(_backward, setup_context=_setup_context)
