"""Training-mode batch norm + (residual add) + ReLU in Triton kernels of our own, over channels-last activations.

Why: in the compiled README run, inductor's batch-norm fusions take 47 % of the kernel time (docs/perf-notes.md).
These kernels read each activation as few times as the math allows, with fp32 accumulation of bf16 data:
forward, one reduction pass (per-channel moments) and one apply pass (normalise, scale and shift, add the residual,
ReLU); backward, one reduction pass (sum dz and sum dz·x̂, dz = dy through the ReLU mask) and one elementwise pass
writing dx (and the residual's gradient, which is dz). The ReLU mask is recomputed from x where there is no residual
(no read of the output); with a residual it is read from the output. A channels-last (N, C, H, W) tensor is a
row-major (N·H·W, C) matrix: programs tile rows × channels.

Statistics travel as per-slice moments (partial: slices × 2 × channels, fp32): each slice of rows gives its mean and
its sum of squared deviations from that mean, and the finalize merges them (Chan's parallel formula), which
subtracts no two large sums. The reduction pass here makes them from sums shifted by the channel's first value (its
means stay about that pivot: no error grows with the mean); resnet50/conv_stats.py's convolution makes them in its
GEMM's epilogue about 0 (the error grows linearly with mean/std, where a sum of squares less the squared sum
grows quadratically: docs/perf-notes.md), so its batch norm skips that pass.

Registered as torch custom ops (`joulebench::batch_norm_stats`, and `joulebench::bn_act_apply` with autograd
attached, whose backward is the whole batch norm's: the statistics are inputs without a gradient) so that
torch.compile keeps them in its graph as opaque calls (no graph break; CUDA graphs capture them). Imported only
for `--bn-kernels triton[-conv]`; tested on the CPU in Triton's interpreter (TRITON_INTERPRET=1).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import triton
import triton.language as tl

BLOCK_ROWS = 64  # rows (N·H·W positions) per tile
PROGRAMS_WANTED = 1024  # reduction programs aimed for: several waves on a 132-SM GPU, few partial sums to add
FINAL_BLOCK_S, FINAL_BLOCK_C = 64, 16  # tile of the partial sums' reduction: a few programs even at 64 channels


@triton.jit
def merge_moments(mean, m2, count, other_mean, other_m2, other_count):
    """Mean and sum of squared deviations of two groups together (Chan et al.), from each group's own."""
    total = count + other_count
    delta = other_mean - mean
    return mean + delta * (other_count / total), m2 + other_m2 + delta * delta * (count * other_count / total), total


@triton.jit
def program_channels(axis: tl.constexpr, channels, BLOCK_C: tl.constexpr):
    """This program's BLOCK_C channel indices (its tile along grid axis `axis`) and which of them exist."""
    cols = tl.program_id(axis) * BLOCK_C + tl.arange(0, BLOCK_C)
    return cols, cols < channels


@triton.jit
def _rows_at(first_row, rows, channels, cols, col_ok, BLOCK_M: tl.constexpr):
    """The mask and the offsets of BLOCK_M rows from first_row × these channels in the (rows, channels) matrix."""
    row = first_row + tl.arange(0, BLOCK_M).to(tl.int64)
    return (row < rows)[:, None] & col_ok[None, :], row[:, None] * channels + cols[None, :]


@triton.jit
def triton_batch_norm_stats(x_ptr, partial_ptr, rows, channels, rows_per_program,
                            BLOCK_M: tl.constexpr, BLOCK_C: tl.constexpr):
    """One slice of rows' per-channel moments about the pivot (row 0's value): its mean − pivot and its squared
    deviations from its mean, from sums of (x − pivot) and (x − pivot)²."""
    cols, col_ok = program_channels(0, channels, BLOCK_C)
    pivot = tl.load(x_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    total = tl.zeros([BLOCK_M, BLOCK_C], dtype=tl.float32)
    squares = tl.zeros([BLOCK_M, BLOCK_C], dtype=tl.float32)
    start = tl.program_id(1) * rows_per_program
    for offset in range(start, start + rows_per_program, BLOCK_M):
        ok, at = _rows_at(offset, rows, channels, cols, col_ok, BLOCK_M)
        x = tl.load(x_ptr + at, mask=ok, other=0.0).to(tl.float32)
        shifted = tl.where(ok, x - pivot[None, :], 0.0)
        total += shifted
        squares += shifted * shifted
    count = tl.minimum(rows - start, rows_per_program).to(tl.float32)
    shift = tl.sum(total, axis=0) / count
    out = partial_ptr + tl.program_id(1) * 2 * channels + cols
    tl.store(out, shift, mask=col_ok)  # the mean less the pivot, which the finalize adds back
    tl.store(out + channels, tl.maximum(tl.sum(squares, axis=0) - shift * shift * count, 0.0), mask=col_ok)


@triton.jit
def triton_batch_norm_stats_finalize(partial_ptr, x_ptr, mean_ptr, invstd_ptr, var_ptr, channels, slices, rows,
                                     rows_per_slice, eps, PIVOT_FROM_X: tl.constexpr, BLOCK_S: tl.constexpr,
                                     BLOCK_C: tl.constexpr):
    """Mean, 1/sqrt(biased var + eps) and the unbiased variance (for running_var) from the slices' moments, merged a
    tile of BLOCK_S slices at a time (a loop over one slice at a time would wait on a thousand loads in a row).
    PIVOT_FROM_X: the slices' means are about x's row 0 (triton_batch_norm_stats), else about 0."""
    cols, col_ok = program_channels(0, channels, BLOCK_C)
    mean = tl.zeros([BLOCK_C], dtype=tl.float32)
    m2 = tl.zeros([BLOCK_C], dtype=tl.float32)
    count = tl.zeros([], dtype=tl.float32)
    for offset in range(0, slices, BLOCK_S):
        piece = offset + tl.arange(0, BLOCK_S)
        sizes = tl.minimum(tl.maximum(rows - piece * rows_per_slice, 0), rows_per_slice).to(tl.float32)
        ok = (piece < slices)[:, None] & col_ok[None, :]
        at = partial_ptr + piece[:, None] * 2 * channels + cols[None, :]
        means = tl.load(at, mask=ok, other=0.0)
        tile_count = tl.sum(sizes, axis=0)
        tile_mean = tl.sum(sizes[:, None] * means, axis=0) / tile_count
        deviation = means - tile_mean[None, :]
        tile_m2 = tl.sum(tl.load(at + channels, mask=ok, other=0.0) + sizes[:, None] * deviation * deviation, axis=0)
        mean, m2, count = merge_moments(mean, m2, count, tile_mean, tile_m2, tile_count)
    if PIVOT_FROM_X:
        mean += tl.load(x_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    tl.store(mean_ptr + cols, mean, mask=col_ok)
    tl.store(invstd_ptr + cols, 1.0 / tl.sqrt(m2 / rows + eps), mask=col_ok)
    tl.store(var_ptr + cols, m2 / (rows - 1), mask=col_ok)


@triton.jit
def _tile(rows, channels, BLOCK_M: tl.constexpr, BLOCK_C: tl.constexpr):
    """This program's tile of an elementwise pass: channel indices, their mask, the tile's mask and its offsets."""
    cols, col_ok = program_channels(1, channels, BLOCK_C)
    ok, at = _rows_at(tl.program_id(0) * BLOCK_M, rows, channels, cols, col_ok, BLOCK_M)
    return cols, col_ok, ok, at


@triton.jit
def _affine(cols, col_ok, mean_ptr, invstd_ptr, weight_ptr, bias_ptr):
    """mean, invstd, scale = weight·invstd and shift = bias − mean·scale of these channels: y = x·scale + shift."""
    mean = tl.load(mean_ptr + cols, mask=col_ok, other=0.0)
    invstd = tl.load(invstd_ptr + cols, mask=col_ok, other=0.0)
    scale = tl.load(weight_ptr + cols, mask=col_ok, other=0.0) * invstd
    return mean, invstd, scale, tl.load(bias_ptr + cols, mask=col_ok, other=0.0) - mean * scale


@triton.jit
def _through_relu(dy_ptr, x, y_ptr, at, ok, scale, shift, MASK_FROM_Y: tl.constexpr, RELU: tl.constexpr):
    """dz: the output's gradient where the ReLU let the value through (read from y, or recomputed from x)."""
    dz = tl.load(dy_ptr + at, mask=ok, other=0.0).to(tl.float32)
    if RELU:
        if MASK_FROM_Y:
            keep = tl.load(y_ptr + at, mask=ok, other=0.0).to(tl.float32) > 0.0
        else:
            keep = x * scale[None, :] + shift[None, :] > 0.0
        dz = tl.where(keep, dz, 0.0)
    return dz


@triton.jit
def triton_batch_norm_apply(x_ptr, residual_ptr, y_ptr, mean_ptr, invstd_ptr, weight_ptr, bias_ptr, rows, channels,
                            HAS_RESIDUAL: tl.constexpr, RELU: tl.constexpr, BLOCK_M: tl.constexpr,
                            BLOCK_C: tl.constexpr):
    """y = relu(x·scale + shift (+ residual)), scale = weight·invstd, shift = bias − mean·scale."""
    cols, col_ok, ok, at = _tile(rows, channels, BLOCK_M, BLOCK_C)
    _mean, _invstd, scale, shift = _affine(cols, col_ok, mean_ptr, invstd_ptr, weight_ptr, bias_ptr)
    y = tl.load(x_ptr + at, mask=ok, other=0.0).to(tl.float32) * scale[None, :] + shift[None, :]
    if HAS_RESIDUAL:
        y += tl.load(residual_ptr + at, mask=ok, other=0.0).to(tl.float32)
    if RELU:
        y = tl.maximum(y, 0.0)
    tl.store(y_ptr + at, y.to(y_ptr.dtype.element_ty), mask=ok)


@triton.jit
def triton_batch_norm_backward_reduce(dy_ptr, x_ptr, y_ptr, partial_ptr, mean_ptr, invstd_ptr, weight_ptr, bias_ptr,
                                      rows, channels, rows_per_program, MASK_FROM_Y: tl.constexpr,
                                      RELU: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_C: tl.constexpr):
    """Partial per-channel sums of dz and dz·x̂ over one slice of rows (dz: dy where the output was not clamped)."""
    cols, col_ok = program_channels(0, channels, BLOCK_C)
    mean, invstd, scale, shift = _affine(cols, col_ok, mean_ptr, invstd_ptr, weight_ptr, bias_ptr)
    total = tl.zeros([BLOCK_M, BLOCK_C], dtype=tl.float32)
    dot = tl.zeros([BLOCK_M, BLOCK_C], dtype=tl.float32)
    start = tl.program_id(1) * rows_per_program
    for offset in range(start, start + rows_per_program, BLOCK_M):
        ok, at = _rows_at(offset, rows, channels, cols, col_ok, BLOCK_M)
        x = tl.load(x_ptr + at, mask=ok, other=0.0).to(tl.float32)
        dz = _through_relu(dy_ptr, x, y_ptr, at, ok, scale, shift, MASK_FROM_Y, RELU)
        total += dz
        dot += dz * ((x - mean[None, :]) * invstd[None, :])
    out = partial_ptr + tl.program_id(1) * 2 * channels + cols
    tl.store(out, tl.sum(total, axis=0), mask=col_ok)
    tl.store(out + channels, tl.sum(dot, axis=0), mask=col_ok)


@triton.jit
def triton_batch_norm_backward_finalize(partial_ptr, dbias_ptr, dweight_ptr, channels, slices,
                                        BLOCK_S: tl.constexpr, BLOCK_C: tl.constexpr):
    """dbias = Σ dz, dweight = Σ dz·x̂ from the slices' partial sums, a tile of BLOCK_S slices at a time."""
    cols, col_ok = program_channels(0, channels, BLOCK_C)
    total = tl.zeros([BLOCK_S, BLOCK_C], dtype=tl.float32)
    dot = tl.zeros([BLOCK_S, BLOCK_C], dtype=tl.float32)
    for offset in range(0, slices, BLOCK_S):
        piece = offset + tl.arange(0, BLOCK_S)
        ok = (piece < slices)[:, None] & col_ok[None, :]
        at = partial_ptr + piece[:, None] * 2 * channels + cols[None, :]
        total += tl.load(at, mask=ok, other=0.0)
        dot += tl.load(at + channels, mask=ok, other=0.0)
    tl.store(dbias_ptr + cols, tl.sum(total, axis=0), mask=col_ok)
    tl.store(dweight_ptr + cols, tl.sum(dot, axis=0), mask=col_ok)


@triton.jit
def triton_batch_norm_backward_apply(dy_ptr, x_ptr, y_ptr, dx_ptr, dresidual_ptr, mean_ptr, invstd_ptr, weight_ptr,
                                     bias_ptr, dbias_ptr, dweight_ptr, rows, channels, MASK_FROM_Y: tl.constexpr,
                                     RELU: tl.constexpr, HAS_RESIDUAL: tl.constexpr, BLOCK_M: tl.constexpr,
                                     BLOCK_C: tl.constexpr):
    """dx = weight·invstd·(dz − Σdz/M − x̂·Σdz·x̂/M); the residual's gradient is dz itself."""
    cols, col_ok, ok, at = _tile(rows, channels, BLOCK_M, BLOCK_C)
    mean, invstd, scale, shift = _affine(cols, col_ok, mean_ptr, invstd_ptr, weight_ptr, bias_ptr)
    mean_dz = tl.load(dbias_ptr + cols, mask=col_ok, other=0.0) / rows
    mean_dz_xhat = tl.load(dweight_ptr + cols, mask=col_ok, other=0.0) / rows
    x = tl.load(x_ptr + at, mask=ok, other=0.0).to(tl.float32)
    dz = _through_relu(dy_ptr, x, y_ptr, at, ok, scale, shift, MASK_FROM_Y, RELU)
    xhat = (x - mean[None, :]) * invstd[None, :]
    dx = (dz - mean_dz[None, :] - xhat * mean_dz_xhat[None, :]) * scale[None, :]
    tl.store(dx_ptr + at, dx.to(dx_ptr.dtype.element_ty), mask=ok)
    if HAS_RESIDUAL:
        tl.store(dresidual_ptr + at, dz.to(dresidual_ptr.dtype.element_ty), mask=ok)


def _block_channels(channels: int) -> int:
    """Channels per tile: 64 (a 128-byte bf16 row segment), fewer for thin tensors, a power of two as Triton needs."""
    return min(64, triton.next_power_of_2(channels))


def slices(rows: int, channel_blocks: int, tile_rows: int = BLOCK_ROWS) -> tuple[int, int]:
    """(row slices, rows per slice) of a reduction: about PROGRAMS_WANTED programs, whole tiles per slice."""
    wanted = max(1, PROGRAMS_WANTED // channel_blocks)
    per_slice = max(1, math.ceil(rows / wanted / tile_rows)) * tile_rows
    return math.ceil(rows / per_slice), per_slice


def _final_grid(channels: int) -> tuple[int]:
    return (triton.cdiv(channels, FINAL_BLOCK_C),)


def as_rows(tensor: torch.Tensor) -> torch.Tensor:
    """The (N, C, H, W) tensor in channels-last memory, which _rows_channels reads as (N·H·W, C) row-major."""
    if tensor.dim() != 4:
        raise ValueError(f"batch norm kernels take (N, C, H, W) activations, got {tensor.dim()} dimensions")
    return tensor.contiguous(memory_format=torch.channels_last)


def _rows_channels(tensor: torch.Tensor) -> tuple[int, int]:
    n, c, h, w = tensor.shape
    return n * h * w, c


def check_rows(rows: int, shape: tuple[int, ...]) -> None:
    """As torch: training needs two values per channel for the unbiased variance."""
    if rows < 2:
        raise ValueError(f"Expected more than 1 value per channel when training, got input size {shape}")


def finalize_stats(partial: torch.Tensor, rows: int, rows_per_slice: int, eps: float,
                   pivot_rows: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(mean, 1/std, unbiased variance) per channel from the slices' moments (partial: slices × 2 × channels), their
    means about pivot_rows' first row (none: about 0)."""
    slice_count, _two, channels = partial.shape
    mean, invstd, var = (partial.new_empty(channels) for _ in range(3))
    triton_batch_norm_stats_finalize[_final_grid(channels)](partial, partial if pivot_rows is None else pivot_rows,
                                                            mean, invstd, var, channels, slice_count, rows,
                                                            rows_per_slice, eps, PIVOT_FROM_X=pivot_rows is not None,
                                                            BLOCK_S=FINAL_BLOCK_S, BLOCK_C=FINAL_BLOCK_C)
    return mean, invstd, var


@torch.library.custom_op("joulebench::batch_norm_stats", mutates_args=())
def batch_norm_stats(x: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(batch mean, batch 1/std, batch unbiased variance) per channel of training-mode batch norm; no gradient."""
    x = as_rows(x)
    rows, channels = _rows_channels(x)
    check_rows(rows, tuple(x.shape))
    block_c = _block_channels(channels)
    channel_blocks = triton.cdiv(channels, block_c)
    slice_count, per_slice = slices(rows, channel_blocks)
    partial = x.new_empty((slice_count, 2, channels), dtype=torch.float32)
    triton_batch_norm_stats[(channel_blocks, slice_count)](x, partial, rows, channels, per_slice, BLOCK_M=BLOCK_ROWS,
                                                          BLOCK_C=block_c)
    return finalize_stats(partial, rows, per_slice, eps, pivot_rows=x)


@batch_norm_stats.register_fake
def _(x: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return channel_stats_like(x, x.shape[1])


def channel_stats_like(x: torch.Tensor, channels: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Three empty fp32 per-channel vectors on x's device (the fake ops' statistics)."""
    stat = x.new_empty(channels, dtype=torch.float32)
    return stat, torch.empty_like(stat), torch.empty_like(stat)


@torch.library.custom_op("joulebench::bn_act_apply", mutates_args=())
def bn_act_apply(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, residual: torch.Tensor | None,
                 mean: torch.Tensor, invstd: torch.Tensor, relu: bool) -> torch.Tensor:
    """relu(batch norm of x with these batch statistics (+ residual)); its gradient is the whole batch norm's."""
    x = as_rows(x)
    rows, channels = _rows_channels(x)
    y = torch.empty_like(x, memory_format=torch.channels_last)
    block_c = _block_channels(channels)
    res = as_rows(residual) if residual is not None else x
    grid = (triton.cdiv(rows, BLOCK_ROWS), triton.cdiv(channels, block_c))
    triton_batch_norm_apply[grid](x, res, y, mean, invstd, weight, bias, rows, channels,
                                  HAS_RESIDUAL=residual is not None, RELU=relu, BLOCK_M=BLOCK_ROWS, BLOCK_C=block_c)
    return y


@bn_act_apply.register_fake
def _(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, residual: torch.Tensor | None, mean: torch.Tensor,
      invstd: torch.Tensor, relu: bool) -> torch.Tensor:
    return torch.empty_like(x, memory_format=torch.channels_last)


@torch.library.custom_op("joulebench::bn_act_backward", mutates_args=())
def bn_act_backward(dy: torch.Tensor, x: torch.Tensor, y: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                    mean: torch.Tensor, invstd: torch.Tensor, has_residual: bool, relu: bool
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dx, dweight, dbias, dresidual) of batch norm (+ residual) (+ ReLU) in training: dx includes the batch
    statistics' dependence on x; dresidual is dz (an empty tensor without a residual)."""
    dy, x, y = as_rows(dy), as_rows(x), as_rows(y)
    rows, channels = _rows_channels(x)
    block_c = _block_channels(channels)
    channel_blocks = triton.cdiv(channels, block_c)
    slice_count, per_slice = slices(rows, channel_blocks)
    partial = x.new_empty((slice_count, 2, channels), dtype=torch.float32)
    flags: dict[str, Any] = {"MASK_FROM_Y": has_residual, "RELU": relu, "BLOCK_C": block_c}
    triton_batch_norm_backward_reduce[(channel_blocks, slice_count)](dy, x, y, partial, mean, invstd, weight, bias,
                                                                    rows, channels, per_slice, BLOCK_M=BLOCK_ROWS,
                                                                    **flags)
    dweight, dbias = torch.empty_like(weight), torch.empty_like(bias)
    triton_batch_norm_backward_finalize[_final_grid(channels)](partial, dbias, dweight, channels, slice_count,
                                                               BLOCK_S=FINAL_BLOCK_S, BLOCK_C=FINAL_BLOCK_C)
    dx = torch.empty_like(x, memory_format=torch.channels_last)
    dresidual = torch.empty_like(dy, memory_format=torch.channels_last) if has_residual else dy.new_empty(0)
    grid = (triton.cdiv(rows, BLOCK_ROWS), triton.cdiv(channels, block_c))
    triton_batch_norm_backward_apply[grid](dy, x, y, dx, dresidual if has_residual else dx, mean, invstd, weight, bias,
                                           dbias, dweight, rows, channels, HAS_RESIDUAL=has_residual,
                                           BLOCK_M=BLOCK_ROWS, **flags)
    return dx, dweight, dbias, dresidual


@bn_act_backward.register_fake
def _(dy: torch.Tensor, x: torch.Tensor, y: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
      mean: torch.Tensor, invstd: torch.Tensor, has_residual: bool, relu: bool
      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    dresidual = torch.empty_like(dy, memory_format=torch.channels_last) if has_residual else dy.new_empty(0)
    return (torch.empty_like(x, memory_format=torch.channels_last), torch.empty_like(weight), torch.empty_like(bias),
            dresidual)


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    x, weight, bias, residual, mean, invstd, relu = inputs
    ctx.save_for_backward(x, output, weight, bias, mean, invstd)  # the output is kept anyway: the next conv's input
    ctx.has_residual, ctx.relu = residual is not None, relu


def _backward(ctx: Any, dy: torch.Tensor) -> tuple[Any, ...]:
    """Gradients of x, weight, bias and the residual; none for the batch statistics (dx already holds their part)."""
    x, y, weight, bias, mean, invstd = ctx.saved_tensors
    dx, dweight, dbias, dresidual = bn_act_backward(dy, x, y, weight, bias, mean, invstd, ctx.has_residual, ctx.relu)
    return dx, dweight, dbias, dresidual if ctx.has_residual else None, None, None, None


bn_act_apply.register_autograd(_backward, setup_context=_setup_context)
