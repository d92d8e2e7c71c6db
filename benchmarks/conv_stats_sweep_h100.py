#!/usr/bin/env python3
"""Issue 58 on one GPU: `--bn-kernels triton-conv`'s GEMM (resnet50/conv_stats.py) on ResNet-50's 36 forward 1x1
convolutions at GBS 256 (bf16, channels-last) for a few launch settings, against cuDNN's convolution alone and
cuDNN's convolution plus torch's statistics pass (what it replaces); no meter (this picks the module's launch
settings, the metered runs are benchmarks/perf33_h100.py's).

    python3 benchmarks/conv_stats_sweep_h100.py --out $OUT/convsweep

Per shape and setting: the kernel as conv_stats launches it (grid: channel blocks × row slices), each slice
TILES tiles of BLOCK_M rows ("module": the module's own slicing), mean of REPEATS calls by CUDA events after a
warm-up, GB/s = (input read + output written) / time; the output is checked against cuDNN's (largest difference
relative to the output's largest value). Writes results.md / results.json under --out.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.common import markdown_table  # noqa: E402

BATCH = 256
REPEATS = 20
# (in channels, out channels, input side, stride, convolutions of this shape in ResNet-50 v1.5)
SHAPES = [(64, 64, 56, 1, 1), (256, 64, 56, 1, 2), (64, 256, 56, 1, 4), (256, 128, 56, 1, 1), (512, 128, 28, 1, 3),
          (128, 512, 28, 1, 4), (256, 512, 56, 2, 1), (512, 256, 28, 1, 1), (1024, 256, 14, 1, 5),
          (256, 1024, 14, 1, 6), (512, 1024, 28, 2, 1), (1024, 512, 14, 1, 1), (2048, 512, 7, 1, 2),
          (512, 2048, 7, 1, 3), (1024, 2048, 14, 2, 1)]
# (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages, tiles per slice or 0 for the module's slicing, FLATTEN: the
# tile and K loops pipelined as one, which only a slice of several tiles can use)
SETTINGS = [(128, 128, 64, 8, 3, 0, False), (128, 128, 64, 8, 3, 0, True), (128, 64, 64, 4, 3, 0, True),
            (64, 64, 64, 4, 3, 0, True), (128, 128, 64, 8, 3, 1, False), (128, 64, 64, 4, 3, 1, False),
            (128, 64, 64, 8, 3, 1, False), (64, 128, 64, 4, 3, 1, False), (64, 64, 64, 4, 3, 1, False),
            (128, 256, 64, 8, 3, 1, False), (128, 128, 32, 8, 4, 1, False), (64, 256, 64, 8, 3, 1, False),
            (128, 128, 64, 4, 3, 1, False)]
HEADER = ("shape", "count", "setting", "status", "µs", "GB/s", "max rel diff")


def timed(fn: Any) -> float:
    """Mean seconds of one call over REPEATS after three warm-up calls."""
    import torch

    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(REPEATS):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3 / REPEATS


def sweep_shape(cin: int, cout: int, side: int, stride: int) -> list[tuple[str, str, float | None, float | None]]:
    """(setting, status, seconds, max relative difference) for cuDNN, cuDNN + statistics, and each SETTING."""
    import torch
    import torch.nn.functional as F
    import triton

    from resnet50 import conv_stats
    from resnet50.bn_kernels import slices

    x = torch.randn(BATCH, cin, side, side, device="cuda", dtype=torch.bfloat16).to(memory_format=torch.channels_last)
    weight = (torch.randn(cout, cin, 1, 1, device="cuda", dtype=torch.bfloat16) / cin ** 0.5)
    reference = F.conv2d(x, weight.to(memory_format=torch.channels_last), stride=stride)
    scale = reference.abs().max().item()
    out_side = (side - 1) // stride + 1
    rows = BATCH * out_side * out_side
    w2 = weight.reshape(cout, cin).contiguous()
    results: list[tuple[str, str, float | None, float | None]] = [
        ("cuDNN conv", "OK", timed(lambda: F.conv2d(x, weight, stride=stride)), 0.0),
        ("cuDNN conv + var_mean", "OK", timed(lambda: torch.var_mean(
            F.conv2d(x, weight, stride=stride).float(), dim=(0, 2, 3))), 0.0)]
    for block_m, block_n, block_k, warps, stages, tiles, flatten in SETTINGS:
        label = f"{block_m}x{block_n}x{block_k} w{warps} s{stages} t{tiles or 'module'}{' flat' if flatten else ''}"
        block_n, block_k = min(block_n, max(16, triton.next_power_of_2(cout))), min(block_k, cin)
        channel_blocks = triton.cdiv(cout, block_n)
        per_slice = tiles * block_m if tiles else slices(rows, channel_blocks, block_m)[1]
        slice_count = triton.cdiv(rows, per_slice)
        y = torch.empty(BATCH, cout, out_side, out_side, device="cuda", dtype=torch.bfloat16,
                        memory_format=torch.channels_last)
        partial = torch.empty(slice_count, 2, cout, device="cuda", dtype=torch.float32)

        def call(y: torch.Tensor = y, partial: torch.Tensor = partial, bm: int = block_m, bn: int = block_n,
                 bk: int = block_k, w: int = warps, s: int = stages, grid: tuple[int, int] = (channel_blocks,
                                                                                              slice_count),
                 tiles_per: int = per_slice // block_m, flat: bool = flatten) -> None:
            conv_stats.conv1x1_gemm_with_batch_norm_stats[grid](
                x, w2, y, partial, rows, cin, cout, side, side, out_side, out_side, stride, tiles_per,
                STRIDED=stride != 1, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, FLATTEN=flat, num_warps=w, num_stages=s)
        try:
            seconds = timed(call)
            diff = ((y.float() - reference.float()).abs().max().item()) / scale
            results.append((label, "OK", seconds, diff))
        except Exception as error:  # a setting that does not compile or launch is a row, not the end
            results.append((label, f"failed: {type(error).__name__}: {str(error)[:80]}", None, None))
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="directory for results.md / results.json")
    out = Path(parser.parse_args().out)
    out.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    totals: dict[str, float] = {}
    for cin, cout, side, stride, count in SHAPES:
        out_side = (side - 1) // stride + 1
        moved = 2 * BATCH * (cin * out_side * out_side + cout * out_side * out_side)  # bytes read + written
        for label, status, seconds, diff in sweep_shape(cin, cout, side, stride):
            row = {"shape": f"{cin}->{cout} @{side} s{stride}", "count": count, "setting": label, "status": status,
                   "µs": None if seconds is None else round(seconds * 1e6, 1),
                   "GB/s": None if seconds is None else round(moved / seconds / 1e9),
                   "max rel diff": None if diff is None else f"{diff:.1e}"}
            rows.append(row)
            print("CONVSWEEP", json.dumps(row), flush=True)
            if seconds is not None:
                totals[label] = totals.get(label, 0.0) + seconds * count
    best = sum(min(r["µs"] for r in rows if r["shape"] == shape and r["µs"] is not None and not
                   r["setting"].startswith("cuDNN")) * next(r["count"] for r in rows if r["shape"] == shape)
               for shape in dict.fromkeys(r["shape"] for r in rows))
    summary = [f"- {label}: {total * 1e3:.2f} ms per iteration (36 convolutions)" for label, total in totals.items()]
    summary.append(f"- best setting per shape: {best / 1e3:.2f} ms per iteration")
    text = markdown_table(rows, HEADER) + "\n\n" + "\n".join(summary) + "\n"
    (out / "results.md").write_text(text)
    (out / "results.json").write_text(json.dumps({"rows": rows, "totals_ms": {k: v * 1e3 for k, v in totals.items()},
                                                  "best_ms": best / 1e3}, indent=1))
    print("\n".join(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
