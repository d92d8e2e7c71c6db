"""Tensor-parallel inference against one GPU, each run's steady energy against an independent read of every GPU.

    python benchmarks/tp_energy.py --out $OUT/tp --preset llama-8b --points 2x1,1x1,2x256,1x256
    python benchmarks/tp_energy.py --out $OUT/tp --preset llama-70b --points 4x1,4x512 -- --steady-seconds 20

A point TPxB runs `llm_inference run --tensor-parallel TP --batch-size B` on the first TP GPUs under
`jpwr --methods nvml` (torchrun, one process per GPU; TP 1 runs the same way with one process). A thread of this
process reads every GPU's energy counter on its own (benchmarks.common.CounterPoller, no jpwr code); after each run
the counters of the run's GPUs are interpolated at the record's steady-window edges and summed, then compared with
the record's energy. Arguments after `--` go to every run (e.g. `--decode-tuning default --steady-seconds 10`).
Prints one `TP_POINT {json}` line per point and a Markdown table; exit 1 if a run fails or deviates beyond --target.
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

from benchmarks.common import (  # noqa: E402
    CounterPoller,
    first_gpus_env,
    markdown_table,
    split_at_double_dash,
    unless_given,
)
from joulebench.bounded_run import run_bounded  # noqa: E402

HEADER = ("point", "status", "ms/token p50", "J/output token", "record J", "independent J", "deviation %",
          "bound %", "W per GPU")


def _point(text: str) -> tuple[int, int]:
    tp, _, batch = text.partition("x")
    return int(tp), int(batch)


def run_point(tp: int, batch: int, args: argparse.Namespace, poller: CounterPoller, uuids: list[str]) -> dict[str, Any]:
    name = f"tp{tp}-bs{batch}"
    run_dir = args.out / name
    command = [sys.executable, "-m", "jpwr", "--methods", "nvml", "--out", str(run_dir / "jpwr"), "--",
               sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(tp),
               "-m", "llm_inference", "run", *unless_given(["--preset", args.preset, "--task", args.task,
                                                            "--tensor-parallel", str(tp), "--batch-size", str(batch)],
                                                           args.driver_args), "--out-dir", str(run_dir / "run")]
    env = first_gpus_env(tp)
    env["CUDA_VISIBLE_DEVICES"] = ",".join(uuids[:tp])  # the GPUs the poller sums, whatever their indices
    started = time.monotonic()
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / "log.txt", "w") as log:
        code = run_bounded(command, args.timeout_s, env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    row: dict[str, Any] = {"point": name, "exit": code, "wall_s": time.monotonic() - started,
                           "command": " ".join(command)}
    paths = sorted(run_dir.rglob("run_record.json"))
    if not paths:
        return {**row, "status": "no record"}
    record = json.loads(paths[0].read_text())
    metrics, steady = record["metrics"], next((w for w in record["windows"] if w["name"] == "steady"), None)
    row.update({"status": record["status"], "ms/token p50": 1e3 * (metrics.get("per_token_latency_median_s") or 0)
                or None, "J/output token": metrics.get("energy_per_output_token_j"),
                "W per GPU": metrics.get("mean_power_w_per_device"), "per_rank": record.get("per_rank")})
    energy = (steady or {}).get("energy") or {}
    if steady is None or energy.get("energy_j") is None:
        return row
    independent, uncertainty = poller.energy_j(steady["t_start_ns"], steady["t_end_ns"], uuids[:tp])
    row.update({"record J": energy["energy_j"], "independent J": independent, "independent_uncertainty_j": uncertainty,
                "deviation %": 100 * (energy["energy_j"] / independent - 1.0),
                "bound %": 100 * energy["error_bound_j"] / energy["energy_j"]})
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("tp_energy"))
    parser.add_argument("--preset", default="llama-8b")
    parser.add_argument("--task", default="chat")
    parser.add_argument("--points", type=lambda s: [_point(p) for p in s.split(",")], default=[(2, 1), (1, 1)],
                        help="comma list of TPxBATCH, e.g. 2x1,1x1")
    parser.add_argument("--target", type=float, default=0.5, help="largest |deviation| in %%")
    parser.add_argument("--timeout-s", type=float, default=540.0, help="per point")
    own, driver = split_at_double_dash(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(own)
    args.driver_args = driver
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    with CounterPoller() as poller:
        uuids = list(poller.handles)
        for tp, batch in args.points:
            row = run_point(tp, batch, args, poller, uuids)
            rows.append(row)
            print("TP_POINT " + json.dumps(row, default=str), flush=True)
    print(markdown_table(rows, HEADER, digits=4))
    good = all(r.get("status") == "OK" and r.get("deviation %") is not None and abs(r["deviation %"]) <= args.target
               for r in rows)
    return 0 if good else 1


if __name__ == "__main__":
    sys.exit(main())
