#!/usr/bin/env python3
"""Issue 17 on one GPU: GPT-800M and ResNet-50 (torchvision, compiled) attributed by both estimators.

    python benchmarks/attribution_h100.py --out $OUT/attr --wheel '.whl/megatron_core-0.16.1-*.whl'
    python benchmarks/attribution_h100.py --out $OUT/attr --only resnet50 --no-profile     # a shorter call
    python benchmarks/attribution_h100.py --out $OUT/overhead --only llm --overhead-only   # phase-mark cost

Per workload, each step a real process as users run it (raw files stay under --out/<workload>/):
1. the driver under `python -m jpwr --methods nvml --interval 20 --counter-interval 20` (the counter read
   every 20 ms, so its knots are known to ~±12 ms), with --replay-phases 4: run/run_record.json, run/jpwr/;
2. unless --no-profile, benchmarks/kernel_profile.py under the same sampler settings with --intervals-out:
   run/profile/kernels.json and its trace (the kernel-class fit; the profiler adds its own overhead);
3. `python -m joulebench attribute run [--profile ...]`: run/attribution.txt, and the block in the record.
--overhead (or --overhead-only) adds benchmarks/jpwr_overhead.py --compare phase-marks (10 alternations,
same process) for each workload: overhead.txt. A compact table is printed last (also results.md).

Time on one H100 (estimated): GPT-800M driver ~3 min (idle baseline and cooldown up to ~1 min included),
its profile ~1.5 min; ResNet-50 compiled driver ~2.5 min (compilation ~1 min), its profile ~1.5 min; each
overhead alternation run ~2.5 min. Past the ~8 minutes of one call, split it: --only llm, then --only resnet50.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TextIO

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.common import exit_status, first_gpus_env  # noqa: E402 (after the repository is on sys.path)
from benchmarks.llm_h100 import ensure_megatron  # noqa: E402
from joulebench.bounded_run import run_bounded  # noqa: E402
from jpwr.output import fmt, write_atomic  # noqa: E402

# torch.compile mode default without CUDA graphs or kernel tuning, as measured before the GPU default became
# reduce-overhead + coordinate-descent tuning (issue 33): phase marks and replays stay the eager graph's
OLD_COMPILE = ["--compile", "--compile-mode", "default", "--no-coordinate-descent-tuning"]
SAMPLER = ["--methods", "nvml", "--interval", "20", "--counter-interval", "20"]
# ResNet-50's warm-up: ~45 s at full load after its ~80 s low-power compile, so that the window opens at a steady
# temperature (with 30 iterations the GPU was still warming: the two halves misfit in opposite directions, 2.4 %).
DRIVERS = {
    "llm": ["-m", "llm_training", "train", "--model", "800M", "--iterations", "40", "--warmup-iterations", "5",
            "--log-interval", "5", "--device", "cuda"],
    "resnet50": ["-m", "resnet50", "train", "--framework", "pytorch", *OLD_COMPILE, "--global-batch-size", "256",
                 "--precision", "bf16", "--channels-last", "--device", "cuda", "--warmup-iterations", "1000",
                 "--iterations", "700", "--log-interval", "100"],
}
PROFILES = {  # kernel_profile.py options, then its workload options
    "llm": (["--workload", "llm", "--warmup", "4", "--steps", "16"], ["--model", "800M"]),
    "resnet50": (["--workload", "resnet50", "--warmup", "30", "--steps", "300"],
                 [*OLD_COMPILE, "--global-batch-size", "256", "--precision", "bf16"]),
}
OVERHEAD = {"llm": (["--steps", "3"], ["--model", "800M"]),
            "resnet50": (["--steps", "60", "--warmup", "30"], [*OLD_COMPILE, "--global-batch-size", "256",
                                                               "--precision", "bf16"])}


def run(cmd: list[str], env: dict[str, str], log: Path, timeout_s: float) -> int | str:
    """One process in its own group (a timeout stops everything it started, as joulebench.bounded_run does), output
    to `log` and the console; a reader thread copies it, so the limit holds while the child still writes."""
    print(f"=== {' '.join(cmd)}", flush=True)
    started = time.monotonic()
    read_end, write_end = os.pipe()
    with log.open("w") as handle, os.fdopen(read_end, errors="replace") as output:
        reader = threading.Thread(target=_copy_lines, args=(output, handle), daemon=True)
        reader.start()
        try:
            code = run_bounded(cmd, timeout_s, cwd=REPO, env=env, stdout=write_end, stderr=subprocess.STDOUT)
        finally:
            os.close(write_end)  # the group is gone: the reader sees the end of its output
            reader.join()
    print(f"=== exit {code} after {time.monotonic() - started:.0f} s", flush=True)
    return code


def _copy_lines(output: TextIO, handle: TextIO) -> None:
    for line in output:
        handle.write(line)
        if "Warning" not in line:
            print(line, end="", flush=True)


def attribute_workload(name: str, out: Path, env: dict[str, str], args: argparse.Namespace) -> bool:
    """The driver's run with phase replays, the kernel profile, then `joulebench attribute`; True when it attributed."""
    run_dir = out / "run"
    driver = [sys.executable, "-m", "jpwr", *SAMPLER, "--out", str(run_dir / "jpwr"), "--run-id", f"attr-{name}",
              "--", sys.executable, *DRIVERS[name], "--out-dir", str(run_dir), "--replay-phases",
              str(args.replay_seconds)]
    run(driver, env, out / "driver.log", args.timeout_s)
    attribute = [sys.executable, "-m", "joulebench", "attribute", str(run_dir)]
    if not args.no_profile:
        own, workload = PROFILES[name]
        profile_dir = run_dir / "profile"
        profile = [sys.executable, "-m", "jpwr", *SAMPLER, "--out", str(profile_dir), "--run-id", f"prof-{name}",
                   "--", sys.executable, "benchmarks/kernel_profile.py", *own, "--out",
                   str(profile_dir / "kernels.txt"), "--intervals-out", str(profile_dir / "kernels.json"), "--",
                   *workload]
        run(profile, env, out / "profile.log", args.timeout_s)
        if (profile_dir / "kernels.json").is_file():
            attribute += ["--profile", str(profile_dir / "kernels.json")]
    return (run_dir / "run_record.json").is_file() and run(attribute, env, run_dir / "attribution.txt", 300) == 0


def overhead_workload(name: str, out: Path, env: dict[str, str], args: argparse.Namespace) -> None:
    own, workload = OVERHEAD[name]
    cmd = [sys.executable, "benchmarks/jpwr_overhead.py", "--compare", "phase-marks", "--workload", name,
           "--alternations", "10", "--interval", "20", "--counter-interval", "20", *own, "--", *workload]
    run(cmd, env, out / "overhead.txt", args.timeout_s)


def summary_rows(name: str, out: Path) -> list[str]:
    """Compact lines from the record's attribution block and the overhead result."""
    rows = []
    record_path = out / "run" / "run_record.json"
    block = json.loads(record_path.read_text()).get("attribution") if record_path.is_file() else None
    for estimator, data in (block or {}).get("estimators", {}).items():
        if "unavailable_reason" in data:
            rows.append(f"| {name} | {estimator} | n/a | | | | {data['unavailable_reason'][:90]} |")
            continue
        for r in data.get("rows", []):
            if r.get("energy_per_step_j") is None:
                rows.append(f"| {name} | {estimator} | {r['phase']} | n/a | | | {r['status']} |")
                continue
            spread = (f"[{fmt(r['energy_per_step_j_interval'][0], 4)}, {fmt(r['energy_per_step_j_interval'][1], 4)}]"
                      if "energy_per_step_j_interval" in r else f"± {fmt(r.get('error_bound_j'), 3)}")
            share = r.get("share", r.get("share_of_step"))
            rows.append(f"| {name} | {estimator} | {r['phase']} | {fmt(r['energy_per_step_j'], 4)} {spread} | "
                        f"{fmt(None if share is None else 100 * share, 3)} | {fmt(r.get('mean_power_w'), 4)} | "
                        f"{r['status']} |")
        closure = data.get("closure") or data.get("sum_vs_step")
        if closure:
            rows.append(f"| {name} | {estimator} | closure | | | | {closure['status']} |")
    overhead = out / "overhead.txt"
    if overhead.is_file():
        line = next((x for x in overhead.read_text().splitlines() if x.startswith("JPWR_OVERHEAD ")), None)
        if line:
            result = json.loads(line.split(" ", 1)[1])
            rows.append(f"| {name} | phase-mark overhead | median {100 * result['median_change']:+.2f} % | "
                        f"min {100 * result['min_change']:+.2f} % | max {100 * result['max_change']:+.2f} % | "
                        f"| {result['alternations']} alternations |")
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--only", default="llm,resnet50", help="comma list of: llm, resnet50")
    parser.add_argument("--no-profile", action="store_true", help="skip the kernel-class profile runs")
    parser.add_argument("--overhead", action="store_true", help="also measure the phase-mark overhead")
    parser.add_argument("--overhead-only", action="store_true", help="only measure the phase-mark overhead")
    parser.add_argument("--replay-seconds", type=float, default=4.0, help="--replay-phases of the drivers")
    parser.add_argument("--wheel", help="megatron-core wheel (glob) when megatron.core is not importable")
    parser.add_argument("--timeout-s", type=float, default=400, help="per process")
    args = parser.parse_args()
    names = [n.strip() for n in args.only.split(",") if n.strip()]
    if unknown := [n for n in names if n not in DRIVERS]:
        parser.error(f"unknown workloads {unknown}; choose from {', '.join(DRIVERS)}")
    args.out.mkdir(parents=True, exist_ok=True)
    env = first_gpus_env(1, ensure_megatron(args.wheel, args.out / "deps") if "llm" in names else dict(os.environ))
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    attributed = []
    for name in names:
        out = args.out / name
        out.mkdir(parents=True, exist_ok=True)
        if not args.overhead_only:
            attributed.append(attribute_workload(name, out, env, args))
        if args.overhead or args.overhead_only:
            overhead_workload(name, out, env, args)
    table = ["| workload | estimator | phase | J/step [95 %] or ± bound | share % | mean W | status |",
             "|---|---|---|---|---|---|---|"]
    for name in names:
        table += summary_rows(name, args.out / name)
    text = "\n".join(table)
    write_atomic(args.out / "results.md", text + "\n")  # results.md alone: the figures are in the run records
    print("\n" + text, flush=True)
    return exit_status(attributed, bool) if not args.overhead_only else 0


if __name__ == "__main__":
    sys.exit(main())
