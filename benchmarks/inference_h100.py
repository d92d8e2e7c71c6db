#!/usr/bin/env python3
"""LLM inference on one GPU: presets × tasks × batch sizes, metered in-process by jpwr; prints one table.

Run from the repository root on a GPU machine with torch and transformers installed:

    python benchmarks/inference_h100.py --out-dir $OUT/inference            # ~1B and ~8B, chat + summarization, 1-64
    python benchmarks/inference_h100.py --presets llama-1b --batch-sizes 1,8 --out-dir /tmp/inf   # quick check

Each preset is one `python -m llm_inference run` process (model built once, random weights) that
sweeps tasks and batch sizes; every point writes <out-dir>/<preset>/<task>_bs<N>/run_record.json
with its jpwr trace beside it (in-process NVML metering, so `joulebench report <out-dir> -o ...` finds the
latent metrics). Throughput and energy come from the same steady window (full generations, warm-up
excluded); decode J/token subtracts the prefill window's energy. results.md/results.json in --out-dir.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.common import exit_status, markdown_table, write_results  # noqa: E402 (the repository on sys.path)
from joulebench.bounded_run import run_bounded  # noqa: E402

COLUMNS = [
    ("preset", None), ("task", None), ("batch", "batch_size"), ("status", None),
    ("tokens/s", "output_tokens_per_s"), ("req/s", "requests_per_s"),
    ("J/token", "energy_per_output_token_j"), ("±J/token", "energy_per_output_token_error_bound_j"),
    ("decode J/token", "decode_energy_per_token_j"), ("±decode", "decode_energy_per_token_error_bound_j"),
    ("prefill J/input token", "prefill_energy_per_input_token_j"), ("tokens/Wh", "output_tokens_per_wh"),
    ("W", "mean_power_w"), ("GPU util", "utilization_gpu"), ("SM MHz", "sm_clock_mhz"),
    ("TTFT ms", "ttft_median_s"), ("ms/token", "per_token_latency_median_s"), ("MFU", "mfu"),
    ("peak mem GiB", "peak_memory_allocated_gib"), ("method", "energy_method"),
]
MILLISECONDS = {"ttft_median_s", "per_token_latency_median_s"}


def command(preset: str, args: argparse.Namespace, run_dir: Path) -> list[str]:
    return [sys.executable, "-m", "llm_inference", "run", "--preset", preset, "--task", args.tasks,
            "--batch-sizes", args.batch_sizes, "--num-batches", str(args.num_batches),
            "--min-window-s", str(args.min_window_s), "--device", args.device, "--energy-methods", args.energy_methods,
            "--out-dir", str(run_dir), "--run-id", f"{args.tag}-{preset}"]


def rows_of(preset: str, run_dir: Path, returncode: int | str) -> list[dict[str, object]]:
    paths = sorted(run_dir.glob("*/run_record.json"), key=lambda p: (p.parent.name.split("_bs")[0],
                                                                    int(p.parent.name.split("_bs")[1])))
    if not paths:
        return [{"preset": preset, "status": f"no record (exit {returncode})"}]
    rows = []
    for path in paths:
        record = json.loads(path.read_text())
        metrics = record.get("metrics", {})
        row: dict[str, object] = {"preset": preset, "task": record["config"]["task"], "status": record["status"]}
        for label, key in COLUMNS:
            if key:
                value = metrics.get(key)
                row[label] = value * 1e3 if key in MILLISECONDS and value is not None else value
        if row.get("GPU util") is not None:
            row["GPU util"] = 100 * row["GPU util"]  # type: ignore[operator]
        row["device"] = record.get("hardware", {}).get("device_name")
        row["precision"] = record["config"].get("precision")
        rows.append(row)
    return rows


def write_tables(out_dir: Path, rows: list[dict[str, object]]) -> tuple[str, str]:
    """results.md (a heading and the table) and results.json (the rows), written whole after each preset and at the
    end (benchmarks.common.write_results); returns the heading and the table."""
    text = markdown_table(rows, [label for label, _ in COLUMNS], digits=4)
    devices = sorted({str(r.get("device")) for r in rows if r.get("device")})
    precisions = sorted({str(r.get("precision")) for r in rows if r.get("precision")})
    heading = (f"llm_inference on {', '.join(devices) or 'n/a'}: random weights, {', '.join(precisions) or 'n/a'}, "
               "forced output lengths; "
               f"steady window = full generations (warm-up excluded); decode J/token = steady minus prefill window")
    write_results(out_dir, f"{heading}\n\n{text}\n", rows)
    return heading, text


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--presets", default="llama-1b,llama-8b")
    parser.add_argument("--tasks", default="chat,summarization")
    parser.add_argument("--batch-sizes", default="1,2,4,8,16,32,64")
    parser.add_argument("--num-batches", type=int, default=1, help="distinct batches per point (few: time)")
    parser.add_argument("--min-window-s", type=float, default=2.0)
    parser.add_argument("--energy-methods", default="nvml")
    parser.add_argument("--device", default="cuda", help="cpu only for a smoke test (--presets tiny --tasks tiny)")
    parser.add_argument("--out-dir", default="inference_bench_out")
    parser.add_argument("--timeout-s", type=float, default=360, help="per preset")
    parser.add_argument("--tag", default=time.strftime("inf%Y%m%dT%H%M%S"))
    args = parser.parse_args()
    out_dir = Path(args.out_dir).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    rows: list[dict[str, object]] = []
    for preset in [p.strip() for p in args.presets.split(",") if p.strip()]:
        run_dir = out_dir / preset
        cmd = command(preset, args, run_dir)
        print(f"=== {preset}: {' '.join(cmd)}", flush=True)
        started = time.monotonic()
        code = run_bounded(cmd, args.timeout_s, cwd=REPO, env=env)
        print(f"=== {preset}: exit {code} after {time.monotonic() - started:.0f} s", flush=True)
        rows += rows_of(preset, run_dir, code)
        write_tables(out_dir, rows)
    heading, text = write_tables(out_dir, rows)
    print(f"\n{heading}\n{text}")
    return exit_status(rows)


if __name__ == "__main__":
    sys.exit(main())
