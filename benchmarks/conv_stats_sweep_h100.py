#!/usr/bin/env python3
"""Issue 58 on one GPU: `--bn-kernels triton-conv`'s GEMM (resnet50/conv_stats.py) on ResNet-50's 36 forward 1x1
convolutions at GBS 256 (bf16, channels-last) for a few launch settings, against cuDNN's convolution alone and
cuDNN's convolution plus torch's statistics pass (what it replaces); no meter (this picks the module's launch
settings, the metered runs are benchmarks/perf33_h100.py's).

    python3 benchmarks/conv_stats_sweep_h100.py --out $OUT/convsweep

Per shape: cuDNN's convolution (F.conv2d, cudnn.benchmark on as the resnet50 driver sets it) alone and followed
by the statistics pass `--bn-kernels triton` runs (joulebench::batch_norm_stats: what the GEMM's epilogue
replaces); the module's own op (joulebench::conv1x1_batch_norm_stats, its launch_config and the finalize
included); then the kernel alone at each SETTING (grid: channel blocks × row slices, each slice TILES tiles of
BLOCK_M rows, "module": the module's slicing; the label gives the effective block sizes, clamped to the channels as
launch_config clamps them). Time: benchmarks.common.queued_seconds (REPEATS calls queued behind a spinning
kernel: no launch costs). GB/s = (input read + output written) / time. Every Triton row is checked against cuDNN:
the output (its buffer NaN before the call: a kernel that writes nothing fails) within 2e-2 of the largest value,
and the statistics (finalize of the kernel's moments) against torch's of cuDNN's output within 1e-3 relative;
a row off by more is WRONG and left out of the sums. results.md / results.json under --out are rewritten after
every shape.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.common import markdown_table, queued_seconds, write_results  # noqa: E402
from benchmarks.resnet50_convs import SHAPES, ConvShape  # noqa: E402

BATCH = 256
REPEATS = 20
# (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages, tiles per slice or 0 for the module's slicing, FLATTEN: the
# tile and K loops pipelined as one, which only a slice of several tiles can use)
SETTINGS = [(128, 128, 64, 8, 3, 0, False), (128, 128, 64, 8, 3, 0, True), (128, 64, 64, 4, 3, 0, True),
            (64, 64, 64, 4, 3, 0, True), (128, 128, 64, 8, 3, 1, False), (128, 64, 64, 4, 3, 1, False),
            (128, 64, 64, 8, 3, 1, False), (64, 128, 64, 4, 3, 1, False), (64, 64, 64, 4, 3, 1, False),
            (128, 256, 64, 8, 3, 1, False), (128, 128, 32, 8, 4, 1, False), (64, 256, 64, 8, 3, 1, False),
            (128, 128, 64, 4, 3, 1, False)]
HEADER = ("shape", "count", "setting", "status", "µs", "GB/s", "output diff", "stats diff")
WARMUP = 3
OUTPUT_MATCH, STATS_MATCH = 2e-2, 1e-3  # bf16 outputs: 2^-8 of a value; fp32 moments of those values
EPS = 1e-5
CUDNN, CUDNN_STATS, MODULE_OP = "cuDNN conv", "cuDNN conv + batch_norm_stats", "module op (launch_config, finalize)"


def setting_label(setting: tuple[int, int, int, int, int, int, bool]) -> str:
    """A SETTINGS entry's name in the tables, BLOCK_MxBLOCK_NxBLOCK_K, warps, stages, tiles per program (or the
    module's count), flat: the setting as asked, before a shape clamps its tile widths (`conv_stats.tile_width`)."""
    block_m, block_n, block_k, warps, stages, tiles, flatten = setting
    return f"{block_m}x{block_n}x{block_k} w{warps} s{stages} t{tiles or 'module'}{' flat' if flatten else ''}"


def _verdict(output_diff: float, stats_diff: float) -> str:
    """OK within both tolerances (a NaN, from a buffer the kernel left unwritten, is not)."""
    if output_diff <= OUTPUT_MATCH and stats_diff <= STATS_MATCH:
        return "OK"
    return f"WRONG: output {output_diff:.1e}, stats {stats_diff:.1e}"


def sweep_shape(shape: ConvShape) -> list[dict[str, Any]]:
    """Rows (setting, status, seconds, output diff, stats diff) of the references and each SETTING on one shape."""
    import torch
    import torch.nn.functional as F
    import triton

    from resnet50 import conv_stats
    from resnet50.bn_kernels import finalize_stats, slices

    cin, cout, side, stride = shape.cin, shape.cout, shape.side, shape.stride
    torch.manual_seed(58)
    x = torch.randn(BATCH, cin, side, side, device="cuda", dtype=torch.bfloat16).to(memory_format=torch.channels_last)
    weight = torch.randn(cout, cin, 1, 1, device="cuda", dtype=torch.bfloat16) / cin ** 0.5
    reference = F.conv2d(x, weight, stride=stride)
    var, mean = torch.var_mean(reference.double(), dim=(0, 2, 3), correction=1)
    scale = reference.abs().max().item()
    out_side = shape.out_side
    rows = BATCH * out_side * out_side
    w2 = weight.reshape(cout, cin).contiguous()

    def output_diff(y: torch.Tensor) -> float:
        return float(((y.float() - reference.float()).abs().max().item()) / scale)

    def stats_diff(got_mean: torch.Tensor, got_var: torch.Tensor) -> float:
        spread = var.sqrt().clamp_min(1e-30)
        return float(max(((got_mean.double() - mean).abs() / spread).max().item(),
                         ((got_var.double() - var).abs() / var.clamp_min(1e-30)).max().item()))

    def checked(setting: str, call: Callable[[], object],
                outputs: Callable[[], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]) -> dict[str, Any]:
        """One Triton row: `call` run once, its (output, mean, variance) checked, then timed; one that does not
        compile, launch or run is a row saying so, not the end of the sweep."""
        try:
            call()
            y, got_mean, got_var = outputs()
            diffs = output_diff(y), stats_diff(got_mean, got_var)
            return {"setting": setting, "status": _verdict(*diffs), "seconds": queued_seconds(call, REPEATS, WARMUP),
                    "output diff": diffs[0], "stats diff": diffs[1]}
        except Exception as error:
            return {"setting": setting, "status": f"failed: {type(error).__name__}: {str(error)[:80]}"}

    results: list[dict[str, Any]] = [
        {"setting": CUDNN, "status": "OK", "seconds": queued_seconds(
            lambda: F.conv2d(x, weight, stride=stride), REPEATS, WARMUP)},
        {"setting": CUDNN_STATS, "status": "OK", "seconds": queued_seconds(
            lambda: torch.ops.joulebench.batch_norm_stats(F.conv2d(x, weight, stride=stride), EPS), REPEATS, WARMUP)}]
    module_op: list[tuple[torch.Tensor, ...]] = []
    results.append(checked(
        MODULE_OP, lambda: module_op.append(torch.ops.joulebench.conv1x1_batch_norm_stats(x, weight, stride, EPS)),
        lambda: (module_op[0][0], module_op[0][1], module_op[0][3])))
    for setting in SETTINGS:
        block_m, block_n, block_k, warps, stages, tiles, flatten = setting
        label = setting_label(setting)  # as asked: the shape's clamped tiles would make two settings one label
        block_n, block_k = conv_stats.tile_width(block_n, cout), conv_stats.tile_width(block_k, cin)
        channel_blocks = triton.cdiv(cout, block_n)
        per_slice = tiles * block_m if tiles else slices(rows, channel_blocks, block_m)[1]
        slice_count = triton.cdiv(rows, per_slice)
        y = torch.full((BATCH, cout, out_side, out_side), float("nan"), device="cuda", dtype=torch.bfloat16
                       ).to(memory_format=torch.channels_last)
        partial = torch.full((slice_count, 2, cout), float("nan"), device="cuda", dtype=torch.float32)

        def call(y: torch.Tensor = y, partial: torch.Tensor = partial, bm: int = block_m, bn: int = block_n,
                 bk: int = block_k, w: int = warps, s: int = stages, grid: tuple[int, int] = (channel_blocks,
                                                                                              slice_count),
                 tiles_per: int = per_slice // block_m, flat: bool = flatten) -> None:
            conv_stats.conv1x1_gemm_with_batch_norm_stats[grid](
                x, w2, y, partial, rows, cin, cout, side, side, out_side, out_side, stride, tiles_per,
                STRIDED=stride != 1, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, FLATTEN=flat, num_warps=w, num_stages=s)
        def outputs(y: torch.Tensor = y, partial: torch.Tensor = partial, per_slice: int = per_slice
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            mean, _invstd, var = finalize_stats(partial, rows, per_slice, EPS)
            return y, mean, var
        results.append(checked(label, call, outputs))
    return results


def summary(rows: list[dict[str, Any]]) -> tuple[list[str], dict[str, Any]]:
    """Per setting, its time over the 36 convolutions (n/a where it is not OK on every shape, with how many not), and
    the best OK Triton setting per shape summed."""
    shapes = {r["shape"]: r["count"] for r in rows}
    settings = dict.fromkeys(r["setting"] for r in rows)
    lines, totals = [], {}
    for setting in settings:
        ok = {r["shape"]: r["µs"] for r in rows if r["setting"] == setting and r["status"] == "OK"}
        missing = len(shapes) - len(ok)
        total = sum(ok[shape] * count for shape, count in shapes.items()) / 1e3 if not missing else None
        totals[setting] = total
        lines.append(f"- {setting}: " + (f"{total:.2f} ms per iteration (36 convolutions)" if total is not None
                                         else f"n/a ({missing} of {len(shapes)} shapes not OK)"))
    best, unreached = 0.0, []
    for shape, count in shapes.items():
        triton_rows = [r["µs"] for r in rows if r["shape"] == shape and r["status"] == "OK" and r["setting"] not in
                       (CUDNN, CUDNN_STATS)]
        if triton_rows:
            best += min(triton_rows) * count / 1e3
        else:
            unreached.append(shape)
    lines.append(f"- best OK Triton setting per shape: {best:.2f} ms per iteration"
                 + (f" (no OK setting on {', '.join(unreached)})" if unreached else ""))
    return lines, {"totals_ms": totals, "best_ms": best, "no_ok_setting": unreached}


def save_tables(out: Path, rows: list[dict[str, Any]]) -> list[str]:
    """The table and its summary as results.md, the rows and sums as results.json; the summary's lines."""
    lines, figures = summary(rows)
    write_results(out, markdown_table(rows, HEADER, digits=4) + "\n\n" + "\n".join(lines) + "\n",
                  {"rows": rows, **figures})
    return lines


def main() -> int:
    import torch

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="directory for results.md / results.json")
    out = Path(parser.parse_args().out)
    if not torch.cuda.is_available():
        print(f"{sys.argv[0]}: no CUDA GPU is visible here. Fix: run it on the GPU machine (device tool)",
              file=sys.stderr)
        return 64
    out.mkdir(parents=True, exist_ok=True)
    torch.backends.cudnn.benchmark = True  # as the resnet50 driver runs cuDNN
    import resnet50.conv_stats  # noqa: F401  (registers the joulebench ops)

    rows: list[dict[str, Any]] = []
    lines: list[str] = []
    for shape in (shape for shape in SHAPES if shape.kernel == 1):
        # bf16 bytes read (a strided 1x1 reads every stride-th row and column) and written
        moved = 2 * BATCH * (shape.cin * shape.side ** 2 // shape.stride ** 2 + shape.cout * shape.out_side ** 2)
        for result in sweep_shape(shape):
            seconds = result.pop("seconds", None)
            row = {"shape": shape.label, "count": shape.count, **result,
                   "µs": None if seconds is None else seconds * 1e6,
                   "GB/s": None if seconds is None else moved / seconds / 1e9}
            rows.append(row)
            print("CONVSWEEP", json.dumps(row), flush=True)
        lines = save_tables(out, rows)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
