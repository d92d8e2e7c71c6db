#!/usr/bin/env python3
"""Issue 59 on one GPU: the fused decode GEMVs (llm_inference/fused_decode.py) of llama-1b and llama-8b against
cuBLAS, in GB/s of weights read, for a few block settings; no meter (this picks the module's constants, the
metered runs are benchmarks/perf33_h100.py's).

    python3 benchmarks/fused_gemv_h100.py --out $OUT/gemv
    python3 benchmarks/fused_gemv_h100.py --presets llama-1b --configs 2x4096,4x4096,2x8192 --out /tmp/g

Per preset, each GEMV form of a layer and the LM head (the Q/K/V kernel reads its matrix as the gate/up form does,
two rows per lane): the fused kernel (its RMSNorm, SiLU·up or residual inside) and F.linear on the same matrix (the
compiled path's GEMV alone; its norm and epilogue are further kernels there, not counted). Each is captured
REPEATS times in one CUDA graph over enough copies of the matrix that no copy stays in L2 between its reads, and
replayed; time by CUDA events, GB/s = the matrix's bytes / the mean call. A config is PROGRAMS_PER_SM x TILE, set
on the module for its rows. Then, per preset, a whole fused decode step (llm_inference.fused_decode.decode_pass,
random weights, one row attending to PASS_POSITIONS positions) with programmatic dependent launch off and on
(fused_decode.PDL), at the module's own block settings: REPEATS steps in one graph, ms per step. Writes results.md /
results.json under --out.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.common import exit_status, markdown_table, weight_copies, write_results  # noqa: E402
from joulebench.boundary import exit_code_of  # noqa: E402

REPEATS = 50
HEADER = ("preset", "gemv", "shape", "config", "status", "fused µs", "fused GB/s", "cuBLAS µs", "cuBLAS GB/s")
PASS_HEADER = ("preset", "step", "PDL", "status", "ms per step", "weights GB/s")
PASS_POSITIONS = 384  # the static engine's cache at batch 1 in chat (docs/BENCHMARKS.md): attended positions


def forms(preset: str) -> list[tuple[str, int, int, dict[str, bool]]]:
    """(name, rows, input size, fused options) of each GEMV of one decode step of the preset."""
    from llm_inference.presets import PRESETS

    shape = PRESETS[preset]
    hidden, inner = shape.hidden_size, shape.intermediate_size
    return [("out + residual", hidden, hidden, {"residual": True}),
            ("norm + gate/up + SiLU·up", 2 * inner, hidden, {"norm": True, "glu": True}),
            ("down + residual", hidden, inner, {"residual": True}),
            ("norm + LM head", shape.vocab_size, hidden, {"norm": True})]


def timed_us(call: Any, copies: int) -> float:
    """Mean µs of `call(i)` over REPEATS calls cycling through `copies`, replayed from one CUDA graph."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        call(0)  # compiles (Triton) and picks (cuBLAS) outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for index in range(REPEATS):
            call(index % copies)
    graph.replay()
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    graph.replay()
    end.record()
    end.synchronize()
    return begin.elapsed_time(end) * 1e3 / REPEATS


def measure(preset: str, configs: list[tuple[int, int]]) -> list[dict[str, Any]]:
    import torch

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    for form in forms(preset):
        rows += measure_form(preset, *form, configs, sms)
        torch.cuda.empty_cache()  # this form's copies are gone: the next one's fit
    return rows


def measure_form(preset: str, name: str, rows: int, size: int, options: dict[str, bool],
                 configs: list[tuple[int, int]], sms: int) -> list[dict[str, Any]]:
    """One GEMV form: cuBLAS once, the fused kernel per config."""
    import torch
    import torch.nn.functional as F

    from llm_inference import fused_decode

    nbytes = rows * size * 2
    weights = weight_copies(rows, size)
    copies = len(weights)
    x = torch.randn(size, device="cuda", dtype=torch.bfloat16)
    norm = torch.ones(size, device="cuda", dtype=torch.bfloat16) if options.get("norm") else None
    glu = bool(options.get("glu"))
    residual = (torch.randn(rows // 2 if glu else rows, device="cuda", dtype=torch.bfloat16)
                if options.get("residual") else None)
    cublas_us = timed_us(lambda i: F.linear(x, weights[i]), copies)
    measured = []
    module_settings = fused_decode.PROGRAMS_PER_SM, fused_decode.TILE
    try:
        for programs, tile in configs:
            fused_decode.PROGRAMS_PER_SM, fused_decode.TILE = programs, tile
            fused_us = timed_us(lambda i: fused_decode.gemv(x, weights[i], sms, norm=norm, eps=1e-5,
                                                            residual=residual, glu=glu), copies)
            measured.append({"preset": preset, "gemv": name, "shape": f"{rows}x{size}",
                             "config": f"{programs}x{tile}", "status": "OK", "fused µs": fused_us,
                             "fused GB/s": nbytes / fused_us / 1e3, "cuBLAS µs": cublas_us,
                             "cuBLAS GB/s": nbytes / cublas_us / 1e3})
            print("GEMV " + json.dumps(measured[-1]), flush=True)
    finally:  # the whole steps below run at the module's own settings
        fused_decode.PROGRAMS_PER_SM, fused_decode.TILE = module_settings
    return measured


def measure_passes(preset: str) -> list[dict[str, Any]]:
    """One preset's fused decode step, PDL off and on (the module's other constants as they stand)."""
    import torch

    from llm_inference import fused_decode
    from llm_inference.compact_model import CompactModel
    from llm_inference.engine import build_model
    from llm_inference.kv_cache import KVCache
    from llm_inference.presets import PRESETS

    device = torch.device("cuda")
    model = CompactModel.from_transformers(build_model(PRESETS[preset], None, "bf16", "sdpa", device, 0))
    # what a step streams: every layer's matrices and the LM head (the embedding: one row)
    weight_bytes = model.lm_head.nbytes + sum(layer.qkv.weight.nbytes + layer.out.weight.nbytes
                                              + layer.up.weight.nbytes + layer.down.weight.nbytes
                                              for layer in model.layers)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    cache = KVCache.independent(model, 1, PASS_POSITIONS, device)
    cache.occupy(torch.tensor([0], device=device), torch.tensor([PASS_POSITIONS - 1], device=device))
    rope = model.rope_tables(PASS_POSITIONS, model.embed.dtype)
    assert rope is not None  # a Llama preset
    tokens = torch.tensor([1], device=device)
    rows: list[dict[str, Any]] = []
    module_pdl = fused_decode.PDL
    try:
        for pdl in (False, True):
            fused_decode.PDL = pdl
            row: dict[str, Any] = {"preset": preset, "step": "fused decode_pass, batch 1",
                                   "PDL": "on" if pdl else "off"}
            try:
                ms = timed_us(lambda _: fused_decode.decode_pass(model, cache, tokens, rope, PASS_POSITIONS, sms),
                              1) / 1e3
                row.update({"status": "OK", "ms per step": ms, "weights GB/s": weight_bytes / ms / 1e6})
            except (RuntimeError, ValueError) as exc:  # e.g. a capture that refuses dependent launches: a row says so
                row["status"] = f"failed: {type(exc).__name__}: {' '.join(str(exc).splitlines()[:1])}"
            rows.append(row)
            print("PASS " + json.dumps(row), flush=True)
    finally:
        fused_decode.PDL = module_pdl
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--presets", default="llama-1b,llama-8b")
    parser.add_argument("--configs", default="2x4096,4x4096,1x4096,2x8192",
                        help="PROGRAMS_PER_SM x TILE settings of llm_inference/fused_decode.py, comma-separated")
    parser.add_argument("--out", default="fused_gemv_out")
    parser.add_argument("--no-passes", dest="passes", action="store_false",
                        help="only the GEMVs: leave out the whole decode steps with PDL off and on")
    args = parser.parse_args()
    import torch

    from jpwr import ValidationError

    if not torch.cuda.is_available():
        raise ValidationError("no CUDA GPU here: the fused kernels and cuBLAS are timed on one",
                              "run it on a GPU machine")
    configs = [(int(a), int(b)) for a, b in (item.split("x") for item in args.configs.split(","))]
    presets = args.presets.split(",")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = [row for preset in presets for row in measure(preset, configs)]
    write_tables(out, rows, [])  # kept should a whole step end the process
    torch.cuda.empty_cache()
    passes = [row for preset in presets for row in measure_passes(preset)] if args.passes else []
    print(write_tables(out, rows, passes))
    return exit_status(rows + passes)


def write_tables(out: Path, rows: list[dict[str, Any]], passes: list[dict[str, Any]]) -> str:
    """results.md and results.json under `out` (benchmarks.common.write_results); returns the tables."""
    import torch

    tables = markdown_table(rows, HEADER, digits=4)
    if passes:
        tables += "\n\nWhole steps (weights GB/s: the step's matrices over the whole step, attention and gaps " \
                  "included)\n\n" + markdown_table(passes, PASS_HEADER, digits=4)
    write_results(out, f"Fused decode GEMVs vs cuBLAS on {torch.cuda.get_device_name(0)}\n\n{tables}\n",
                  {"gemv": rows, "passes": passes})
    return tables


if __name__ == "__main__":
    sys.exit(exit_code_of("benchmarks/fused_gemv_h100.py", main, torch_extra="inference"))
