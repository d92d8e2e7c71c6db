#!/usr/bin/env python3
"""Issue 59 on one GPU: the parts of llama-8b's large-batch decode step against their ceilings; no meter (it says
which part to change; the metered runs are benchmarks/perf33_h100.py's).

    python3 benchmarks/decode_parts_h100.py --out $OUT/parts59
    python3 benchmarks/decode_parts_h100.py --rows 512 --positions 384 --settings 64x4x3,128x8x3 --out /tmp/p

At batch 512 a decode step took 21.5 ms (docs/BENCHMARKS.md), counted as ≈ 7.7 TFLOP of GEMMs and ≈ 24 GB of K/V
read in series. Per row count (--rows):
1. Each GEMM of a layer and the LM head by F.linear (cuBLAS, as the compiled step calls it): ms and TFLOP/s at the
   step's rows, and at REFERENCE_ROWS rows (the card's GEMM rate on the same matrix under the same power cap);
   weights cycle through copies that L2 does not hold. With --autotune also inductor's max-autotune choice at the
   step's rows (would a decode variant with that option run faster GEMMs).
2. The split decode attention (llm_inference/decode_attention.py) with every row attending to --positions
   positions, per launch setting BLOCKxWARPSxSTAGES (SPLIT_BLOCK, PIECE_WARPS, PIECE_STAGES): ms and GB/s of K/V
   read; each setting's output checked against the module's own setting's.
3. The card's copy rate (a 2 GiB device-to-device copy, bytes read + written per second): attention's ceiling.
The step counted from the parts (layers × the layer's GEMMs and attention + the LM head) beside the copy-rate and
GEMM-rate floors. Writes results.md / results.json under --out after each part.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.common import exit_status, markdown_table, queued_seconds, weight_copies, write_results  # noqa: E402
from joulebench.boundary import exit_code_of  # noqa: E402

PRESET = "llama-8b"
REFERENCE_ROWS = 8192
REPEATS, WARMUP = 20, 3
COPY_BYTES = 2 * 2**30
GEMM_HEADER = ("rows", "GEMM", "shape", "ms", "TFLOP/s", f"TFLOP/s at {REFERENCE_ROWS} rows", "of reference",
               "autotuned ms", "autotuned / cuBLAS")
ATTENTION_HEADER = ("rows", "setting", "status", "ms", "K/V GB/s", "of copy rate")
STEP_HEADER = ("rows", "GEMMs ms", "GEMMs ms at reference rate", "attention ms (module's setting)",
               "attention ms at copy rate", "best setting", "attention ms (best)", "sum ms")


def gemms(preset: str) -> list[tuple[str, int, int, int]]:
    """(name, output size, input size, calls per step) of the step's matrices: per layer and the LM head."""
    from llm_inference.presets import PRESETS

    shape = PRESETS[preset]
    hidden, inner, layers = shape.hidden_size, shape.intermediate_size, shape.num_layers
    head_dim = hidden // shape.num_attention_heads
    qkv = (shape.num_attention_heads + 2 * shape.num_key_value_heads) * head_dim
    return [("Q/K/V", qkv, hidden, layers), ("out", hidden, hidden, layers), ("gate/up", 2 * inner, hidden, layers),
            ("down", hidden, inner, layers), ("LM head", shape.vocab_size, hidden, 1)]


def gemm_ms(rows: int, outputs: int, inputs: int, autotuned: bool = False) -> float:
    """Mean ms of F.linear((rows, inputs) @ weights.T), cycling through enough weight copies that L2 holds none;
    `autotuned`: the same compiled by inductor with max-autotune (its Triton GEMM templates timed against cuBLAS at
    this shape, the best kept), what a decode variant with inductor's max_autotune option would run."""
    import torch
    import torch.nn.functional as F

    linear: Any = F.linear
    if autotuned:
        torch._dynamo.reset()  # one shape per compile: no recompile limit, no earlier shape's choice
        linear = torch.compile(F.linear, mode="max-autotune-no-cudagraphs", dynamic=False)
    weights = weight_copies(outputs, inputs)
    x = torch.randn(rows, inputs, device="cuda", dtype=torch.bfloat16)
    turn = itertools.cycle(weights)
    return queued_seconds(lambda: linear(x, next(turn)), REPEATS, WARMUP) * 1e3


def measure_gemms(rows: int, autotune: bool) -> list[dict[str, Any]]:
    import torch

    measured = []
    for name, outputs, inputs, calls in gemms(PRESET):
        flop = 2 * rows * outputs * inputs
        ms, reference_ms = gemm_ms(rows, outputs, inputs), gemm_ms(REFERENCE_ROWS, outputs, inputs)
        torch.cuda.empty_cache()  # this matrix's copies are gone: the next one's fit
        rate, reference_rate = flop / ms / 1e9, 2 * REFERENCE_ROWS * outputs * inputs / reference_ms / 1e9
        measured.append({"rows": rows, "GEMM": name, "shape": f"{outputs}x{inputs}", "calls": calls, "ms": ms,
                         "TFLOP/s": rate, f"TFLOP/s at {REFERENCE_ROWS} rows": reference_rate,
                         "of reference": rate / reference_rate, "status": "OK"})
        if autotune:
            autotuned_ms = gemm_ms(rows, outputs, inputs, autotuned=True)
            measured[-1].update({"autotuned ms": autotuned_ms, "autotuned / cuBLAS": autotuned_ms / ms})
            torch.cuda.empty_cache()
        print("GEMM", measured[-1], flush=True)
    return measured


def copy_rate() -> float:
    """Bytes read + written per second by a device-to-device copy of COPY_BYTES."""
    import torch

    source = torch.empty(COPY_BYTES // 2, dtype=torch.bfloat16, device="cuda")
    target = torch.empty_like(source)
    return 2 * COPY_BYTES / queued_seconds(lambda: target.copy_(source), REPEATS, WARMUP)


def parse_settings(text: str) -> list[tuple[int, int, int]]:
    settings = []
    for item in text.split(","):
        parts = item.split("x")
        if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
            raise SystemExit(f"--settings {item!r}: not BLOCKxWARPSxSTAGES (e.g. 64x4x3); pass positive integers")
        settings.append((int(parts[0]), int(parts[1]), int(parts[2])))
    return settings


def measure_attention(rows: int, positions: int, settings: list[tuple[int, int, int]], sms: int, copy: float
                      ) -> list[dict[str, Any]]:
    """The split kernels per launch setting on one layer's cache of `rows` rows, each row seeing `positions`."""
    import torch

    from llm_inference import decode_attention
    from llm_inference.presets import PRESETS

    shape = PRESETS[PRESET]
    head_dim = shape.hidden_size // shape.num_attention_heads
    kv_heads, groups = shape.num_key_value_heads, shape.num_attention_heads // shape.num_key_value_heads
    cache = torch.randn(2, rows, kv_heads, positions, head_dim, device="cuda", dtype=torch.bfloat16)
    query = torch.randn(rows, kv_heads, groups, head_dim, device="cuda", dtype=torch.bfloat16)
    first = torch.zeros(rows, dtype=torch.long, device="cuda")
    last = torch.full((rows,), positions - 1, dtype=torch.long, device="cuda")
    kv_bytes = cache.numel() * cache.element_size()

    def attend() -> torch.Tensor:
        return decode_attention.split_decode_attention(query, cache[0], cache[1], first, last, positions, sms)

    module = (decode_attention.SPLIT_BLOCK, decode_attention.PIECE_WARPS, decode_attention.PIECE_STAGES)
    reference = attend()
    measured = []
    try:
        for setting in [module, *[s for s in settings if s != module]]:
            row: dict[str, Any] = {"rows": rows, "setting": "x".join(map(str, setting)),
                                   "module's": setting == module}
            (decode_attention.SPLIT_BLOCK, decode_attention.PIECE_WARPS, decode_attention.PIECE_STAGES) = setting
            try:
                error = (attend() - reference).abs().max().item()
                if not error <= 1e-2:  # NaN too: a setting that computes something else is not a candidate
                    row["status"] = f"WRONG: max |difference| {error:.3g} from the module's setting"
                else:
                    ms = queued_seconds(attend, REPEATS, WARMUP) * 1e3
                    row.update({"status": "OK", "ms": ms, "K/V GB/s": kv_bytes / ms / 1e6,
                                "of copy rate": kv_bytes / ms * 1e3 / copy})
            except Exception as exc:  # a setting Triton refuses (shared memory, registers): a row says so
                row["status"] = f"failed: {type(exc).__name__}: {' '.join(str(exc).splitlines()[:1])[:160]}"
            measured.append(row)
            print("ATTENTION", row, flush=True)
    finally:
        (decode_attention.SPLIT_BLOCK, decode_attention.PIECE_WARPS, decode_attention.PIECE_STAGES) = module
    return measured


def step_row(rows: int, gemm_rows: list[dict[str, Any]], attention_rows: list[dict[str, Any]], layers: int
             ) -> dict[str, Any]:
    """The step counted from its parts: each GEMM times its calls, attention (one layer's) times the layers."""
    gemm = sum(r["ms"] * r["calls"] for r in gemm_rows)
    floor = sum(r["ms"] * r["of reference"] * r["calls"] for r in gemm_rows)
    timed = [r for r in attention_rows if r["status"] == "OK"]
    own = next((r for r in timed if r["module's"]), None)
    best = min(timed, key=lambda r: r["ms"], default=None)
    return {"rows": rows, "GEMMs ms": gemm, "GEMMs ms at reference rate": floor,
            "attention ms (module's setting)": own["ms"] * layers if own else None,
            "attention ms at copy rate": own["ms"] * own["of copy rate"] * layers if own else None,
            "best setting": best["setting"] if best else None,
            "attention ms (best)": best["ms"] * layers if best else None,
            "sum ms": gemm + own["ms"] * layers if own else None}


def tables(copy: float | None, gemm_rows: list[dict[str, Any]], attention_rows: list[dict[str, Any]],
           steps: list[dict[str, Any]], device: str) -> str:
    rate = "n/a" if copy is None else f"{copy / 1e9:,.0f} GB/s"
    return (f"{PRESET} decode step parts on {device}; copy rate {rate}\n\n"
            f"GEMMs (F.linear)\n\n{markdown_table(gemm_rows, GEMM_HEADER, digits=4)}\n\n"
            f"Split decode attention, one layer\n\n{markdown_table(attention_rows, ATTENTION_HEADER, digits=4)}\n\n"
            f"The step from its parts\n\n{markdown_table(steps, STEP_HEADER, digits=4)}\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default="512,256", help="decode rows, comma-separated")
    parser.add_argument("--positions", type=int, default=384,
                        help="cache positions each row attends to (chat's ≈ 356 filled at batch 512, rounded up)")
    parser.add_argument("--settings", default=",".join(f"{b}x{w}x{s}" for b in (32, 64, 128) for w in (4, 8)
                                                       for s in (2, 3, 4)),
                        help="attention launch settings BLOCKxWARPSxSTAGES, comma-separated")
    parser.add_argument("--autotune", action="store_true",
                        help="also each GEMM at the step's rows compiled with inductor's max-autotune (minutes)")
    parser.add_argument("--out", default="decode_parts_out")
    args = parser.parse_args()
    settings = parse_settings(args.settings)
    row_counts = [int(r) for r in args.rows.split(",")]
    import torch

    from jpwr import ValidationError
    from llm_inference.presets import PRESETS

    if not torch.cuda.is_available():
        raise ValidationError("no CUDA GPU here: the step's parts are timed on one", "run it on a GPU machine")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    device = torch.cuda.get_device_name(0)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    copy = copy_rate()
    torch.cuda.empty_cache()
    gemm_rows: list[dict[str, Any]] = []
    attention_rows: list[dict[str, Any]] = []
    steps: list[dict[str, Any]] = []
    for rows in row_counts:
        these_gemms = measure_gemms(rows, args.autotune)
        these_attention = measure_attention(rows, args.positions, settings, sms, copy)
        torch.cuda.empty_cache()
        gemm_rows += these_gemms
        attention_rows += these_attention
        steps.append(step_row(rows, these_gemms, these_attention, PRESETS[PRESET].num_layers))
        markdown = tables(copy, gemm_rows, attention_rows, steps, device)
        write_results(out, markdown, {"device": device, "copy_bytes_per_s": copy, "positions": args.positions,
                                      "gemms": gemm_rows, "attention": attention_rows, "steps": steps})
    print(markdown)
    # a launch setting Triton refuses is a row of the sweep; the module's own and every GEMM must run
    return exit_status(gemm_rows + [r for r in attention_rows if r["module's"]])


if __name__ == "__main__":
    sys.exit(exit_code_of("benchmarks/decode_parts_h100.py", main, torch_extra="inference"))
