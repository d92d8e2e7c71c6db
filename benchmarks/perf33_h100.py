#!/usr/bin/env python3
"""Issue 33 on one GPU: the baseline tree and the branch side by side, each figure with its energy, the
independent counter read of its window and the published anchor beside it.

    python benchmarks/perf33_h100.py --out $OUT/p33 --trees base=.perf-baseline,branch=. --runs llama-1b-bs1,llama-8b
    python benchmarks/perf33_h100.py --out /tmp/p --runs resnet50-readme -- --iterations 5   # after --: to every run

A tree is a checkout of this repository (the baseline: `git archive <commit>` unpacked in a directory); each run
starts the drivers of that tree (cwd and PYTHONPATH there), so both are measured by the same harness on the same
GPU in the same call. Inference runs meter in-process (NVML, one record per batch point), training runs under
`jpwr --methods nvml --` exactly as the README runs them. A thread of this process reads the GPU's energy counter
throughout (benchmarks.common.CounterPoller, no jpwr code); every record's steady window is compared with it.
Prints one `PERF33 {json}` line per window and writes results.md / results.json under --out.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.common import (  # noqa: E402
    CounterPoller,
    exit_status,
    first_gpu_uuid,
    first_gpus_env,
    markdown_table,
    split_at_double_dash,
    unless_given,
    write_results,
)
from joulebench.bounded_run import run_bounded  # noqa: E402

INFERENCE = ["-m", "llm_inference", "run", "--task", "chat", "--num-batches", "1", "--energy-methods", "nvml"]
README_RESNET = ["-m", "resnet50", "train", "--framework", "pytorch", "--global-batch-size", "256", "--precision",
                 "bf16"]
JPWR = ["-m", "jpwr", "--methods", "nvml", "--out", "{run}/jpwr", "--"]
RUNS: dict[str, list[str]] = {
    "llama-1b-bs1": [*INFERENCE, "--preset", "llama-1b", "--batch-sizes", "1"],
    "llama-8b-bs1": [*INFERENCE, "--preset", "llama-8b", "--batch-sizes", "1"],  # the default decode tuning (`auto`)
    "llama-8b-8-64": [*INFERENCE, "--preset", "llama-8b", "--batch-sizes", "8,64"],
    "llama-8b": [*INFERENCE, "--preset", "llama-8b", "--batch-sizes", "1,256"],
    "llama-8b-512": [*INFERENCE, "--preset", "llama-8b", "--batch-sizes", "512"],
    # batch 1 with each decode variant pinned: speed against power (a variant newer than the baseline: NAME@branch)
    **{f"llama-{size}-bs1-{tuning}": [*INFERENCE, "--preset", f"llama-{size}", "--batch-sizes", "1", "--decode-tuning",
                                      tuning] for size in ("1b", "8b")
       for tuning in ("default", "coordinate-descent", "fused")},
    "continuous-256": ["-m", "llm_inference", "load", "--preset", "llama-8b", "--task", "chat", "--energy-methods",
                       "nvml", "--rate", "max", "--max-concurrency", "256"],
    "resnet50-readme": [*JPWR, "{python}", *README_RESNET],
    # issue 58's lever: the README command with the batch norms (+ add + ReLU) in our Triton kernels
    "resnet50-readme-bn-triton": [*JPWR, "{python}", *README_RESNET, "--bn-kernels", "triton"],
    # ... and the 1x1 convolutions as our GEMM that measures their norms' statistics (no statistics pass for those)
    "resnet50-readme-bn-triton-conv": [*JPWR, "{python}", *README_RESNET, "--bn-kernels", "triton-conv"],
    "resnet50-gbs512": [*JPWR, "{python}", *README_RESNET[:-4], "--global-batch-size", "512", "--precision", "bf16"],
    "gpt-800m": [*JPWR, "{python}", "-m", "llm_training", "train", "--model", "800M"],
}
# The best public figure for the same work (issue 33's table), by the record's workload and point.
AnchorKey = tuple[str, int] | str  # (preset, batch or slots) of an inference record, else the workload
ANCHORS: dict[AnchorKey, str] = {
    ("llama-1b", 1): "< 1.0 ms/token (megakernel); SGLang ~1.4; target 1.20",
    ("llama-8b", 1): "weight-read limit 4.8 ms/token; target 6.0",
    ("llama-8b", 256): "ML.ENERGY vLLM 0.0766 J/token at 256",
    ("llama-8b", 512): "ML.ENERGY vLLM 0.0702 J/token at 512; target 0.068",
    "resnet50": "MLPerf Training v3.0 DGX H100 ~7,006 img/s/GPU; targets 6,000 (README) / 7,000 (best)",
    "llm_training": "49–51 % MFU (1–2B models); target 80,000 tokens/s",
}
HEADER = ("run", "tree", "status", "point", "figure", "energy", "bound %", "deviation %", "W", "steady s", "loss",
          "anchor")
# training losses compared at these iterations, where a run reached them: issue 58's accuracy check is the loss at
# steps 50, 100 and 200 against three baseline seeds (`-- --seed S`); GPT-800M's 20 s windows end before step 20
LOSS_AT = {"llm_training": (5, 10, 15, 20, 50, 100, 200), "resnet50": (50, 100, 200)}


def loss_at(record: dict[str, Any]) -> str:
    """The training loss at LOSS_AT's iterations the run reached ('it N: loss, ...'), so a lever that changes the
    numerics shows it."""
    m = record.get("metrics", {})
    workload = record.get("workload") or record.get("benchmark")
    points = dict([(p["iteration"], p["loss"]) for p in m.get("loss_curve") or []] if workload == "llm_training"
                  else [tuple(p) for p in m.get("losses") or []])
    return ", ".join(f"it {it}: {points[it]:.4f}" for it in LOSS_AT.get(str(workload), ()) if it in points)


def figures(record: dict[str, Any]) -> tuple[tuple[str, str, str], AnchorKey]:
    """(point, headline figure, energy figure) of one record, as text, and the anchor key."""
    m, config = record.get("metrics", {}), record.get("config", {})
    workload = record.get("workload") or record.get("benchmark")

    def num(key: str, fmt: str, scale: float = 1.0) -> str:
        value = m.get(key)
        return "n/a" if value is None else format(value * scale, fmt)

    if workload == "llm_inference":
        batch = config.get("batch_size") or config.get("max_concurrency")
        preset = config.get("preset")
        latency = (f"{num('per_token_latency_median_s', '.3f', 1e3)} ms/token" if "per_token_latency_median_s" in m
                   else f"TPOT p50 {num('tpot_p50_s', '.1f', 1e3)} ms")
        return (f"{preset} {'slots' if 'max_concurrency' in config else 'batch'} {batch}",
                f"{latency}, {num('output_tokens_per_s', ',.0f')} tokens/s",
                f"{num('energy_per_output_token_j', '.4f')} J/token"), (preset, batch)
    if workload == "resnet50":
        mode = (record.get("hardware", {}) or {}).get("compile_mode") or config.get("compile_mode")
        return (f"GBS {config.get('global_batch_size')}, {mode or 'n/a'}", f"{num('images_per_s', ',.0f')} img/s",
                f"{num('images_per_wh', ',.0f')} img/Wh"), "resnet50"
    return (f"MBS {config.get('micro_batch_size')}, GBS {config.get('global_batch_size')}",
            f"{num('tokens_per_s', ',.0f')} tokens/s, MFU {num('mfu', '.1%')}",
            f"{num('tokens_per_wh', ',.0f')} tokens/Wh"), "llm_training"


def run_one(name: str, tree_name: str, tree: Path, out: Path, uuid: str, poller: CounterPoller,
            args: argparse.Namespace) -> list[dict[str, Any]]:
    run_dir = out / tree_name / name
    run_dir.mkdir(parents=True, exist_ok=True)
    argv = [part.format(run=run_dir, python=sys.executable) for part in RUNS[name]]
    command = [sys.executable, *unless_given(argv, args.driver_args), "--out-dir", str(run_dir / "run")]
    pythonpath = os.pathsep.join([str(tree), os.environ.get("PYTHONPATH", "")])
    env = first_gpus_env(1, {**os.environ, "PYTHONPATH": pythonpath})
    env["CUDA_VISIBLE_DEVICES"] = uuid
    print(f"=== {tree_name} {name}: {' '.join(command)}", flush=True)
    started = time.monotonic()
    with open(run_dir / "log.txt", "w") as log:
        code = run_bounded(command, args.timeout_s, cwd=tree, env=env, stdout=log, stderr=subprocess.STDOUT)
    wall = time.monotonic() - started
    print(f"=== {tree_name} {name}: exit {code} after {wall:.0f} s", flush=True)
    rows = []
    for path in sorted(run_dir.rglob("run_record.json")):
        try:
            row = window_row(json.loads(path.read_text()), poller, uuid)
        except (ValueError, KeyError, TypeError, ZeroDivisionError) as exc:  # one bad record must not end the call
            row = {"status": f"record not compared: {type(exc).__name__}: {exc}"}
        if row is not None:
            rows.append({"run": name, "tree": tree_name, **row, "exit": code, "wall_s": wall,
                         "record": str(path.relative_to(out))})
    if not rows:
        rows.append({"run": name, "tree": tree_name, "status": f"no measured record (exit {code})", "wall_s": wall})
    for row in rows:
        print("PERF33 " + json.dumps(row), flush=True)
    return rows


def window_row(record: dict[str, Any], poller: CounterPoller, uuid: str) -> dict[str, Any] | None:
    """One record's steady window beside the independent counter read (None: the record has no steady window)."""
    steady = next((w for w in record.get("windows", []) if w["name"] == "steady"), None)
    if steady is None:
        return None
    (point, figure, energy_text), anchor = figures(record)
    energy = steady.get("energy") or {}
    measured = energy.get("energy_j")
    independent, uncertainty = poller.energy_j(steady["t_start_ns"], steady["t_end_ns"], [uuid])
    bound = energy.get("error_bound_j")
    return {
        "status": record["status"], "point": point, "figure": figure, "energy": energy_text,
        "record_energy_j": measured, "independent_j": independent, "independent_uncertainty_j": uncertainty,
        "bound %": None if measured is None or bound is None else 100 * bound / measured,
        "deviation %": None if measured is None or not independent else 100 * (measured / independent - 1.0),
        "W": record.get("metrics", {}).get("mean_power_w") or record.get("metrics", {}).get("mean_power_w_per_device"),
        "steady s": steady["duration_s"], "loss": loss_at(record), "anchor": ANCHORS.get(anchor, ""),
        "engine": (record.get("config", {}) or {}).get("engine_detail"),
    }


def write_table(out: Path, rows: list[dict[str, Any]]) -> str:
    """results.md (the table) and results.json (the rows), written whole after each run and tree and at the end
    (benchmarks.common.write_results); returns the table."""
    table = markdown_table(rows, HEADER, digits=4)
    write_results(out, table + "\n", rows)
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="perf33_out")
    parser.add_argument("--trees", default="branch=.", help="name=path,... (paths relative to the repository root)")
    parser.add_argument("--runs", required=True, help=f"comma list of {', '.join(RUNS)}; NAME@TREE: in that tree only")
    parser.add_argument("--timeout-s", type=float, default=400.0, help="per run and tree")
    own, driver = split_at_double_dash(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(own)
    args.driver_args = driver
    names = args.runs.split(",")
    unknown = [n for n in names if n.split("@")[0] not in RUNS]
    if unknown:
        parser.error(f"unknown runs {unknown}; choose from {', '.join(RUNS)}")
    trees = [(name, (REPO / path).resolve()) for name, path in (item.split("=", 1) for item in args.trees.split(","))]
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    uuid = first_gpu_uuid()
    rows: list[dict[str, Any]] = []
    with CounterPoller([uuid]) as poller:
        for item in names:  # trees alternate per run: both see the same GPU state
            name, _, only = item.partition("@")
            for tree_name, tree in trees:
                if only in ("", tree_name):
                    rows += run_one(name, tree_name, tree, out, uuid, poller, args)
                write_table(out, rows)
    print(write_table(out, rows))
    return exit_status(rows)


if __name__ == "__main__":
    sys.exit(main())
