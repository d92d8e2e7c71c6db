"""The split decode-attention kernels against SDPA with the equivalent mask.

The Triton kernels run here in Triton's interpreter (TRITON_INTERPRET=1, CPU tensors, fp32 with IEEE dot
products), in a child process because the interpreter is chosen when Triton is imported. What is checked: rows
with left padding (first > 0) and without (first None), one `last` for all rows and one per row, lengths that
are not multiples of the piece size, pieces that are wholly padding or wholly beyond `last` (empty pieces),
grouped-query heads and head sizes 16/64/128, a permuted (non-contiguous) query, the engines' query (a slice of
each row's Q/K/V, read in place), one whose head dim is not unit-strided, a `last` past the attended
length, and a row with nothing visible (zeros, not NaN). On a GPU, benchmarks/inference_engine_h100.py checks the
engine's bf16 logits against fp32 weights.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from llm_inference.decode_attention import SPLIT_BLOCK, piece_positions, sdpa_decode_attention, visible_mask

REPO = Path(__file__).resolve().parents[2]

CHILD = textwrap.dedent("""
    import torch
    from llm_inference.decode_attention import sdpa_decode_attention, split_decode_attention

    torch.manual_seed(0)
    worst = 0.0
    # rows, KV heads, groups, head dim, cache positions, attended length, first rows (None: from 0), per-row last, SMs
    cases = [(1, 2, 4, 16, 200, 192, None, False, 8), (3, 2, 4, 64, 256, 256, [0, 70, 130], False, 4),
             (4, 1, 1, 16, 160, 150, [5, 0, 64, 140], True, 132), (2, 4, 2, 16, 130, 128, None, True, 1),
             (2, 8, 4, 128, 192, 128, [3, 60], False, 132)]  # llama-8b's heads: 8 KV heads of 4 queries, d 128
    for rows, heads, groups, dim, positions, length, first, per_row, sms in cases:
        q = torch.randn(rows, heads, groups, dim)
        cache = torch.randn(2, rows, heads, positions, dim)
        first_t = None if first is None else torch.tensor(first)
        if per_row:
            last = torch.randint(max(first or [0]), length, (rows,))
        else:
            last = torch.tensor([length - 1 - rows])
        got = split_decode_attention(q, cache[0], cache[1], first_t, last, length, sms)
        want = sdpa_decode_attention(q, cache[0], cache[1], first_t, last, length)
        worst = max(worst, (got - want).abs().max().item())
    # a query that is a permuted view (not contiguous), and a `last` past `length` (a continuous engine's idle row)
    q = torch.randn(2, 4, 3, 16).transpose(1, 2)
    cache = torch.randn(2, 2, 3, 96, 16)
    got = split_decode_attention(q, cache[0], cache[1], None, torch.tensor([40, 95]), 64, 4)
    want = sdpa_decode_attention(q, cache[0], cache[1], None, torch.tensor([40, 63]), 64)
    worst = max(worst, (got - want).abs().max().item())
    # the engines' layout: Q a slice of each row's Q/K/V (rows, Q+K+V heads, head dim), read in place; and a query
    # whose head dim is not unit-strided (copied first)
    qkv = torch.randn(3, 2 * 4 + 2 * 2, 16)
    q = qkv[:, :8].view(3, 2, 4, 16)
    cache = torch.randn(2, 3, 2, 80, 16)
    got = split_decode_attention(q, cache[0], cache[1], None, torch.tensor([70]), 64, 4)
    want = sdpa_decode_attention(q, cache[0], cache[1], None, torch.tensor([63]), 64)
    worst = max(worst, (got - want).abs().max().item())
    q = torch.randn(3, 2, 16, 4).transpose(2, 3)
    got = split_decode_attention(q, cache[0], cache[1], None, torch.tensor([50]), 64, 4)
    want = sdpa_decode_attention(q, cache[0], cache[1], None, torch.tensor([50]), 64)
    worst = max(worst, (got - want).abs().max().item())
    print(f"WORST {worst:.3e}")
    # a row with nothing visible (first after last): zeros, never NaN
    empty = split_decode_attention(torch.randn(1, 2, 4, 16), cache[0, :1, :2], cache[1, :1, :2], torch.tensor([50]),
                                   torch.tensor([10]), 64, 4)
    print(f"EMPTY {empty.abs().max().item():.3e} {int(empty.isnan().any())}")
""")


def test_split_kernels_match_sdpa_in_tritons_interpreter() -> None:
    pytest.importorskip("triton", reason="Triton is not installed (CPU-only torch wheel): the kernels cannot run")
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    worst = float(done.stdout.split("WORST")[1].split()[0])
    assert worst < 1e-5, f"split kernels differ from SDPA by {worst}"
    assert done.stdout.split("EMPTY")[1].split() == ["0.000e+00", "0"]


def test_sdpa_reference_attends_only_the_visible_positions() -> None:
    """The masked reference equals attention computed over each row's visible cache positions alone."""
    torch.manual_seed(1)
    q, cache = torch.randn(2, 2, 3, 8), torch.randn(2, 2, 2, 40, 8)
    first, last = torch.tensor([4, 0]), torch.tensor([20, 33])
    got = sdpa_decode_attention(q, cache[0], cache[1], first, last, 40)
    for row in range(2):
        keys = cache[0, row, :, first[row]:last[row] + 1]
        values = cache[1, row, :, first[row]:last[row] + 1]
        weights = torch.softmax(q[row] @ keys.transpose(-1, -2) / 8 ** 0.5, dim=-1)
        torch.testing.assert_close(got[row], weights @ values)


def test_visible_mask_bounds_and_shared_last() -> None:
    mask = visible_mask(torch.tensor([1, 0]), torch.tensor([3]), 5, 2)
    assert mask.tolist() == [[False, True, True, True, False], [True, True, True, True, False]]
    assert visible_mask(None, torch.tensor([0, 2]), 3, 2).tolist() == [[True, False, False], [True, True, True]]


@pytest.mark.parametrize(("rows_heads", "length", "sms", "expected"), [
    (8, 512, 132, SPLIT_BLOCK),  # batch 1, 8 KV heads: as many pieces as 64-position blocks
    (4096, 768, 132, 768),  # batch 512: rows × heads fill the GPU, one piece per row and head
    (64, 1000, 132, 256),  # in between: about 2 pieces per SM
])
def test_piece_positions(rows_heads: int, length: int, sms: int, expected: int) -> None:
    positions = piece_positions(rows_heads, length, sms)
    assert positions == expected and positions % SPLIT_BLOCK == 0


def test_triton_serves_only_the_measured_tile_sizes():
    """bf16 up to head dim 128 (K/V rows of 256 bytes, the case measured on an H100); larger rows, head sizes that
    are not powers of two and CPUs go to SDPA. Only the device's type is read: no GPU is needed."""
    pytest.importorskip("triton", reason="Triton is not installed (CPU-only torch wheel)")
    from llm_inference.decode_attention import triton_supported

    cuda = torch.device("cuda")
    assert triton_supported(cuda, 128, torch.bfloat16) and triton_supported(cuda, 64, torch.float32)
    assert not triton_supported(cuda, 128, torch.float32) and not triton_supported(cuda, 256, torch.bfloat16)
    assert not triton_supported(cuda, 96, torch.bfloat16)
    assert not triton_supported(torch.device("cpu"), 64, torch.bfloat16)
