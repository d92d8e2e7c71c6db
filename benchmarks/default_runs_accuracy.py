"""Default training and inference runs against an independent read of the GPU's energy counter (issue 20, Done-when).

    python benchmarks/default_runs_accuracy.py --out /tmp/acc                      # four runs, ~10 min, one GPU
    python benchmarks/default_runs_accuracy.py --out /tmp/acc --runs resnet50-eager   # the README's with --no-compile
    python benchmarks/default_runs_accuracy.py --runs jube-llm,jube-resnet50       # the JUBE workflows on `local`
    python benchmarks/default_runs_accuracy.py --runs jube-llm-sweep               # a refused power-limit point
    python benchmarks/default_runs_accuracy.py --runs jube-inference               # llama-8b chat batch 8 via JUBE
    python benchmarks/default_runs_accuracy.py --runs llm_training -- --model tiny --device cpu   # a CPU smoke run

Each run is the README's command with no length options, under `jpwr --methods nvml --`: the steady window
is sized by jpwr's rule, the idle baseline is taken. The `jube-*` runs are the README's JUBE commands on the
`local` system (its job script starts the sampler; on a GPU machine `local` picks the one-GPU defaults). A
thread of this process reads the GPU's energy counter on its own throughout
(benchmarks.common.CounterPoller, no jpwr code); after each run the counter is interpolated at the run
record's steady-window edges (CLOCK_MONOTONIC, same host) and compared with the record's energy. This checks
windowing and integration, not the sensor (`jpwr qualify` is for that). Prints one `DEFAULT_RUN {json}` line
per run, then a Markdown table; exit status 1 if a run fails or its stated bound or its deviation exceeds
--target (0.5 %).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # run as a script from a checkout

from benchmarks.common import (  # noqa: E402 (needs REPO on sys.path)
    CounterPoller,
    first_gpus_env,
    markdown_table,
    split_at_double_dash,
    unless_given,
)

RESNET = ["-m", "resnet50", "train", "--framework", "pytorch", "--global-batch-size", "256", "--precision", "bf16"]
RUNS = {
    "llm_training": ["-m", "llm_training", "train", "--model", "800M"],
    "resnet50": RESNET,
    "resnet50-eager": [*RESNET, "--no-compile"],  # the GPU default compiles (issue 33); eager for comparison
    # the static decode engine at ML.ENERGY's batch-8 anchor (llama-8b); its steady window is one point's
    "llm_inference": ["-m", "llm_inference", "run", "--preset", "llama-8b", "--task", "chat", "--batch-sizes", "8"],
}
# JUBE workflows on `local` (no system tag): the job script starts `jpwr serve` itself
JUBE_RUNS = {
    "jube-llm": ["jube/llm_benchmark.xml"],
    "jube-resnet50": ["jube/resnet50_benchmark.xml", "--tag", "local", "pytorch"],
    "jube-llm-sweep": ["jube/llm_benchmark.xml"],
    "jube-inference": ["jube/inference_benchmark.xml"],
}
# jube-llm-sweep: a power-limit sweep on a system that does not allow device settings (local's default): the 300 W
# point must be refused before anything runs (an INVALID row, no NVML set call) and the default row must run.
JUBE_ENV = {"jube-llm-sweep": {"JOULEBENCH_SWEEP_POWER_LIMIT": ",300"}}
HEADER = ("run", "steady s", "iterations", "length rule", "stated bound %", "deviation %", "idle W", "settled", "ok")


def run_one(name: str, out: Path, uuid: str, poller: CounterPoller, args: argparse.Namespace) -> dict[str, Any]:
    run_dir = out / name
    if name in JUBE_RUNS:
        xml, *tags = JUBE_RUNS[name]
        command = [args.jube, "run", xml, *tags, "--outpath", str(run_dir), "-e"]
    else:
        command = [sys.executable, "-m", "jpwr", "--methods", "nvml", "--out", str(run_dir / "jpwr"), "--",
                   sys.executable, *unless_given(RUNS[name], args.driver_args), "--out-dir", str(run_dir / "run")]
    env = {**first_gpus_env(1), **JUBE_ENV.get(name, {})}
    env["CUDA_VISIBLE_DEVICES"] = uuid  # the GPU the poller reads, whatever its index
    started = time.monotonic()
    with open(out / f"{name}.log", "w") as log:
        proc = subprocess.run(command, env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                              timeout=args.timeout_s, check=False)
    if name in JUBE_RUNS:
        with open(out / f"{name}.log", "a") as log:  # the table as JUBE prints it
            subprocess.run([args.jube, "result", str(run_dir), "-a"], env=env, cwd=REPO, stdout=log,
                           stderr=subprocess.STDOUT, timeout=120, check=False)
    records = [json.loads(p.read_text()) for p in sorted(run_dir.rglob("run_record.json"))]
    measured_runs = [r for r in records if any(w["name"] == "steady" for w in r["windows"])]
    (record,) = measured_runs  # one measured run: the driver's, or the JUBE workpackage's (a refused point has none)
    steady = next(w for w in record["windows"] if w["name"] == "steady")
    energy = steady["energy"] or {}
    independent_j, uncertainty_j = poller.energy_j(steady["t_start_ns"], steady["t_end_ns"], [uuid])
    measured = energy.get("energy_j")
    deviation = None if measured is None else measured / independent_j - 1.0
    bound = None if measured is None else energy["error_bound_j"] / measured
    # training plans steps (steady_plan); inference runs whole passes for at least a planned time (steady_seconds)
    plan = record["meter"].get("steady_plan") or record["meter"].get("steady_seconds") or {}
    idle = record["meter"].get("idle_baseline") or {}
    # the sweep's refused point makes `jube run -e` exit 1 by design (its verdict step); it must be there, INVALID
    exited_as_meant = (proc.returncode != 0 and any(r["status"] == "INVALID" for r in records)) if name in JUBE_ENV \
        else proc.returncode == 0
    ok = (exited_as_meant and record["status"] == "OK" and bound is not None and deviation is not None
          and bound <= args.target and abs(deviation) <= args.target)
    return {
        "run": name, "command": " ".join(command), "wall_s": time.monotonic() - started, "status": record["status"],
        "steady s": steady["duration_s"], "iterations": steady["steps"], "length rule": plan.get("rule"),
        "plan": plan.get("reason"), "end_reason": steady.get("end_reason"), "record_energy_j": measured,
        "record_bound_j": energy.get("error_bound_j"), "method": energy.get("method"),
        "independent_j": independent_j, "independent_uncertainty_j": uncertainty_j,
        "stated bound %": None if bound is None else 100 * bound,
        "deviation %": None if deviation is None else 100 * deviation,
        "idle W": idle.get("power_w"), "settled": str(idle.get("settled")), "settle_note": idle.get("settle_note"),
        "dynamic_energy_j": (steady.get("energy_split") or {}).get("dynamic_j"), "ok": str(ok),
        "points": [f"{r['status']}: {r.get('status_reason') or '-'}" for r in records],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="default_runs_accuracy")
    parser.add_argument("--runs", default=",".join(RUNS), help=f"comma list of {', '.join([*RUNS, *JUBE_RUNS])}")
    parser.add_argument("--jube", default="jube", help="the jube command (for the jube-* runs)")
    parser.add_argument("--gpu", type=int, default=0, help="NVML index of the GPU to run on")
    parser.add_argument("--target", type=float, default=0.005)
    parser.add_argument("--timeout-s", type=float, default=420.0, help="per run")
    own, driver = split_at_double_dash(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(own)
    args.driver_args = driver  # after `--`: appended to every run's command (the CPU test shrinks the runs)
    import pynvml

    pynvml.nvmlInit()
    raw = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(args.gpu))
    uuid = raw.decode() if isinstance(raw, bytes) else raw
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    with CounterPoller([uuid]) as poller:
        for name in args.runs.split(","):
            row = run_one(name, out, uuid, poller, args)
            rows.append(row)
            print("DEFAULT_RUN " + json.dumps(row), flush=True)
    print(markdown_table(rows, HEADER, digits=4))
    return 0 if all(row["ok"] == "True" for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
