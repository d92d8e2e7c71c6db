"""Decode attention over a KV cache: one query token per row, reading only the row's own visible cache positions.

Why not SDPA here: a decode step's query is one token per row (the query heads of one KV head act as that
head's query rows), so SDPA gets batch × KV heads programs, each walking the whole attended length alone: at
batch 1 that is 8 programs on a 132-SM GPU, and its additive mask makes every row read every attended position,
left padding included (at batch 256 of chat prompts more than half of what is read is padding). Here the
attended length is split into pieces of SPLIT_BLOCK positions that run in parallel (split-K, "flash decoding"),
each piece skips positions outside its row's [first, last] range without reading them, and a second kernel
combines the pieces' partial softmax sums. On CUDA with Triton; anywhere else (or an unsupported head size)
SDPA with the equivalent mask, which is also the reference the tests compare against.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

SPLIT_BLOCK = 64  # cache positions per loop step of a piece; pieces are multiples of it
PIECES_PER_SM = 2  # pieces in flight per SM aimed for when rows × KV heads alone cannot fill the GPU
PIECE_WARPS, PIECE_STAGES = 4, 3  # the pieces kernel's launch (Triton's defaults; benchmarks/decode_parts_h100.py)
INTERPRETER_SMS = 4  # what grids are sized for off a GPU (Triton's interpreter in the tests): a few programs each

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only torch wheels come without Triton: the SDPA path serves
    triton = None
try:  # grid dependency control, for programmatic dependent launch: Triton >= 3.4 (torch >= 2.8)
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
    GRID_DEPENDENCY_CONTROL = True
except ImportError:  # an older Triton (or none): every kernel launches as before (fused_decode.uses_pdl)
    GRID_DEPENDENCY_CONTROL = False


def triton_supported(device: torch.device, head_dim: int, dtype: torch.dtype) -> bool:
    """Whether the split kernel runs here: CUDA, Triton importable and a head the kernels tile (heads_supported)."""
    return triton is not None and device.type == "cuda" and heads_supported(head_dim, dtype)


def heads_supported(head_dim: int, dtype: torch.dtype) -> bool:
    """A power-of-two head size Triton can tile, and K/V rows of at most 256 bytes (bf16 up to head dim 128, as
    measured on an H100; larger tiles in Triton's default three pipeline stages come close to an SM's shared memory
    and were never run: SDPA serves them)."""
    return 16 <= head_dim <= 256 and head_dim & (head_dim - 1) == 0 and head_dim * dtype.itemsize <= 256


def visible_mask(first: torch.Tensor | None, last: torch.Tensor, length: int, batch: int) -> torch.Tensor:
    """(batch, length) booleans: cache position j visible to row b when first[b] <= j <= last[b] (first None: 0)."""
    positions = torch.arange(length, device=last.device)[None, :]
    visible = positions <= last.expand(batch)[:, None]
    return visible if first is None else visible & (positions >= first[:, None])


def sdpa_mask(first: torch.Tensor | None, last: torch.Tensor, length: int, rows: int, dtype: torch.dtype
              ) -> torch.Tensor:
    """The SDPA path's additive mask (rows, 1, 1, length): built once per decode pass, shared by its layers."""
    return additive_mask(visible_mask(first, last, length, rows), dtype)[:, None, None]


def sdpa_decode_attention(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, first: torch.Tensor | None,
                          last: torch.Tensor, length: int, mask: torch.Tensor | None = None) -> torch.Tensor:
    """The reference: SDPA over the first `length` cache positions with the visibility as an additive mask (`mask`: the
    same, built by sdpa_mask beforehand)."""
    if mask is None:
        mask = sdpa_mask(first, last, length, query.shape[0], query.dtype)
    return F.scaled_dot_product_attention(query, keys[:, :, :length], values[:, :, :length], attn_mask=mask)


def additive_mask(visible: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean attention mask in SDPA's additive form (0 where visible, the dtype's minimum elsewhere)."""
    zero = torch.zeros((), dtype=dtype, device=visible.device)
    return torch.where(visible, zero, torch.finfo(dtype).min)


def piece_positions(rows_heads: int, length: int, sms: int) -> int:
    """Cache positions per piece: one piece per (row, KV head) when those alone fill the GPU, else shorter pieces
    (multiples of SPLIT_BLOCK) until about PIECES_PER_SM × SMs pieces run."""
    wanted = max(1, math.ceil(PIECES_PER_SM * sms / rows_heads))
    return max(SPLIT_BLOCK, math.ceil(math.ceil(length / wanted) / SPLIT_BLOCK) * SPLIT_BLOCK)


def sm_count(device: torch.device) -> int:
    """The GPU's SMs: how many pieces split_decode_attention aims for (elsewhere INTERPRETER_SMS: the kernels
    run in Triton's interpreter there, where the count only shapes the grids)."""
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else INTERPRETER_SMS


def split_decode_attention(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, first: torch.Tensor | None,
                           last: torch.Tensor, length: int, sms: int, pdl: bool = False) -> torch.Tensor:
    """Attention of one query token per row, by the two Triton kernels (where triton_supported says so; no device
    check here: the tests run them in Triton's interpreter on the CPU). query (rows, KV heads, groups, head dim);
    keys and values (rows, KV heads, cache positions, head dim) with unit stride along the head dim; row b sees
    positions first[b]..last[b] below `length` (first None: from 0; last (rows,) or (1,) for all rows; a row with
    nothing visible gets zeros). Returns (rows, KV heads, groups, head dim). `pdl`: both kernels launched as
    programmatic dependents (sm_90+; llm_inference/fused_decode.py says why), each waiting for its predecessor's
    writes before its first load."""
    rows, kv_heads, groups, head_dim = query.shape
    block_groups = max(16, triton.next_power_of_2(groups))  # tl.dot tiles are at least 16 wide
    per_piece = piece_positions(rows * kv_heads, length, sms)
    pieces = math.ceil(length / per_piece)
    partial = torch.empty((rows * kv_heads, pieces, block_groups, head_dim), dtype=torch.float32, device=query.device)
    maxima = torch.empty((rows * kv_heads, pieces, block_groups), dtype=torch.float32, device=query.device)
    sums = torch.empty_like(maxima)
    if query.stride(-1) != 1:  # the kernels read the head dim with unit stride; rows, heads and groups by their strides
        query = query.contiguous()  # (the engines' Q, a slice of each row's Q/K/V, is read in place: no copy per layer)
    out = torch.empty(query.shape, dtype=query.dtype, device=query.device)
    _pieces_kernel[(rows * kv_heads, pieces)](
        query, keys, values, last if first is None else first, last, partial, maxima, sums,
        *query.stride()[:3], *keys.stride()[:3], *values.stride()[:3], last.stride(0) if last.shape[0] > 1 else 0,
        1.0 / math.sqrt(head_dim), per_piece, pieces, length,
        KV_HEADS=kv_heads, GROUPS=groups, HEAD_DIM=head_dim, BLOCK_GROUPS=block_groups, BLOCK_POSITIONS=SPLIT_BLOCK,
        FROM_ZERO=first is None,
        DOT_PRECISION="ieee" if query.dtype == torch.float32 else "tf32",  # tf32: Triton's default, unused in bf16
        PDL=pdl, num_warps=PIECE_WARPS, num_stages=PIECE_STAGES, **launch_options(pdl))
    _combine_kernel[(rows * kv_heads,)](
        partial, maxima, sums, out, *out.stride()[:3], pieces,
        KV_HEADS=kv_heads, GROUPS=groups, HEAD_DIM=head_dim, BLOCK_GROUPS=block_groups, PDL=pdl, **launch_options(pdl))
    return out


def launch_options(pdl: bool) -> dict[str, bool]:
    """Triton's launch option for a programmatic dependent launch; none otherwise (Triton's interpreter, the CPU
    tests' path, takes no such option)."""
    return {"launch_pdl": True} if pdl else {}


if triton is not None:
    @triton.jit
    def wait_for_predecessor():
        """A programmatic dependent's start: let the next kernel's programs launch as this one's finish (they too
        wait here), then wait until the previous kernel has finished and its writes are visible."""
        gdc_launch_dependents()
        gdc_wait()

    @triton.jit(do_not_specialize=["last_stride", "piece_positions", "pieces", "length"])
    def _pieces_kernel(query, keys, values, firsts, lasts, partial, maxima, sums,
                       q_row, q_head, q_group, k_row, k_head, k_position, v_row, v_head, v_position, last_stride,
                       scale, piece_positions, pieces, length,
                       KV_HEADS: tl.constexpr, GROUPS: tl.constexpr, HEAD_DIM: tl.constexpr,
                       BLOCK_GROUPS: tl.constexpr, BLOCK_POSITIONS: tl.constexpr, FROM_ZERO: tl.constexpr,
                       DOT_PRECISION: tl.constexpr, PDL: tl.constexpr):
        """One piece of one (row, KV head): its softmax maximum, sum and unnormalised output per query row."""
        if PDL:  # everything it reads (query, lengths, the K/V just written) comes from its predecessor
            wait_for_predecessor()
        row_head = tl.program_id(0)
        piece = tl.program_id(1)
        row = (row_head // KV_HEADS).to(tl.int64)  # row × row stride can pass 2^31 in a large cache
        head = row_head % KV_HEADS
        last = tl.load(lasts + row * last_stride)
        first = 0 if FROM_ZERO else tl.load(firsts + row)
        begin = tl.maximum(first, piece * piece_positions)
        end = tl.minimum(tl.minimum(last + 1, length), (piece + 1) * piece_positions)
        group = tl.arange(0, BLOCK_GROUPS)
        dim = tl.arange(0, HEAD_DIM)
        q = tl.load(query + row * q_row + head * q_head + group[:, None] * q_group + dim[None, :],
                    mask=group[:, None] < GROUPS, other=0.0)
        maximum = tl.full([BLOCK_GROUPS], -1.0e30, tl.float32)  # finite: an empty piece gives exp(0) factors, no NaN
        total = tl.zeros([BLOCK_GROUPS], tl.float32)
        acc = tl.zeros([BLOCK_GROUPS, HEAD_DIM], tl.float32)
        key_base = keys + row * k_row + head * k_head
        value_base = values + row * v_row + head * v_head
        for start in range(begin, end, BLOCK_POSITIONS):
            position = start + tl.arange(0, BLOCK_POSITIONS)
            inside = position < end
            k = tl.load(key_base + position[:, None] * k_position + dim[None, :], mask=inside[:, None], other=0.0)
            scores = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
            scores = tl.where(inside[None, :], scores * scale, float("-inf"))
            new_maximum = tl.maximum(maximum, tl.max(scores, 1))
            weights = tl.exp(scores - new_maximum[:, None])
            rescale = tl.exp(maximum - new_maximum)
            total = total * rescale + tl.sum(weights, 1)
            v = tl.load(value_base + position[:, None] * v_position + dim[None, :], mask=inside[:, None], other=0.0)
            acc = acc * rescale[:, None] + tl.dot(weights.to(v.dtype), v, input_precision=DOT_PRECISION)
            maximum = new_maximum
        at = row_head.to(tl.int64) * pieces + piece
        tl.store(partial + (at * BLOCK_GROUPS + group[:, None]) * HEAD_DIM + dim[None, :], acc)
        tl.store(maxima + at * BLOCK_GROUPS + group, maximum)
        tl.store(sums + at * BLOCK_GROUPS + group, total)

    @triton.jit(do_not_specialize=["pieces"])
    def _combine_kernel(partial, maxima, sums, out, o_row, o_head, o_group, pieces,
                        KV_HEADS: tl.constexpr, GROUPS: tl.constexpr, HEAD_DIM: tl.constexpr,
                        BLOCK_GROUPS: tl.constexpr, PDL: tl.constexpr):
        """The pieces of one (row, KV head) merged by their maxima (an online softmax over pieces)."""
        if PDL:
            wait_for_predecessor()
        row_head = tl.program_id(0)
        row = (row_head // KV_HEADS).to(tl.int64)
        head = row_head % KV_HEADS
        group = tl.arange(0, BLOCK_GROUPS)
        dim = tl.arange(0, HEAD_DIM)
        maximum = tl.full([BLOCK_GROUPS], -1.0e30, tl.float32)
        total = tl.zeros([BLOCK_GROUPS], tl.float32)
        acc = tl.zeros([BLOCK_GROUPS, HEAD_DIM], tl.float32)
        for piece in range(pieces):
            at = row_head.to(tl.int64) * pieces + piece
            piece_maximum = tl.load(maxima + at * BLOCK_GROUPS + group)
            new_maximum = tl.maximum(maximum, piece_maximum)
            old_weight = tl.exp(maximum - new_maximum)
            piece_weight = tl.exp(piece_maximum - new_maximum)
            total = total * old_weight + tl.load(sums + at * BLOCK_GROUPS + group) * piece_weight
            piece_acc = tl.load(partial + (at * BLOCK_GROUPS + group[:, None]) * HEAD_DIM + dim[None, :])
            acc = acc * old_weight[:, None] + piece_acc * piece_weight[:, None]
            maximum = new_maximum
        result = tl.where(total[:, None] > 0, acc / total[:, None], 0.0)  # nothing visible: zeros, never NaN
        tl.store(out + row * o_row + head * o_head + group[:, None] * o_group + dim[None, :],
                 result.to(out.dtype.element_ty), mask=group[:, None] < GROUPS)
