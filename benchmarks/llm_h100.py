#!/usr/bin/env python3
"""GPT-800M on one or more GPUs in a few configurations, metered by jpwr; prints one table.

Run from the repository root on a GPU machine with torch installed (megatron-core from a wheel if
it is not importable yet, e.g. the cp312 wheel carried to the machine):

    python benchmarks/llm_h100.py --wheel 'wheels/megatron_core-0.16.1-*.whl' --out-dir $OUT/llm
    python benchmarks/llm_h100.py --configs bf16-mbs8 --nproc 2 --out-dir $OUT/llm_dp2   # 2 GPUs, DP=2

Each configuration is one `python -m jpwr --methods nvml -- [torchrun] python -m llm_training train`
process; its run record (<out-dir>/<config>/run_record.json) and jpwr files stay beside the table.
Throughput and energy come from the same steady-state window (warm-up iterations excluded).
The table is also written as results.md and results.json in --out-dir.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.common import exit_status, first_gpus_env, markdown_table, write_results  # noqa: E402 (on sys.path)
from joulebench.bounded_run import run_bounded  # noqa: E402

# name -> extra `llm_training train` options. 800M preset defaults: bf16, GBS 64 per replica, MBS chosen by device
# memory (16 where the estimate fits, e.g. an 80 GB H100; else 8). The bf16-mbs8* rows pin MBS 8, the default before
# issue 33, so each single-lever row compares against bf16-mbs8 and `default` against both MBS rows.
MBS8 = ["--micro-batch-size", "8"]
CONFIGS: dict[str, list[str]] = {
    "default": [],
    "bf16-mbs8": [*MBS8],
    "bf16-mbs4": ["--micro-batch-size", "4"],
    "fp16-mbs4": ["--precision", "fp16", "--micro-batch-size", "4"],
    "caraml": ["--caraml"],  # fp16, MBS 4, GBS 32, selective recompute
    "bf16-mbs8-nofusion": [*MBS8, "--no-bias-fusion"],
    "bf16-mbs8-nodropout": [*MBS8, "--attention-dropout", "0", "--hidden-dropout", "0"],
    # issue 7 levers, one at a time against bf16-mbs8 (same GBS 64)
    "bf16-mbs16": ["--micro-batch-size", "16", "--global-batch-size", "64"],
    "bf16-mbs8-flash": [*MBS8, "--attention-backend", "flash"],
    "bf16-mbs8-cudnn": [*MBS8, "--attention-backend", "cudnn"],
    "bf16-mbs8-efficient": [*MBS8, "--attention-backend", "efficient"],
    "bf16-mbs8-norope-fusion": [*MBS8, "--no-rope-fusion"],
    "bf16-mbs8-unfused": [*MBS8, "--no-cross-entropy-fusion", "--no-fused-optimizer"],  # the default before these two
    "bf16-mbs8-noce-fusion": [*MBS8, "--no-cross-entropy-fusion"],
    "bf16-mbs8-foreach-adam": [*MBS8, "--no-fused-optimizer"],
}
DEFAULT_CONFIGS = "default,bf16-mbs8,bf16-mbs4,caraml"

COLUMNS = [
    ("config", None), ("status", None), ("MBS", None), ("GBS", "global_batch_size"), ("s/iter", "time_per_iteration_s"),
    ("tokens/s", "tokens_per_s"), ("tokens/s/dev", "tokens_per_s_per_device"),
    ("TFLOP/s/dev", "model_tflops_per_device"), ("MFU", "mfu"), ("steady Wh", "energy_wh"),
    ("W/dev", "mean_power_w_per_device"), ("tokens/Wh", "tokens_per_wh"), ("energy method", "energy_method"),
    ("coverage", "energy_coverage"), ("CARAML x4 TFLOP/s/dev", "caraml_x4_tflops_per_device"),
    ("peak mem GiB", "peak_memory_allocated_gib"),
]


def ensure_megatron(wheel: str | None, deps_dir: Path) -> dict[str, str]:
    """Environment for the runs: megatron-core importable (installed from `wheel` into deps_dir if needed)."""
    env = dict(os.environ)
    paths = [str(REPO)]
    probe = subprocess.run([sys.executable, "-c", "import megatron.core"], capture_output=True, text=True)
    if probe.returncode != 0:
        matches = sorted(glob.glob(wheel)) if wheel else []
        if not matches:
            sys.exit(f"megatron-core is not importable and no wheel matched --wheel {wheel!r}: pass the "
                     "megatron_core-0.16.1 wheel for this Python (cp312 on the GPU machines)")
        subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--quiet", "--target", str(deps_dir),
                        matches[-1]], check=True)
        paths.append(str(deps_dir))
    env["PYTHONPATH"] = os.pathsep.join([*paths, env.get("PYTHONPATH", "")])
    return env


def command(name: str, args: argparse.Namespace, run_dir: Path) -> list[str]:
    train = ["-m", "llm_training", "train", "--model", args.model, "--iterations", str(args.iterations),
             "--warmup-iterations", str(args.warmup_iterations), "--log-interval", str(args.log_interval),
             "--device", args.device, "--out-dir", str(run_dir), "--run-id", f"{args.tag}-{name}", *CONFIGS[name]]
    if args.nproc > 1:
        launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                    str(args.nproc)]
    else:
        launcher = [sys.executable]
    if args.no_energy:
        return [*launcher, *train]
    jpwr = [sys.executable, "-m", "jpwr", "--methods", args.energy_methods, "--out", str(run_dir / "jpwr"),
            "--run-id", f"{args.tag}-{name}", "--"]
    return [*jpwr, *launcher, *train]


def row(name: str, run_dir: Path, returncode: int | str) -> dict[str, object]:
    path = run_dir / "run_record.json"
    if not path.is_file():
        return {"config": name, "status": f"no record (exit {returncode})"}
    record = json.loads(path.read_text())
    metrics = record.get("metrics", {})
    out: dict[str, object] = {"config": name, "status": record["status"]}
    out.update({label: metrics.get(key) for label, key in COLUMNS if key})
    out["MBS"] = record.get("config", {}).get("micro_batch_size")  # `default`'s depends on the device's memory
    out["device"] = record.get("hardware", {}).get("device_name")
    return out


def write_tables(out_dir: Path, rows: list[dict[str, object]], args: argparse.Namespace) -> tuple[str, str]:
    """results.md (a heading and the table) and results.json (the rows), written whole after each configuration and
    at the end (benchmarks.common.write_results); returns the heading and the table."""
    text = markdown_table(rows, [label for label, _ in COLUMNS], digits=6)
    devices = sorted({str(r.get("device")) for r in rows if r.get("device")})
    heading = (f"{args.model}, {args.nproc} device(s) {', '.join(devices)}; {args.iterations} iterations, "
               f"{args.warmup_iterations} warm-up excluded; model FLOPs 6N + 12·L·h·s")
    write_results(out_dir, f"{heading}\n\n{text}\n", rows)
    return heading, text


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", default=DEFAULT_CONFIGS, help=f"comma list of: {', '.join(CONFIGS)}")
    parser.add_argument("--model", default="800M")
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--warmup-iterations", type=int, default=5)
    parser.add_argument("--log-interval", type=int, default=5)
    parser.add_argument("--device", default="cuda", help="cpu only for a smoke test of this script")
    parser.add_argument("--nproc", type=int, default=1, help="GPUs (torchrun processes); DP = nproc")
    parser.add_argument("--energy-methods", default="nvml", help="jpwr methods (nvml; amdsmi on AMD)")
    parser.add_argument("--no-energy", action="store_true", help="run without the jpwr sampler")
    parser.add_argument("--wheel", help="megatron-core wheel (glob) to use when megatron.core is not importable")
    parser.add_argument("--out-dir", default="llm_bench_out")
    parser.add_argument("--timeout-s", type=float, default=540, help="per configuration")
    parser.add_argument("--tag", default=time.strftime("llm%Y%m%dT%H%M%S"))
    args = parser.parse_args()
    names = [n.strip() for n in args.configs.split(",") if n.strip()]
    unknown = [n for n in names if n not in CONFIGS]
    if unknown:
        parser.error(f"unknown configs {unknown}; choose from {', '.join(CONFIGS)}")
    out_dir = Path(args.out_dir).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    env = ensure_megatron(args.wheel, out_dir / "deps")
    rows = []
    for name in names:
        run_dir = out_dir / name
        cmd = command(name, args, run_dir)
        print(f"=== {name}: {' '.join(cmd)}", flush=True)
        started = time.monotonic()
        # On a timeout the training process under jpwr/torchrun is stopped too (its group), instead of living on and
        # holding GPU memory during the next configuration.
        code = run_bounded(cmd, args.timeout_s, cwd=REPO, env=first_gpus_env(args.nproc, env))
        print(f"=== {name}: exit {code} after {time.monotonic() - started:.0f} s", flush=True)
        rows.append(row(name, run_dir, code))
        write_tables(out_dir, rows, args)
    heading, text = write_tables(out_dir, rows, args)
    print(f"\n{heading}\n{text}")
    return exit_status(rows)


if __name__ == "__main__":
    sys.exit(main())
