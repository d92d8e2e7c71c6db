#!/usr/bin/env python3
"""GPT-800M with and without `--log-to tensorboard,mlflow` on one GPU (issue 35, Done-when); writes one table.

    python benchmarks/log_to_h100.py --out $OUT/log_to                 # ~6 min: one run without, one with
    python benchmarks/log_to_h100.py --out $OUT/log_to --repeats 2     # without, with, without, with

Each run is `jpwr --methods nvml -- python -m llm_training train --model 800M` with the same fixed length; the
logged run adds `--log-to tensorboard,mlflow`. A thread of this process reads the GPU's energy counter on its own
throughout (benchmarks.common.CounterPoller, no jpwr code). Afterwards five logged intervals of the steady window
(the energy MLflow stored, read back with MlflowClient) are compared with that counter interpolated at the
intervals' edges (the sampler's marks `log/<first step>` in the run's trace, CLOCK_MONOTONIC on the same host):
each must agree within the logged bound plus the counter read's own uncertainty. Throughput (tokens/s of the
steady window) with logging must be within 1 % of the run without. The GPU machine has no package access: the
extras come as wheels (benchmarks/fetch_serving_wheels.sh benchmarks/log-to-gpu-requirements.txt, docs/exports.md).
Exit status 1 when a check fails.
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

from benchmarks.common import CounterPoller, first_gpu_uuid, first_gpus_env, markdown_table  # noqa: E402
from joulebench.bounded_run import run_bounded  # noqa: E402

TRAIN = ["-m", "llm_training", "train", "--model", "800M", "--no-idle-baseline"]
LOG_TO = ["--log-to", "tensorboard,mlflow"]
INTERVALS = 5
HEADER = ["run", "status", "tokens/s", "vs without %", "interval steps", "logged J", "logged bound J",
          "independent J", "independent ± J", "deviation J", "within bound"]


def run_one(name: str, logged: bool, out: Path, uuid: str, args: argparse.Namespace) -> dict[str, Any]:
    """One training run under the sampler; its record."""
    run_dir = out / name
    command = [sys.executable, "-m", "jpwr", "--methods", "nvml", "--out", str(run_dir / "jpwr"), "--",
               sys.executable, *TRAIN, "--iterations", str(args.iterations), "--warmup-iterations",
               str(args.warmup), "--log-interval", str(args.log_interval), "--out-dir", str(run_dir / "run"),
               *(LOG_TO if logged else [])]
    env = {**first_gpus_env(1), "CUDA_VISIBLE_DEVICES": uuid}
    with open(out / f"{name}.log", "w") as log:
        print(" ".join(command), file=log, flush=True)
        run_bounded(command, args.timeout_s, env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    return json.loads((run_dir / "run" / "run_record.json").read_text())


def interval_rows(name: str, run_dir: Path, record: dict[str, Any], uuid: str,
                  poller: CounterPoller) -> list[dict[str, Any]]:
    """Five logged intervals inside the steady window against the independent counter at their edges."""
    from mlflow import MlflowClient

    from jpwr.trace import load_trace, spans_from_marks

    client = MlflowClient(tracking_uri=f"sqlite:///{run_dir / 'run' / 'mlflow.db'}")
    (experiment,) = [e for e in client.search_experiments() if e.name == "joulebench-llm_training"]
    (mlrun,) = client.search_runs([experiment.experiment_id])
    energy = {m.step: m.value for m in client.get_metric_history(mlrun.info.run_id, "interval/energy_j")}
    bound = {m.step: m.value for m in client.get_metric_history(mlrun.info.run_id, "interval/energy_error_bound_j")}
    (node_dir,) = [d for d in (run_dir / "jpwr").iterdir() if d.is_dir()]
    spans = spans_from_marks(load_trace(node_dir).marks, intervals=True)
    steady = next(w for w in record["windows"] if w["name"] == "steady")
    steps = sorted(energy)
    firsts = dict(zip(steps, [0, *steps[:-1]], strict=True))  # intervals are consecutive from the loop's start
    inside = [s for s in steps if firsts[s] >= steady["first_step"] and s <= steady["last_step"]]
    middle = inside[max(0, len(inside) // 2 - INTERVALS // 2):][:INTERVALS]
    rows = []
    for step in middle:
        span = spans[f"log/{firsts[step]}"]
        independent, uncertainty = poller.energy_j(span.t0_ns, span.t1_ns, [uuid])
        deviation = energy[step] - independent
        rows.append({"run": name, "status": record["status"], "interval steps": f"{firsts[step]}-{step}",
                     "logged J": energy[step], "logged bound J": bound[step], "independent J": independent,
                     "independent ± J": uncertainty, "deviation J": deviation,
                     "within bound": str(abs(deviation) <= bound[step] + uncertainty)})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="log_to_h100")
    parser.add_argument("--iterations", type=int, default=150, help="steady iterations of every run")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--log-interval", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=1, help="pairs of runs (without, with)")
    parser.add_argument("--timeout-s", type=float, default=400.0, help="per run")
    args = parser.parse_args(argv)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    uuid = first_gpu_uuid()
    rows: list[dict[str, Any]] = []
    rates: dict[bool, list[float]] = {False: [], True: []}
    with CounterPoller([uuid]) as poller:
        for repeat in range(args.repeats):
            for logged in (False, True):
                name = f"{'with' if logged else 'without'}-log-to-{repeat}"
                started = time.monotonic()
                record = run_one(name, logged, out, uuid, args)
                rate = record["metrics"].get("tokens_per_s")
                rates[logged].append(rate)
                rows.append({"run": name, "status": record["status"], "tokens/s": rate,
                             "interval steps": f"{time.monotonic() - started:.0f} s wall"})
                if logged:
                    rows += interval_rows(name, out / name, record, uuid, poller)
    without = sum(rates[False]) / len(rates[False]) if all(rates[False]) else None
    for row in rows:
        if row.get("tokens/s") and without and row["run"].startswith("with-"):
            row["vs without %"] = 100 * (row["tokens/s"] / without - 1)
    table = markdown_table(rows, HEADER, digits=5)
    (out / "log_to_h100.md").write_text(table + "\n")
    (out / "log_to_h100.json").write_text(json.dumps(rows, indent=2))
    print(table)
    checks = [r["within bound"] == "True" for r in rows if "within bound" in r]
    overheads = [abs(r["vs without %"]) <= 1.0 for r in rows if "vs without %" in r]
    ok = len(checks) >= INTERVALS and all(checks) and overheads and all(overheads)
    print(f"LOG_TO_H100 ok={ok} intervals_checked={len(checks)} throughput_within_1pct={all(overheads)}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
