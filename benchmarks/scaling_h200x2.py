#!/usr/bin/env python3
"""Data-parallel scaling on one 2-GPU host (issue 7, target 4): 1 GPU vs 2 GPUs, final driver defaults.

    python benchmarks/scaling_h200x2.py --wheel '.whl/megatron_core-0.16.1-*.whl' --out $OUT/scaling

Runs, one after another, each metered by jpwr (NVML) exactly as the drivers' own benchmark scripts do:
* GPT-800M with the llm_training defaults but MBS pinned to 8 as in the earlier runs (config bf16-mbs8:
  bf16, 8 micro-batches per replica, cuDNN SDPA as torch picks it, compiled RoPE and cross-entropy, fused
  AdamW): 1 GPU (GBS 64) vs torchrun DP=2 (GBS 128, overlapped reduce-scatter);
* ResNet-50 (torchvision, bf16, channels-last, torch.compile): 1 GPU (GBS 256) vs DDP over 2 (GBS 512).
Both are weak scaling (same work per GPU). Efficiency = 2-GPU rate / (2 × 1-GPU rate); the GPT target
is ≥ 95 %. Prints one table and writes it as scaling.md beside the per-run records in --out.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.common import exit_status  # noqa: E402 (after the repository is on sys.path)
from joulebench.bounded_run import GRACE_S, NESTED_GRACE_S, run_bounded  # noqa: E402

TARGET_EFFICIENCY = 0.95  # GPT-800M, issue 7


def _run(cmd: list[str], timeout_s: float) -> int | str:
    print("$ " + " ".join(cmd), flush=True)
    return run_bounded(cmd, timeout_s, grace_s=NESTED_GRACE_S, cwd=REPO)  # a harness: its drivers stop first


def _llm_rate(out_dir: Path) -> float | None:
    path = out_dir / "results.json"
    rows = json.loads(path.read_text()) if path.is_file() else []
    return rows[0].get("tokens/s") if rows and rows[0].get("status") == "OK" else None


def _resnet_rate(run_dir: Path) -> float | None:
    path = run_dir / "run_record.json"
    if not path.is_file():
        return None
    record = json.loads(path.read_text())
    return record["metrics"].get("images_per_s") if record.get("status") == "OK" else None


def _row(name: str, unit: str, one: float | None, two: float | None, target: float | None) -> str:
    efficiency = None if one is None or two is None else two / (2 * one)
    verdict = "" if target is None or efficiency is None else ("met" if efficiency >= target else "NOT met")
    wanted = "-" if target is None else f"≥ {target:.0%} {verdict}"
    cells = [name, unit, "n/a" if one is None else f"{one:,.0f}", "n/a" if two is None else f"{two:,.0f}",
             "n/a" if efficiency is None else f"{efficiency:.1%}", wanted]
    return "| " + " | ".join(cells) + " |"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--wheel", help="megatron-core wheel glob, when megatron.core is not importable")
    parser.add_argument("--llm-iterations", type=int, default=20)
    parser.add_argument("--llm-warmup", type=int, default=5)
    parser.add_argument("--resnet-iterations", type=int, default=200)
    args = parser.parse_args()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    py = sys.executable
    llm = [py, str(REPO / "benchmarks" / "llm_h100.py"), "--configs", "bf16-mbs8", "--iterations",
           str(args.llm_iterations), "--warmup-iterations", str(args.llm_warmup), "--timeout-s", "400"]
    if args.wheel:
        llm += ["--wheel", args.wheel]
    # each harness's own limits and graces end inside the limit given it here (joulebench.bounded_run)
    _run([*llm, "--nproc", "1", "--out-dir", str(out / "llm_1gpu"), "--tag", "scaling-1gpu"], 400 + GRACE_S + 30)
    _run([*llm, "--nproc", "2", "--out-dir", str(out / "llm_dp2"), "--tag", "scaling-dp2"], 400 + GRACE_S + 30)
    _run([py, str(REPO / "benchmarks" / "resnet50_h100.py"), "--out", str(out / "resnet"), "--only", "compile",
          "ddp2-compile", "--iterations", str(args.resnet_iterations), "--timeout", "300"], 2 * (300 + GRACE_S) + 30)
    gpt_one, gpt_two = _llm_rate(out / "llm_1gpu"), _llm_rate(out / "llm_dp2")
    resnet_one, resnet_two = _resnet_rate(out / "resnet" / "compile"), _resnet_rate(out / "resnet" / "ddp2-compile")
    rates = [gpt_one, gpt_two, resnet_one, resnet_two]
    lines = ["| workload | unit | 1 GPU | 2 GPUs | efficiency | target |", "|---|---|---|---|---|---|",
             _row("GPT-800M (MBS 8, GBS 64/GPU)", "tokens/s", gpt_one, gpt_two, TARGET_EFFICIENCY),
             _row("ResNet-50 compiled (GBS 256/GPU)", "img/s", resnet_one, resnet_two, None)]
    text = "\n".join(lines)
    (out / "scaling.md").write_text(text + "\n")
    print(text)
    return exit_status(rates, lambda rate: rate is not None)  # n/a: that run failed


if __name__ == "__main__":
    sys.exit(main())
