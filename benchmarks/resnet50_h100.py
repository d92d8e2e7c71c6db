"""ResNet-50 (torchvision v1.5) on NVIDIA GPUs: eager vs torch.compile, and DDP over 2 GPUs when present.

    PYTHONPATH=$PWD python3 benchmarks/resnet50_h100.py --out $OUT/resnet50    # on the GPU machine, repo root

Each configuration is one real driver run under the jpwr node sampler (NVML), exactly as users
run it: `python -m jpwr --methods nvml -- python -m resnet50 train --framework pytorch ...`
(DDP through torchrun inside the same wrapper, so one sampler meters both GPUs). Default:
global batch 256 per GPU, bf16, channels-last, synthetic data on the device, 30 warm-up + 300
measured iterations. The table comes from each run's run_record.json (steady window only);
the records and jpwr's files stay under --out. Targets (issue 7, checked here, never in tests):
>= 6,000 img/s on one H100 at GBS 256 bf16.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.common import first_gpus_env

TARGET_IMAGES_PER_S = 6000.0  # one H100, GBS 256 bf16 (issue 7)


DEFAULT_RUNS = ("eager", "compile", "ddp2-compile")
# Only with --only NAME: slower to compile, for exploring issue 7's target.
OPTIONAL_RUNS = {"compile-max-autotune": ["--compile", "--compile-mode", "max-autotune-no-cudagraphs"],
                 "compile-cudagraphs": ["--compile", "--compile-mode", "reduce-overhead"]}


def configurations(gpus: int, per_gpu_batch: int, only: list[str] | None) -> list[tuple[str, int, list[str]]]:
    """(name, processes, extra driver options) of the runs to do on this machine."""
    runs = [("eager", 1, []), ("compile", 1, ["--compile"])]
    if gpus >= 2:
        runs.append(("ddp2-compile", 2, ["--compile"]))
    runs += [(name, 1, extra) for name, extra in OPTIONAL_RUNS.items()]
    wanted = [name for name, _n, _e in runs if name in DEFAULT_RUNS] if only is None else only
    return [(name, n, ["--global-batch-size", str(per_gpu_batch * n), *extra])
            for name, n, extra in runs if name in wanted]


def run_one(name: str, processes: int, extra: list[str], args: argparse.Namespace) -> dict | None:
    run_dir = args.out / name
    driver = ["-m", "resnet50", "train", "--framework", "pytorch", "--precision", args.precision,
              "--channels-last", "--device", args.device, "--warmup-iterations", str(args.warmup),
              "--iterations", str(args.iterations), "--log-interval", "50", "--out-dir", str(run_dir),
              "--run-id", f"resnet50-{name}", *extra]
    if processes > 1:
        driver = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(processes), *driver]
    cmd = [sys.executable, "-m", "jpwr", "--methods", args.methods, "--out", str(run_dir / "jpwr"), "--",
           sys.executable, *driver]
    print(f"== {name}: {' '.join(cmd)}", flush=True)
    started = time.monotonic()
    with open(args.out / f"{name}.log", "w") as log:
        # Own process group: on a timeout the training process under jpwr is stopped too, and the
        # remaining configurations still run (a slow torch.compile mode must not end the sweep).
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=first_gpus_env(processes),
                                start_new_session=True)
        try:
            code = proc.wait(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            code = f"timeout ({args.timeout:.0f} s)"
    print(f"   exit {code} after {time.monotonic() - started:.0f} s (log: {args.out / f'{name}.log'})", flush=True)
    record_path = run_dir / "run_record.json"
    return json.loads(record_path.read_text()) if record_path.exists() else None


def _num(value: float | None, fmt: str) -> str:
    return "n/a" if value is None else format(value, fmt)


def table(rows: list[tuple[str, dict | None]]) -> str:
    header = (f"{'config':<14} {'GPUs':>4} {'GBS':>5} {'img/s':>9} {'img/s/GPU':>9} {'s/iter':>8} {'warmup s':>8} "
              f"{'Wh':>8} {'img/Wh':>9} {'W/GPU':>7} {'TFLOP/s/GPU':>11} {'energy':>14} {'status':>8}")
    lines = [header, "-" * len(header)]
    for name, record in rows:
        if record is None:
            lines.append(f"{name:<14} no run record (see {name}.log)")
            continue
        m = record["metrics"]
        warm = (m.get("warmup_excluded") or {}).get("duration_s")
        method = f"{m.get('energy_method') or 'n/a'} {_num(m.get('energy_coverage'), '.0%')}"
        lines.append(
            f"{name:<14} {m['devices']:>4} {m['global_batch_size']:>5} {_num(m.get('images_per_s'), ',.0f'):>9} "
            f"{_num(m.get('images_per_s_per_device'), ',.0f'):>9} {_num(m.get('time_per_iteration_s'), '.4f'):>8} "
            f"{_num(warm, '.1f'):>8} {_num(m.get('energy_wh'), '.3f'):>8} {_num(m.get('images_per_wh'), ',.0f'):>9} "
            f"{_num(m.get('mean_power_w_per_device'), '.0f'):>7} {_num(m.get('model_tflops_per_device'), '.0f'):>11} "
            f"{method:>14} {record['status']:>8}"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="directory for run records, jpwr files and logs")
    parser.add_argument("--per-gpu-batch", type=int, default=256)
    parser.add_argument("--precision", choices=("bf16", "fp16", "fp32"), default="bf16")
    parser.add_argument("--warmup", type=int, default=30, help="warm-up iterations (torch.compile compiles here)")
    parser.add_argument("--iterations", type=int, default=300, help="measured iterations")
    parser.add_argument("--only", nargs="*", default=None,
                        help=f"run only these: {', '.join([*DEFAULT_RUNS, *OPTIONAL_RUNS])} (default: {DEFAULT_RUNS})")
    parser.add_argument("--timeout", type=float, default=280, help="seconds per configuration")
    parser.add_argument("--methods", default="nvml", help="jpwr methods (default nvml)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cpu only to smoke-test this script itself (tiny --per-gpu-batch, --methods auto)")
    args = parser.parse_args()
    gpus = torch.cuda.device_count() if args.device == "cuda" else 1
    if gpus == 0:
        print("no CUDA device visible: this benchmark needs an NVIDIA GPU", file=sys.stderr)
        return 1
    args.out.mkdir(parents=True, exist_ok=True)
    name = torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu"
    print(f"{gpus} x {name}, torch {torch.__version__}", flush=True)
    rows = []
    for name, processes, extra in configurations(gpus, args.per_gpu_batch, args.only):
        rows.append((name, run_one(name, processes, extra, args)))
    text = table(rows)
    print(text)
    (args.out / "table.txt").write_text(text + "\n")
    if args.per_gpu_batch == 256 and args.precision == "bf16" and "H100" in name:
        best = max((r["metrics"].get("images_per_s") or 0.0 for _n, r in rows if r and r["metrics"]["devices"] == 1),
                   default=0.0)
        verdict = "met" if best >= TARGET_IMAGES_PER_S else "NOT met"
        print(f"H100 target {TARGET_IMAGES_PER_S:,.0f} img/s at GBS 256 bf16: {verdict} (best {best:,.0f} img/s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
