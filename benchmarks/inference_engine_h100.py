#!/usr/bin/env python3
"""Engine `hf` vs engine `static` on one GPU: ms/token, J/token, GPU utilisation; bf16 logits vs transformers.

Run from the repository root on a GPU machine (torch, transformers, nvidia-ml-py), in one go (~8 min on an H100):

    python benchmarks/inference_engine_h100.py --out-dir $OUT/engine
    python benchmarks/inference_engine_h100.py --presets llama-1b --batch-sizes 1,8 --out-dir /tmp/e   # quick check
    python benchmarks/inference_engine_h100.py --presets tiny --batch-sizes 1,2 --device cpu --out-dir /tmp/e
        # smoke test of the script itself (fp32; metered by whatever sensor jpwr finds: energy n/a, with the
        # reason, where there is none)

1. Logits check, per preset (a child process): the static engine's bf16 logits against the transformers
   model it took its weights from (the prompt's last position, and one decode step), and the greedy
   tokens of both engines for the same left-padded prompts; then each `--decode-tunings` variant's first
   decode step at batch 1 (where `fused` runs its kernels), which must stay within VARIANT_BOUND × transformers'
   own bf16 deviation (the script exits 1 where one does not).
2. Per preset and engine one `python -m llm_inference run --engine E` process over the batch sizes
   (`max`: the largest power of two that both engines' memory estimates allow on this GPU), task chat,
   in-process NVML metering (`--energy-methods`; on `--device cpu` `auto`). Every point writes
   <out-dir>/<preset>/<engine>/chat_bs<N>/run_record.json.

J/output token is ML.ENERGY's definition (the steady window's energy over its output tokens, prefill
included); decode J/token is the project's (steady minus prefill energy over decode tokens). Random
weights, synthetic lengths and static batches: ML.ENERGY's figures are vLLM serving real requests.
A point that fails is a row with its error; the sweep goes on. results.md / results.json in --out-dir.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.common import exit_status, first_gpus_env, markdown_table, write_results  # noqa: E402 (on sys.path)
from joulebench.analysis.text_width import fitted  # noqa: E402
from joulebench.boundary import exit_code_of  # noqa: E402
from joulebench.bounded_run import run_bounded  # noqa: E402

TASK = "chat"
COLUMNS = [
    ("preset", None), ("batch", None), ("engine", None), ("status", None), ("energy", None),
    ("ms/token", "per_token_latency_median_s"), ("TTFT ms", "ttft_median_s"), ("tokens/s", "output_tokens_per_s"),
    ("J/output token", "energy_per_output_token_j"), ("±", "energy_per_output_token_error_bound_j"),
    ("decode J/token", "decode_energy_per_token_j"), ("±decode", "decode_energy_per_token_error_bound_j"),
    ("tokens/Wh", "output_tokens_per_wh"), ("W", "mean_power_w"), ("GPU util %", "utilization_gpu"),
    ("SM MHz", "sm_clock_mhz"), ("setup s", "engine_setup_s"), ("peak GiB", "peak_memory_allocated_gib"),
    ("estimate GiB", "memory_estimate_gib"),
]
SHORT = ["preset", "batch", "engine", "status", "energy", "ms/token", "J/output token", "decode J/token", "GPU util %"]
MILLISECONDS = {"per_token_latency_median_s", "ttft_median_s"}
CHECK_COLUMNS = ["preset", "status", "where", "max |Δ|", "max |logit|", "max |Δ| / max |logit|", "cosine",
                 "argmax agree", "tokens equal", "first divergence", "bound"]
# A decode variant's batch-1 logits pass where their max |Δ| from the fp32 reference is at most this many times
# transformers' own bf16 max |Δ| on the same prompt (the static engine's default path measured 0.95× at llama-8b,
# docs/perf-notes.md; the fused kernels round less often, so they should not need the margin).
VARIANT_BOUND = 1.25
FP32_FLOOR = 1e-5  # of the largest logit: in fp32 (the CPU smoke test) transformers is the reference, Δ = 0


def check_logits(preset: str, seed: int, device_name: str, variants: list[str]) -> dict[str, Any]:
    """The static engine against the transformers model it came from (runs in a child process).

    bf16 on a GPU: both engines' logits are compared with the same weights upcast to fp32 (the reference),
    so the static engine's deviation reads against transformers' own bf16 deviation; then the greedy tokens
    of both engines (informational: with random weights near-ties are common and bf16 rounding flips them).
    Each of `variants` (a `--decode-tuning` value) then computes the first decode step of one prompt at batch 1,
    where the fused variant runs its own kernels: it passes where its max |Δ| from fp32 is at most
    VARIANT_BOUND × transformers' bf16 one on the same prompt (FP32_FLOOR of the largest logit at least).
    """
    import torch

    from llm_inference.engine import build_model, make_inputs
    from llm_inference.hf_engine import HFEngine
    from llm_inference.presets import PRESETS
    from llm_inference.static_engine import StaticEngine, attended_length
    from llm_inference.tasks import Batch

    device = torch.device(device_name)
    cuda = device.type == "cuda"
    shape = PRESETS[preset]
    model = build_model(shape, None, "bf16" if cuda else "fp32", "sdpa", device, seed)
    engine = StaticEngine.from_transformers(model, device)
    batch = Batch((37, 120, 64, 120), 32)  # left padding in three rows
    inputs = make_inputs(batch, shape.vocab_size, seed, device)
    width = batch.padded_length

    def transformers_logits(inputs: dict[str, torch.Tensor], first: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Last-position logits of the prompt and of the prompt plus `first` (one decode step)."""
        ones = torch.ones_like(first)[:, None]
        step = model(input_ids=torch.cat([inputs["input_ids"], first[:, None]], 1),
                     attention_mask=torch.cat([inputs["attention_mask"], ones], 1),
                     position_ids=torch.cat([inputs["position_ids"], inputs["position_ids"][:, -1:] + 1], 1),
                     logits_to_keep=1).logits[:, -1]
        return model(**inputs, logits_to_keep=1).logits[:, -1].float(), step.float()

    def variant_steps() -> tuple[dict[str, Any], torch.Tensor]:
        """Each variant's first decode step of one prompt at batch 1 (or why it was not run), and that token."""
        steps: dict[str, Any] = {}
        for variant in variants:
            engine = StaticEngine.from_transformers(model, device, variant)
            detail = engine.fused_detail  # the record's `decode_fused`
            if detail is not None and not detail.startswith("fused"):
                steps[variant] = f"not run: {detail}"  # the fused variant's kernels cannot run here
                continue
            state, prefill = engine.prefill_logits(single)
            state.tokens.copy_(prefill.argmax(-1))
            steps[variant] = engine.decode_logits(state, attended_length(one.padded_length + 1))
            del engine, state
        return steps, prefill.argmax(-1)

    def compare(name: str, mine: torch.Tensor, ref: torch.Tensor) -> dict[str, Any]:
        mine, ref = mine.float(), ref.float()
        return {"where": name, "max |Δ|": (mine - ref).abs().max().item(), "max |logit|": ref.abs().max().item(),
                "max |Δ| / max |logit|": ((mine - ref).abs().max() / ref.abs().max()).item(),
                "cosine": torch.nn.functional.cosine_similarity(mine, ref, dim=-1).min().item(),
                "argmax agree": (mine.argmax(-1) == ref.argmax(-1)).float().mean().item()}

    one = Batch((120,), 2)
    single = make_inputs(one, shape.vocab_size, seed + 1, device)
    with torch.inference_mode():
        state, prefill = engine.prefill_logits(inputs)
        first = prefill.argmax(-1)
        state.tokens.copy_(first)
        step = engine.decode_logits(state, attended_length(width + 1))
        hf_prefill, hf_step = transformers_logits(inputs, first)
        engine.prepare([batch])
        static_tokens = engine.generate(inputs, batch.output_length)
        hf_tokens = HFEngine(model, device).generate(inputs, batch.output_length)
        del engine, state
        steps, single_first = variant_steps()
        hf_single = transformers_logits(single, single_first)[1]
        model.float()  # the reference: the same weights in fp32 (in place, so the GPU holds one copy)
        ref_prefill, ref_step = transformers_logits(inputs, first)
        ref_single = transformers_logits(single, single_first)[1]
    equal = static_tokens == hf_tokens
    divergence = [int(row.logical_not().nonzero()[0]) if not row.all() else None for row in equal]
    rows = [compare("prefill: static vs fp32", prefill, ref_prefill),
            compare("prefill: hf vs fp32", hf_prefill, ref_prefill),
            compare("decode step 1: static vs fp32", step, ref_step),
            compare("decode step 1: hf vs fp32", hf_step, ref_step),
            compare("decode step 1: static vs hf", step, hf_step),
            {"where": f"greedy {batch.output_length} tokens: static (CUDA graphs) vs hf",
             "tokens equal": equal.float().mean().item(), "first divergence": str(divergence)},
            hf_row := compare("batch 1, decode step 1: hf vs fp32", hf_single, ref_single)]
    for variant, logits in steps.items():
        where = f"batch 1, decode step 1: static --decode-tuning {variant} vs fp32"
        if isinstance(logits, str):
            rows.append({"where": where, "bound": logits})
            continue
        row = compare(where, logits, ref_single)
        limit = max(VARIANT_BOUND * hf_row["max |Δ|"], FP32_FLOOR * row["max |logit|"])
        rows.append({**row, "bound": f"{'pass' if row['max |Δ|'] <= limit else 'FAILED'}: ≤ {limit:.4g}"})
    return {"device_memory_gib": torch.cuda.get_device_properties(0).total_memory / 1024**3 if cuda else None,
            "precision": "bf16" if cuda else "fp32", "rows": rows}


def run_child_check(preset: str, args: argparse.Namespace, env: dict[str, str]) -> dict[str, Any]:
    out = Path(args.out_dir) / f"logits_{preset}.json"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--check-logits", preset, "--out-dir", args.out_dir,
           "--device", args.device, "--decode-tunings", args.decode_tunings]
    code = run_bounded(cmd, args.check_timeout_s, cwd=REPO, env=env)
    if out.is_file():
        return json.loads(out.read_text())
    return {"error": f"logits check exited {code} without a result"}


def max_batch(preset: str, memory_gib: float, seed: int) -> int:
    """Largest power of two both engines' estimates allow for the chat task, sized by the batch `run` will draw
    (what `validate` accepts)."""
    from llm_inference import memory
    from llm_inference.presets import PRESETS
    from llm_inference.tasks import TASKS, batches_extent, draw_batches

    def estimate_gib(size: int, engine: str) -> float:
        extent = batches_extent(draw_batches(TASKS[TASK], size, 1, seed))
        return memory.estimate_memory(PRESETS[preset], "bf16", size, *extent, engine).total_gib

    return min(memory.largest_fitting_batch(functools.partial(estimate_gib, engine=engine), memory_gib)
               for engine in memory.ENGINES)


def run_engine(preset: str, engine: str, sizes: list[int], args: argparse.Namespace, env: dict[str, str]) -> int | str:
    run_dir = Path(args.out_dir) / preset / engine
    cmd = [sys.executable, "-m", "llm_inference", "run", "--preset", preset, "--engine", engine, "--task", TASK,
           "--batch-sizes", ",".join(map(str, sizes)), "--num-batches", "1",
           "--steady-seconds", str(args.steady_seconds), "--energy-methods", args.energy_methods,
           "--device", args.device,
           "--out-dir", str(run_dir), "--run-id", f"{args.tag}-{preset}-{engine}"]
    print(fitted([f"=== {preset} {engine}: {' '.join(cmd)}"]), flush=True)
    started = time.monotonic()
    code = run_bounded(cmd, args.timeout_s, cwd=REPO, env=env)
    print(f"=== {preset} {engine}: exit {code} after {time.monotonic() - started:.0f} s", flush=True)
    return code


def point_row(preset: str, engine: str, size: int, exit_code: int | str, run_dir: Path) -> dict[str, Any]:
    row: dict[str, Any] = {"preset": preset, "batch": size, "engine": engine}
    path = run_dir / f"{TASK}_bs{size}" / "run_record.json"
    if not path.is_file():  # a run of one point writes into --out-dir itself (llm_inference.runner)
        single = run_dir / "run_record.json"
        path = single if single.is_file() and json.loads(single.read_text())["config"].get("batch_size") == size \
            else path
    if not path.is_file():
        return {**row, "status": f"no record (exit {exit_code})"}
    record = json.loads(path.read_text())
    metrics = record.get("metrics", {})
    status = record["status"]
    row["status"] = status if status == "OK" else f"{status}: {record.get('status_reason')}"
    for label, key in COLUMNS:
        if key:
            value = metrics.get(key)
            row[label] = value * 1e3 if key in MILLISECONDS and value is not None else value
    if row.get("GPU util %") is not None:
        row["GPU util %"] = 100 * row["GPU util %"]
    row["energy"] = metrics.get("energy_method") or "n/a"
    row["energy_unavailable_reason"] = steady_energy_reason(record)
    row["device"] = record.get("hardware", {}).get("device_name")
    row["precision"] = record.get("config", {}).get("precision")
    row["engine_detail"] = record.get("config", {}).get("engine_detail")
    return row


def steady_energy_reason(record: dict[str, Any]) -> str | None:
    """Why the steady window has no energy (no sensor on a CPU machine), or None where it has one."""
    for window in record.get("windows", []):
        if window.get("name") == "steady" and (window.get("energy") or {}).get("energy_j") is None:
            return (window.get("energy") or {}).get("unavailable_reason") or "not metered"
    return None


def energy_notes(rows: list[dict[str, Any]]) -> str:
    """One line per distinct reason a point's energy is n/a (a row OK without a sensor says why here)."""
    reasons = sorted({str(r["energy_unavailable_reason"]) for r in rows if r.get("energy_unavailable_reason")})
    return "".join(f"\nEnergy n/a: {reason}\n" for reason in reasons)


def write_tables(out_dir: Path, rows: list[dict[str, Any]], checks: list[dict[str, Any]]) -> str:
    """results.md (every column of every point, then the logits check) and results.json, written whole after each
    engine's points and at the end (benchmarks.common.write_results); returns the heading."""
    devices = sorted({str(r.get("device")) for r in rows if r.get("device")})
    precisions = sorted({str(r.get("precision")) for r in rows if r.get("precision")})
    heading = (f"llm_inference engines on {', '.join(devices) or 'n/a'}, task {TASK}, "
               f"{', '.join(precisions) or 'n/a'}, random weights, static batches; J/output token = steady-window "
               "energy / output tokens (ML.ENERGY's definition, prefill included); decode J/token = (steady − "
               "prefill energy) / decode tokens")
    text = (f"{heading}\n\n{markdown_table(rows, [label for label, _ in COLUMNS], digits=4)}\n{energy_notes(rows)}\n"
            "Logits: static engine and transformers (bf16) against the same weights in fp32:\n\n"
            f"{markdown_table(checks, CHECK_COLUMNS, digits=4)}\n")
    write_results(out_dir, text, {"logits": checks, "points": rows})
    return heading


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--presets", default="llama-1b,llama-8b")
    parser.add_argument("--engines", default="hf,static")
    parser.add_argument("--batch-sizes", default="1,8,64,max", help="'max': largest power of two both engines fit")
    parser.add_argument("--steady-seconds", type=float, default=2.0,
                        help="prefill and steady window length per point (short: 16 points fit in ~8 min; the "
                             "records carry each window's energy bound)")
    parser.add_argument("--timeout-s", type=float, default=150, help="per (preset, engine) process")
    parser.add_argument("--check-timeout-s", type=float, default=240,
                        help="the logits check's child (each --decode-tunings variant compiles its own step)")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--device", default="cuda", help="cpu only for a smoke test of this script (preset tiny)")
    parser.add_argument("--energy-methods", help="the points' in-process meter (default: nvml; auto on --device cpu, "
                        "where a machine without a sensor gives energy n/a with the reason)")
    parser.add_argument("--out-dir", default="inference_engine_out")
    parser.add_argument("--tag", default=time.strftime("eng%Y%m%dT%H%M%S"))
    parser.add_argument("--decode-tunings", default="default,fused",
                        help="decode variants whose batch-1 first step the logits check compares with fp32 (each "
                             f"within {VARIANT_BOUND}× transformers' bf16 deviation; 'not run' where one cannot run)")
    parser.add_argument("--check-logits", metavar="PRESET", help=argparse.SUPPRESS)  # the child's job
    args = parser.parse_args()
    args.energy_methods = args.energy_methods or ("auto" if args.device == "cpu" else "nvml")
    out_dir = Path(args.out_dir).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    args.out_dir = str(out_dir)
    if args.check_logits:
        result = check_logits(args.check_logits, args.seed, args.device, args.decode_tunings.split(","))
        (out_dir / f"logits_{args.check_logits}.json").write_text(json.dumps(result, indent=2) + "\n")
        return 0
    path = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    env = first_gpus_env(1, {**os.environ, "PYTHONPATH": path})
    presets = [p.strip() for p in args.presets.split(",") if p.strip()]
    checks, rows = [], []
    for preset in presets:
        check = run_child_check(preset, args, env)
        memory_gib = check.get("device_memory_gib")
        for item in check.get("rows", [{"where": "-"}]):
            failed = str(item.get("bound", "")).startswith("FAILED")
            checks.append({"preset": preset, "status": "FAILED" if failed else check.get("error", "ok"), **item})
        sizes = []
        for text in args.batch_sizes.split(","):
            if text == "max":
                if memory_gib is None:
                    rows.append({"preset": preset, "batch": "max",
                                 "status": "device memory unknown (CPU, or the logits check failed)"})
                    continue
                sizes.append(max_batch(preset, memory_gib, args.seed))
            else:
                sizes.append(int(text))
        sizes = sorted(set(sizes))
        for engine in args.engines.split(","):
            code = run_engine(preset, engine, sizes, args, env)
            rows += [point_row(preset, engine, size, code, out_dir / preset / engine) for size in sizes]
            write_tables(out_dir, rows, checks)
    rows.sort(key=lambda r: (str(r["preset"]), r["batch"] if isinstance(r["batch"], int) else 1 << 30,
                             str(r.get("engine"))))
    heading = write_tables(out_dir, rows, checks)
    # on the terminal within 160 columns: every column of every point is in results.md (a row of them is 199 wide)
    print(f"\n{fitted([heading])}\n{markdown_table(rows, SHORT, digits=4)}{fitted(energy_notes(rows).split(chr(10)))}\n"
          f"Logits: static engine and transformers (bf16) against the same weights in fp32:\n\n"
          f"{markdown_table(checks, CHECK_COLUMNS, digits=4)}\nevery column: {out_dir / 'results.md'}")
    return exit_status(rows) or int(any(c["status"] == "FAILED" for c in checks))


if __name__ == "__main__":  # a missing extra (the logits check's torch, transformers) is one line, as the driver's
    sys.exit(exit_code_of("benchmarks/inference_engine_h100.py", main, torch_extra="inference"))
