"""A Llama decode step at batch 1 on one device in fused Triton kernels (`--decode-tuning fused`).

Why: at batch 1 a step reads every weight once (llama-1b 2.5 GB: 0.74 ms at an H100's 3.35 TB/s), and the compiled
path spends about 12 kernels per layer doing it (norms, GEMVs on cuBLAS, RoPE, the cache write, SiLU·up, residual
adds, attention): inside a CUDA graph each launch still leaves a gap of a few microseconds, which at 1B costs about
as much as the reads (docs/perf-notes.md). Here a layer is six kernels, and each GEMV streams its matrix with the
element-wise work folded into its prologue or epilogue:

1. RMSNorm (attention) + the Q/K/V GEMV + RoPE + the K/V write into the cache at the row's length;
2. + 3. split-K decode attention (llm_inference/decode_attention.py, unchanged);
4. the output projection + the residual add;
5. RMSNorm (MLP) + the gate/up GEMV + SiLU(gate)·up;
6. the down projection + the residual add;

and the step ends with the final RMSNorm + LM-head GEMV. With PDL set, on sm_90 and later every kernel of the step
launches as a programmatic dependent of the one before: it starts while its predecessor's last programs run, loads
its first weight tile and then waits for the predecessor's writes.

Every program reads the whole input vector anyway, so it sums the squares of the norm's input on the way and scales
its sums by the inverse RMS at the end (a common factor of every output row): no separate norm kernel, no extra
pass. A GEMV gives each program a few output rows over the whole input (no split-K: nothing to combine), sized so
that every SM gets PROGRAMS_PER_SM of them, in tiles of TILE weights per loop step. Sums and the element-wise tail
run in fp32, rounded once to the model's dtype (the compiled path rounds after each op: bf16 logits differ by
rounding, checked by benchmarks/inference_engine_h100.py).

Covered: the Llama family without biases, one device, one row (the static engine's batch 1, the continuous engine's
one-row bucket); anything else runs the compiled path (`unsupported` says why). The kernels need Triton and a CUDA
GPU at run time (the driver refuses the variant elsewhere); tests run them in Triton's interpreter on the CPU.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F

from llm_inference.compact_model import CompactModel, Layer
from llm_inference.decode_attention import (
    GRID_DEPENDENCY_CONTROL,
    heads_supported,
    launch_options,
    split_decode_attention,
)
from llm_inference.kv_cache import KVCache

# GEMV programs aimed for per SM: enough loads in flight to stream a matrix at full bandwidth. 4, not 2: measured on
# an H100 (docs/perf-notes.md, issue 59), the short-input GEMVs (the output and down projections) stream 7-29 % faster
# with twice the programs, the others within 3 %.
PROGRAMS_PER_SM = 4
MAX_BLOCK_ROWS = 16  # output rows per program at most (the LM head's 128k rows: about 61 programs per SM)
MIN_BLOCK_ROWS = 2
# Weight elements per loop step and accumulator of a program (rows × input columns; 8 KB in bf16). ptxas for sm_90
# (Triton's own, run here, 16-byte loads as the launcher specialises aligned shapes): 4,096 keeps two accumulators
# (gate/up, the two RoPE halves) within 128 registers of 4 warps (96–128; the test checks), so four programs fit an
# SM; 8,192 needs 250.
TILE = 4096
# Programmatic dependent launch (sm_90+): each kernel of the step may start while the previous one finishes, loads its
# first weight tile (weights never change within a step) and only then waits for the previous kernel's writes, so a
# kernel's launch and its first loads overlap the previous one's last programs instead of following them. Off until
# measured on an H100 (benchmarks/fused_gemv_h100.py times whole steps both ways; docs/perf-notes.md, issue 59):
# `auto` runs the fused step, so an unmeasured launch mode must not become every batch-1 run's.
PDL = False

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only torch wheels come without Triton: `unsupported` says so, the driver refuses
    triton = None


def unsupported(model: CompactModel, device: torch.device) -> str | None:
    """Why the fused step cannot run this model here (None: it can, at batch 1). Triton and the device are the
    driver's refusals (llm_inference.validation); the model's shape sends other batches' path its way instead."""
    if triton is None:
        return "Triton is not installed"
    if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":  # the interpreter: the tests, CPU
        return f"the fused kernels need a CUDA GPU (device {device.type})"
    if model.family != "llama":
        return f"the fused kernels compute Llama layers (RMSNorm, RoPE, SiLU), not {model.family}"
    if model.tp is not None:
        return "the model is split over ranks (tensor parallelism: each projection is all-reduced)"
    if any(a.bias is not None for layer in model.layers for a in (layer.qkv, layer.out, layer.up, layer.down)):
        return "the projections have biases"
    if not heads_supported(model.head_dim, model.embed.dtype):
        return f"head size {model.head_dim} in {model.embed.dtype} is outside the split attention kernels"
    return None


def block_rows(rows: int, sms: int) -> int:
    """Output rows per GEMV program: a power of two in [MIN_BLOCK_ROWS, MAX_BLOCK_ROWS] that leaves at least
    PROGRAMS_PER_SM programs per SM where the matrix has the rows for it."""
    per_program = max(1, rows // (PROGRAMS_PER_SM * sms))
    return max(MIN_BLOCK_ROWS, min(MAX_BLOCK_ROWS, 1 << (per_program.bit_length() - 1)))


def uses_pdl(device: torch.device) -> bool:
    """Whether the step's kernels launch as programmatic dependents here: PDL set, a Triton with grid dependency
    control and a CUDA GPU of sm_90 or later (Triton's interpreter, the CPU tests' path, has none)."""
    return (PDL and GRID_DEPENDENCY_CONTROL and device.type == "cuda"
            and torch.cuda.get_device_capability(device)[0] >= 9)


def gemv(x: torch.Tensor, weight: torch.Tensor, sms: int, norm: torch.Tensor | None = None, eps: float = 0.0,
         residual: torch.Tensor | None = None, glu: bool = False, pdl: bool = False) -> torch.Tensor:
    """weight · u for one input vector x (hidden,), u = x, or RMSNorm(x)·norm with `norm`; `glu`: the weight's rows
    are [gate; up], the result silu(gate·u)·(up·u); `residual`: added to the result. Returns the result's rows in
    x's dtype. `pdl`: launched as a programmatic dependent (uses_pdl)."""
    rows = weight.shape[0] // 2 if glu else weight.shape[0]
    out = torch.empty(rows, dtype=x.dtype, device=x.device)
    block = block_rows(rows, sms)
    _gemv_kernel[(triton.cdiv(rows, block),)](
        x, x if norm is None else norm, weight, x if residual is None else residual, out, rows, weight.shape[1],
        weight.stride(0), eps, NORM=norm is not None, GLU=glu, RESIDUAL=residual is not None, BLOCK_ROWS=block,
        BLOCK_K=TILE // block, PDL=pdl, **launch_options(pdl))
    return out


def qkv_block_rows(heads: int, half: int, sms: int) -> int:
    """Rotary-half rows per Q/K/V program: as block_rows, but never under 4, since its two accumulators (the RoPE
    halves) over a 2,048-wide tile spill in sm_90's ptxas (llama-1b's 48 heads at 4 programs per SM)."""
    return min(half, max(4, block_rows(heads * half, sms)))


def qkv_into_cache(model: CompactModel, layer: Layer, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                   cache: KVCache, index: int, sms: int, pdl: bool = False) -> torch.Tensor:
    """Layer `index`'s query (heads · head dim,), RoPE applied; its key (RoPE applied) and value written into
    cache row 0 at the row's length, as KVCache.write_token does. rope: the (cos, signed sin) tables per position
    (CompactModel.rope_tables)."""
    half = model.head_dim // 2
    query = torch.empty(model.heads * model.head_dim, dtype=x.dtype, device=x.device)
    keys, values = cache.keys(index)[0], cache.values(index)[0]  # (KV heads, positions, head dim)
    heads = model.heads + 2 * model.kv_heads
    block = qkv_block_rows(heads, half, sms)
    cos, sin = rope
    _qkv_kernel[(heads, triton.cdiv(half, block))](
        x, layer.norm1.weight, layer.qkv.weight, cos, sin, cache.length, cache.length if cache.start is None
        else cache.start, query, keys, values, x.shape[0], layer.qkv.weight.stride(0), cos.stride(0),
        *keys.stride()[:2], *values.stride()[:2], model.norm_eps,
        HEADS=model.heads, KV_HEADS=model.kv_heads, HEAD_DIM=model.head_dim, FROM_ZERO=cache.start is None,
        BLOCK_ROWS=block, BLOCK_K=TILE // block, PDL=pdl, **launch_options(pdl))
    return query


def decode_pass(model: CompactModel, cache: KVCache, tokens: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                length: int, sms: int) -> torch.Tensor:
    """Logits (1, vocabulary) after one token for a one-row cache, attending to its first `length` positions: what
    CompactForward._decode_pass computes, in the kernels of the module docstring (each layer's K/V written at
    the row's length; the cache's length does not move)."""
    x = F.embedding(tokens, model.embed)[0]
    pdl = uses_pdl(x.device)
    for index, layer in enumerate(model.layers):
        query = qkv_into_cache(model, layer, x, rope, cache, index, sms, pdl)
        attention = split_decode_attention(query.view(1, model.kv_heads, model.groups, model.head_dim),
                                           cache.keys(index), cache.values(index), cache.start, cache.length,
                                           length, sms, pdl)
        x = gemv(attention.view(-1), layer.out.weight, sms, residual=x, pdl=pdl)
        hidden = gemv(x, layer.up.weight, sms, norm=layer.norm2.weight, eps=model.norm_eps, glu=True, pdl=pdl)
        x = gemv(hidden, layer.down.weight, sms, residual=x, pdl=pdl)
    return gemv(x, model.lm_head, sms, norm=model.final_norm.weight, eps=model.norm_eps, pdl=pdl)[None]


if triton is not None:
    from llm_inference.decode_attention import wait_for_predecessor

    @triton.jit
    def _input(x, norm, squares, k, k_in, NORM: tl.constexpr):
        """One loop step's u (x in fp32, times the norm's weights under NORM) and the running sum of x²."""
        u = tl.load(x + k, mask=k_in, other=0.0).to(tl.float32)
        if NORM:
            squares += u * u
            u = u * tl.load(norm + k, mask=k_in, other=0.0).to(tl.float32)
        return u, squares

    @triton.jit
    def _weight_tile(rows_at, row_in, k, k_in):
        """One loop step's weights of the rows at `rows_at`."""
        return tl.load(rows_at + k[None, :], mask=row_in[:, None] & k_in[None, :], other=0.0)

    @triton.jit
    def _row_sums(x, norm, first, second, row_in, size, NORM: tl.constexpr, SECOND: tl.constexpr,
                  BLOCK_ROWS: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr):
        """The loop both kernels stream: each row at `first` (and, under SECOND, at `second`) times u summed over the
        input, u = x in fp32, times the norm's weights under NORM; and the sum of x² (the inverse RMS is a common
        factor of every output row: the caller scales the sums by it after the loop). Products are summed per lane
        and reduced once at the end. Under PDL the first step's weight tiles are loaded before the wait for the
        previous kernel (x is its output). The loop loads u, then one tile at a time into its sum: that order keeps
        the kernels within 128 registers, four programs an SM (ptxas for sm_90, checked by the tests)."""
        squares = tl.zeros([BLOCK_K], tl.float32)
        acc = tl.zeros([BLOCK_ROWS, BLOCK_K], tl.float32)
        acc_second = tl.zeros([BLOCK_ROWS, BLOCK_K], tl.float32)
        begin = 0
        if PDL:
            k = tl.arange(0, BLOCK_K)
            k_in = k < size
            weights = _weight_tile(first, row_in, k, k_in)
            weights_second = weights
            if SECOND:
                weights_second = _weight_tile(second, row_in, k, k_in)
            wait_for_predecessor()
            u, squares = _input(x, norm, squares, k, k_in, NORM)
            acc += weights.to(tl.float32) * u[None, :]
            if SECOND:
                acc_second += weights_second.to(tl.float32) * u[None, :]
            begin = BLOCK_K
        for start in range(begin, size, BLOCK_K):
            k = start + tl.arange(0, BLOCK_K)
            k_in = k < size
            u, squares = _input(x, norm, squares, k, k_in, NORM)
            acc += _weight_tile(first, row_in, k, k_in).to(tl.float32) * u[None, :]
            if SECOND:
                acc_second += _weight_tile(second, row_in, k, k_in).to(tl.float32) * u[None, :]
        return tl.sum(acc, 1), tl.sum(acc_second, 1), tl.sum(squares, 0)

    @triton.jit
    def _gemv_kernel(x, norm, weight, residual, out, rows, size, row_stride, eps,
                     NORM: tl.constexpr, GLU: tl.constexpr, RESIDUAL: tl.constexpr,
                     BLOCK_ROWS: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr):
        """BLOCK_ROWS output rows of `gemv` (its docstring)."""
        row = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
        row_in = row < rows
        first = weight + row.to(tl.int64)[:, None] * row_stride  # the LM head's rows × stride pass 2^31 at 70B
        second = first + rows * row_stride  # GLU: the up rows after the gate rows
        total, up, squares = _row_sums(x, norm, first, second, row_in, size, NORM, GLU, BLOCK_ROWS, BLOCK_K, PDL)
        if NORM:
            scale = tl.rsqrt(squares / size + eps)
            total, up = total * scale, up * scale
        if GLU:
            total = total / (1.0 + tl.exp(-total)) * up
        if RESIDUAL:
            total += tl.load(residual + row, mask=row_in, other=0.0).to(tl.float32)
        tl.store(out + row, total.to(out.dtype.element_ty), mask=row_in)

    @triton.jit
    def _qkv_kernel(x, norm, weight, cos, sin, lengths, starts, query, keys, values, size, row_stride, rope_stride,
                    k_head, k_position, v_head, v_position, eps,
                    HEADS: tl.constexpr, KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, FROM_ZERO: tl.constexpr,
                    BLOCK_ROWS: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr):
        """BLOCK_ROWS lanes j of one Q, K or V head (program axis 0: Q heads, then K, then V): its rows j and
        j + HEAD_DIM/2 together, so RoPE (x₁·cos − x₂·sin, x₂·cos + x₁·sin) needs no other program's rows."""
        head = tl.program_id(0)
        lane = tl.program_id(1) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
        lane_in = lane < HEAD_DIM // 2
        first = weight + (head * HEAD_DIM + lane).to(tl.int64)[:, None] * row_stride
        second = first + (HEAD_DIM // 2) * row_stride
        low, high, squares = _row_sums(x, norm, first, second, lane_in, size, True, True, BLOCK_ROWS, BLOCK_K,
                                       PDL)
        scale = tl.rsqrt(squares / size + eps)  # RMSNorm's inverse RMS
        low, high = low * scale, high * scale
        length = tl.load(lengths)
        position = length if FROM_ZERO else length - tl.load(starts)
        # RoPE on Q and K heads: the tables hold (cos, cos) and (−sin, sin) per position (CompactModel.rope_tables)
        rotated = head < HEADS + KV_HEADS
        table = position * rope_stride + lane
        cos_low = tl.where(rotated, tl.load(cos + table, mask=lane_in, other=1.0).to(tl.float32), 1.0)
        cos_high = tl.where(rotated, tl.load(cos + table + HEAD_DIM // 2, mask=lane_in, other=1.0).to(tl.float32),
                            1.0)
        sin_low = tl.where(rotated, tl.load(sin + table, mask=lane_in, other=0.0).to(tl.float32), 0.0)
        sin_high = tl.where(rotated, tl.load(sin + table + HEAD_DIM // 2, mask=lane_in, other=0.0).to(tl.float32),
                            0.0)
        low, high = low * cos_low + high * sin_low, high * cos_high + low * sin_high
        dtype = query.dtype.element_ty
        is_query = head < HEADS
        query_at = query + tl.minimum(head, HEADS - 1) * HEAD_DIM + lane
        tl.store(query_at, low.to(dtype), mask=lane_in & is_query)
        tl.store(query_at + HEAD_DIM // 2, high.to(dtype), mask=lane_in & is_query)
        is_key = rotated & (head >= HEADS)
        key_at = (keys + tl.minimum(tl.maximum(head - HEADS, 0), KV_HEADS - 1) * k_head + length * k_position
                  + lane)
        tl.store(key_at, low.to(dtype), mask=lane_in & is_key)
        tl.store(key_at + HEAD_DIM // 2, high.to(dtype), mask=lane_in & is_key)
        is_value = head >= HEADS + KV_HEADS
        value_at = (values + tl.maximum(head - HEADS - KV_HEADS, 0) * v_head + length * v_position + lane)
        tl.store(value_at, low.to(dtype), mask=lane_in & is_value)
        tl.store(value_at + HEAD_DIM // 2, high.to(dtype), mask=lane_in & is_value)
