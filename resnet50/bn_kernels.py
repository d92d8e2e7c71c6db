"""Training-mode batch norm + (residual add) + ReLU in Triton kernels of our own, over channels-last activations.

Why: in the compiled README run, inductor's batch-norm fusions take 47 % of the kernel time (docs/perf-notes.md).
These kernels read each activation as few times as the math allows, with fp32 accumulation of bf16 data:
forward, one reduction pass (per-channel sums, shifted by the channel's first value against cancellation) and one
apply pass (normalise, scale and shift, add the residual, ReLU); backward, one reduction pass (sum dz and sum dz·x̂,
dz = dy through the ReLU mask) and one elementwise pass writing dx (and the residual's gradient, which is dz). The
ReLU mask is recomputed from x where there is no residual (no read of the output); with a residual it is read from
the output. A channels-last (N, C, H, W) tensor is a row-major (N·H·W, C) matrix: programs tile rows × channels.

Registered as torch custom ops (`joulebench::bn_act_forward` / `bn_act_backward`, autograd attached) so that
torch.compile keeps them in its graph as opaque calls (no graph break; CUDA graphs capture them). Imported only
for `--bn-kernels triton`; tested on the CPU in Triton's interpreter (TRITON_INTERPRET=1).
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
def triton_batch_norm_stats(x_ptr, partial_ptr, rows, channels, rows_per_program,
                            BLOCK_M: tl.constexpr, BLOCK_C: tl.constexpr):
    """Partial per-channel sums of (x − pivot) and (x − pivot)² over one slice of rows; pivot = row 0's value."""
    cols = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    col_ok = cols < channels
    pivot = tl.load(x_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    total = tl.zeros([BLOCK_M, BLOCK_C], dtype=tl.float32)
    squares = tl.zeros([BLOCK_M, BLOCK_C], dtype=tl.float32)
    start = tl.program_id(1) * rows_per_program
    for offset in range(start, start + rows_per_program, BLOCK_M):
        row = offset + tl.arange(0, BLOCK_M).to(tl.int64)
        ok = (row < rows)[:, None] & col_ok[None, :]
        x = tl.load(x_ptr + row[:, None] * channels + cols[None, :], mask=ok, other=0.0).to(tl.float32)
        shifted = tl.where(ok, x - pivot[None, :], 0.0)
        total += shifted
        squares += shifted * shifted
    out = partial_ptr + tl.program_id(1) * 2 * channels + cols
    tl.store(out, tl.sum(total, axis=0), mask=col_ok)
    tl.store(out + channels, tl.sum(squares, axis=0), mask=col_ok)


@triton.jit
def _sum_slices(partial_ptr, channels, slices, BLOCK_S: tl.constexpr, BLOCK_C: tl.constexpr):
    """Per-channel totals of the two partial sums of every row slice (partial: slices × 2 × channels, fp32), a tile of
    BLOCK_S slices at a time: a loop over one slice at a time would wait on a thousand loads in a row."""
    cols = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    col_ok = cols < channels
    first = tl.zeros([BLOCK_S, BLOCK_C], dtype=tl.float32)
    second = tl.zeros([BLOCK_S, BLOCK_C], dtype=tl.float32)
    for offset in range(0, slices, BLOCK_S):
        piece = offset + tl.arange(0, BLOCK_S)
        ok = (piece < slices)[:, None] & col_ok[None, :]
        at = partial_ptr + piece[:, None] * 2 * channels + cols[None, :]
        first += tl.load(at, mask=ok, other=0.0)
        second += tl.load(at + channels, mask=ok, other=0.0)
    return cols, col_ok, tl.sum(first, axis=0), tl.sum(second, axis=0)


@triton.jit
def triton_batch_norm_stats_finalize(partial_ptr, x_ptr, mean_ptr, invstd_ptr, var_ptr, channels, slices, rows,
                                     eps, BLOCK_S: tl.constexpr, BLOCK_C: tl.constexpr):
    """Mean, 1/sqrt(biased var + eps) and the unbiased variance (for running_var) from the slices' partial sums."""
    cols, col_ok, total, squares = _sum_slices(partial_ptr, channels, slices, BLOCK_S, BLOCK_C)
    shift = total / rows
    var = tl.maximum(squares / rows - shift * shift, 0.0)
    pivot = tl.load(x_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    tl.store(mean_ptr + cols, pivot + shift, mask=col_ok)
    tl.store(invstd_ptr + cols, 1.0 / tl.sqrt(var + eps), mask=col_ok)
    tl.store(var_ptr + cols, var * rows / (rows - 1), mask=col_ok)


@triton.jit
def triton_batch_norm_apply(x_ptr, residual_ptr, y_ptr, mean_ptr, invstd_ptr, weight_ptr, bias_ptr, rows, channels,
                            HAS_RESIDUAL: tl.constexpr, RELU: tl.constexpr, BLOCK_M: tl.constexpr,
                            BLOCK_C: tl.constexpr):
    """y = relu(x·scale + shift (+ residual)), scale = weight·invstd, shift = bias − mean·scale."""
    row = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    col_ok = cols < channels
    ok = (row < rows)[:, None] & col_ok[None, :]
    at = row[:, None] * channels + cols[None, :]
    scale = tl.load(weight_ptr + cols, mask=col_ok, other=0.0) * tl.load(invstd_ptr + cols, mask=col_ok, other=0.0)
    shift = tl.load(bias_ptr + cols, mask=col_ok, other=0.0) - tl.load(mean_ptr + cols, mask=col_ok, other=0.0) * scale
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
    cols = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    col_ok = cols < channels
    mean = tl.load(mean_ptr + cols, mask=col_ok, other=0.0)
    invstd = tl.load(invstd_ptr + cols, mask=col_ok, other=0.0)
    scale = tl.load(weight_ptr + cols, mask=col_ok, other=0.0) * invstd
    shift = tl.load(bias_ptr + cols, mask=col_ok, other=0.0) - mean * scale
    total = tl.zeros([BLOCK_M, BLOCK_C], dtype=tl.float32)
    dot = tl.zeros([BLOCK_M, BLOCK_C], dtype=tl.float32)
    start = tl.program_id(1) * rows_per_program
    for offset in range(start, start + rows_per_program, BLOCK_M):
        row = offset + tl.arange(0, BLOCK_M).to(tl.int64)
        ok = (row < rows)[:, None] & col_ok[None, :]
        at = row[:, None] * channels + cols[None, :]
        x = tl.load(x_ptr + at, mask=ok, other=0.0).to(tl.float32)
        dz = tl.load(dy_ptr + at, mask=ok, other=0.0).to(tl.float32)
        if RELU:
            if MASK_FROM_Y:
                keep = tl.load(y_ptr + at, mask=ok, other=0.0).to(tl.float32) > 0.0
            else:
                keep = x * scale[None, :] + shift[None, :] > 0.0
            dz = tl.where(keep, dz, 0.0)
        total += dz
        dot += dz * ((x - mean[None, :]) * invstd[None, :])
    out = partial_ptr + tl.program_id(1) * 2 * channels + cols
    tl.store(out, tl.sum(total, axis=0), mask=col_ok)
    tl.store(out + channels, tl.sum(dot, axis=0), mask=col_ok)


@triton.jit
def triton_batch_norm_backward_finalize(partial_ptr, dbias_ptr, dweight_ptr, channels, slices,
                                        BLOCK_S: tl.constexpr, BLOCK_C: tl.constexpr):
    """dbias = Σ dz, dweight = Σ dz·x̂ from the slices' partial sums."""
    cols, col_ok, total, dot = _sum_slices(partial_ptr, channels, slices, BLOCK_S, BLOCK_C)
    tl.store(dbias_ptr + cols, total, mask=col_ok)
    tl.store(dweight_ptr + cols, dot, mask=col_ok)


@triton.jit
def triton_batch_norm_backward_apply(dy_ptr, x_ptr, y_ptr, dx_ptr, dresidual_ptr, mean_ptr, invstd_ptr, weight_ptr,
                                     bias_ptr, dbias_ptr, dweight_ptr, rows, channels, MASK_FROM_Y: tl.constexpr,
                                     RELU: tl.constexpr, HAS_RESIDUAL: tl.constexpr, BLOCK_M: tl.constexpr,
                                     BLOCK_C: tl.constexpr):
    """dx = weight·invstd·(dz − Σdz/M − x̂·Σdz·x̂/M); the residual's gradient is dz itself."""
    row = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    col_ok = cols < channels
    ok = (row < rows)[:, None] & col_ok[None, :]
    at = row[:, None] * channels + cols[None, :]
    mean = tl.load(mean_ptr + cols, mask=col_ok, other=0.0)
    invstd = tl.load(invstd_ptr + cols, mask=col_ok, other=0.0)
    weight = tl.load(weight_ptr + cols, mask=col_ok, other=0.0)
    scale = weight * invstd
    shift = tl.load(bias_ptr + cols, mask=col_ok, other=0.0) - mean * scale
    mean_dz = tl.load(dbias_ptr + cols, mask=col_ok, other=0.0) / rows
    mean_dz_xhat = tl.load(dweight_ptr + cols, mask=col_ok, other=0.0) / rows
    x = tl.load(x_ptr + at, mask=ok, other=0.0).to(tl.float32)
    dz = tl.load(dy_ptr + at, mask=ok, other=0.0).to(tl.float32)
    if RELU:
        if MASK_FROM_Y:
            keep = tl.load(y_ptr + at, mask=ok, other=0.0).to(tl.float32) > 0.0
        else:
            keep = x * scale[None, :] + shift[None, :] > 0.0
        dz = tl.where(keep, dz, 0.0)
    xhat = (x - mean[None, :]) * invstd[None, :]
    dx = (dz - mean_dz[None, :] - xhat * mean_dz_xhat[None, :]) * scale[None, :]
    tl.store(dx_ptr + at, dx.to(dx_ptr.dtype.element_ty), mask=ok)
    if HAS_RESIDUAL:
        tl.store(dresidual_ptr + at, dz.to(dresidual_ptr.dtype.element_ty), mask=ok)


def _block_channels(channels: int) -> int:
    """Channels per tile: 64 (a 128-byte bf16 row segment), fewer for thin tensors, a power of two as Triton needs."""
    return min(64, triton.next_power_of_2(channels))


def _slices(rows: int, channel_blocks: int) -> tuple[int, int]:
    """(row slices, rows per slice) of a reduction: about PROGRAMS_WANTED programs, whole tiles per slice."""
    wanted = max(1, PROGRAMS_WANTED // channel_blocks)
    per_slice = max(1, math.ceil(rows / wanted / BLOCK_ROWS)) * BLOCK_ROWS
    return math.ceil(rows / per_slice), per_slice


def _final_grid(channels: int) -> tuple[int]:
    return (triton.cdiv(channels, FINAL_BLOCK_C),)


def _as_rows(tensor: torch.Tensor) -> torch.Tensor:
    """The (N, C, H, W) tensor in channels-last memory, which _rows_channels reads as (N·H·W, C) row-major."""
    if tensor.dim() != 4:
        raise ValueError(f"batch norm kernels take (N, C, H, W) activations, got {tensor.dim()} dimensions")
    return tensor.contiguous(memory_format=torch.channels_last)


def _rows_channels(tensor: torch.Tensor) -> tuple[int, int]:
    n, c, h, w = tensor.shape
    return n * h * w, c


def _stats(x: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    rows, channels = _rows_channels(x)
    if rows < 2:  # as torch: the unbiased variance needs two values
        raise ValueError(f"Expected more than 1 value per channel when training, got input size {tuple(x.shape)}")
    block_c = _block_channels(channels)
    channel_blocks = triton.cdiv(channels, block_c)
    slices, per_slice = _slices(rows, channel_blocks)
    partial = x.new_empty((slices, 2, channels), dtype=torch.float32)
    triton_batch_norm_stats[(channel_blocks, slices)](x, partial, rows, channels, per_slice, BLOCK_M=BLOCK_ROWS,
                                                     BLOCK_C=block_c)
    mean, invstd, var = (x.new_empty(channels, dtype=torch.float32) for _ in range(3))
    triton_batch_norm_stats_finalize[_final_grid(channels)](partial, x, mean, invstd, var, channels, slices, rows, eps,
                                                            BLOCK_S=FINAL_BLOCK_S, BLOCK_C=FINAL_BLOCK_C)
    return mean, invstd, var


@torch.library.custom_op("joulebench::bn_act_forward", mutates_args=())
def bn_act_forward(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, residual: torch.Tensor | None,
                   eps: float, relu: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(y, batch mean, batch 1/std, batch unbiased variance) of training-mode batch norm (+ residual) (+ ReLU)."""
    x = _as_rows(x)
    rows, channels = _rows_channels(x)
    mean, invstd, var = _stats(x, eps)
    y = torch.empty_like(x, memory_format=torch.channels_last)
    block_c = _block_channels(channels)
    res = _as_rows(residual) if residual is not None else x
    grid = (triton.cdiv(rows, BLOCK_ROWS), triton.cdiv(channels, block_c))
    triton_batch_norm_apply[grid](x, res, y, mean, invstd, weight, bias, rows, channels,
                                  HAS_RESIDUAL=residual is not None, RELU=relu, BLOCK_M=BLOCK_ROWS, BLOCK_C=block_c)
    return y, mean, invstd, var


@bn_act_forward.register_fake
def _(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, residual: torch.Tensor | None, eps: float,
      relu: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    stat = x.new_empty(x.shape[1], dtype=torch.float32)
    return torch.empty_like(x, memory_format=torch.channels_last), stat, torch.empty_like(stat), torch.empty_like(stat)


@torch.library.custom_op("joulebench::bn_act_backward", mutates_args=())
def bn_act_backward(dy: torch.Tensor, x: torch.Tensor, y: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                    mean: torch.Tensor, invstd: torch.Tensor, has_residual: bool, relu: bool
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dx, dweight, dbias, dresidual) of bn_act_forward; dresidual is dz (an empty tensor without a residual)."""
    dy, x, y = _as_rows(dy), _as_rows(x), _as_rows(y)
    rows, channels = _rows_channels(x)
    block_c = _block_channels(channels)
    channel_blocks = triton.cdiv(channels, block_c)
    slices, per_slice = _slices(rows, channel_blocks)
    partial = x.new_empty((slices, 2, channels), dtype=torch.float32)
    flags: dict[str, Any] = {"MASK_FROM_Y": has_residual, "RELU": relu, "BLOCK_C": block_c}
    triton_batch_norm_backward_reduce[(channel_blocks, slices)](dy, x, y, partial, mean, invstd, weight, bias, rows,
                                                               channels, per_slice, BLOCK_M=BLOCK_ROWS, **flags)
    dweight, dbias = torch.empty_like(weight), torch.empty_like(bias)
    triton_batch_norm_backward_finalize[_final_grid(channels)](partial, dbias, dweight, channels, slices,
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


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: tuple[torch.Tensor, ...]) -> None:
    x, weight, bias, residual, _eps, relu = inputs
    y, mean, invstd, _var = output
    ctx.save_for_backward(x, y, weight, bias, mean, invstd)  # y is kept anyway: the next convolution's input
    ctx.has_residual, ctx.relu = residual is not None, relu


def _backward(ctx: Any, dy: torch.Tensor, *_stat_grads: Any) -> tuple[Any, ...]:
    """Gradients of x, weight, bias and the residual; the batch statistics feed only the running stats (no grad)."""
    x, y, weight, bias, mean, invstd = ctx.saved_tensors
    dx, dweight, dbias, dresidual = bn_act_backward(dy, x, y, weight, bias, mean, invstd, ctx.has_residual, ctx.relu)
    return dx, dweight, dbias, dresidual if ctx.has_residual else None, None, None


bn_act_forward.register_autograd(_backward, setup_context=_setup_context)
