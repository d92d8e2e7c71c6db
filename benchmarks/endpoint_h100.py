"""What the engine costs: `transformers serve` and the in-process engine on the same requests, one GPU, one table.

    sh benchmarks/fetch_serving_wheels.sh            # here: the server's wheels into .whl/ (the GPU machine is offline)
    python benchmarks/endpoint_h100.py --out /tmp/endpoint --runs http,engine --rates 2,6,12,max

The model is the preset saved once with `python -m llm_inference save-checkpoint` (random weights, no EOS, word-level
tokenizer); both runs load it and draw the same requests (same seed, task and rates). Runs, each a separate
`python -m llm_inference load` process metering the GPU in-process with NVML:
* http: the load sent to `transformers serve` started by the driver (SERVE below) on the same GPU;
* engine: the same load on the in-process continuous-batching engine (its records also carry the measured error
  of the client-side estimate: its requests rebuilt as a client sees them, against its own step stamps).
A thread of this process reads the GPU's energy counter throughout (benchmarks.common.CounterPoller); each record's
steady window is compared with it. Prints one `ENDPOINT {json}` line per record and a Markdown table.
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
    exit_status,
    first_gpu_uuid,
    first_gpus_env,
    markdown_table,
)
from benchmarks.serving_h100 import rows_of  # noqa: E402
from joulebench.bounded_run import run_bounded  # noqa: E402

SERVE = "transformers serve {model} --device cuda --host {host} --port {port} --continuous-batching"
VERSION = "python3 -c 'import importlib.metadata as m; print(m.version(\"transformers\"))'"
HEADER = ("run", "status", "rate", "tokens/s", "J/output token", "bound %", "deviation %", "J/request p50",
          "J/request p90", "TTFT p90 ms", "TPOT p90 ms", "estimate error p50 %", "estimate error p90 %", "window s")


def _extra(row: dict[str, Any]) -> None:
    metrics, energy = row.get("metrics") or {}, ((row.get("requests") or {}).get("energy") or {})
    error = energy.get("client_side_estimate_error") or {}
    row.update({"J/request p50": metrics.get("energy_per_request_p50_j"),
                "J/request p90": metrics.get("energy_per_request_p90_j"),
                "TPOT p90 ms": 1e3 * (metrics.get("tpot_p90_s") or float("nan")),
                "estimate error p50 %": 100 * error["relative_error_p50"] if error.get("relative_error_p50") else None,
                "estimate error p90 %": 100 * error["relative_error_p90"] if error.get("relative_error_p90") else None})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="endpoint")
    parser.add_argument("--runs", default="http,engine")
    parser.add_argument("--preset", default="llama-1b")
    parser.add_argument("--rates", default="2,6,12,max")
    parser.add_argument("--max-concurrency", type=int, default=64)
    parser.add_argument("--window-s", type=float, default=30.0)
    parser.add_argument("--timeout-s", type=float, default=560.0, help="per run")
    args = parser.parse_args(argv)
    uuid = first_gpu_uuid()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    checkpoint = out / "checkpoint"
    env = {**first_gpus_env(1), "CUDA_VISIBLE_DEVICES": uuid, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1"}
    if not (checkpoint / "config.json").exists():
        subprocess.run([sys.executable, "-m", "llm_inference", "save-checkpoint", "--preset", args.preset, "--out",
                        str(checkpoint)], env=env, cwd=REPO, check=True)
    load = [sys.executable, "-m", "llm_inference", "load", "--checkpoint", str(checkpoint), "--task", "chat",
            "--rates", args.rates, "--max-concurrency", str(args.max_concurrency), "--steady-seconds",
            str(args.window_s), "--energy-methods", "nvml", "--slo-ttft-ms", "2000", "--slo-tpot-ms", "100"]
    runs = {"http": [*load, "--server-command", SERVE, "--server-version-command", VERSION, "--server-devices", uuid],
            "engine": load}
    rows: list[dict[str, Any]] = []
    with CounterPoller([uuid]) as poller:
        for name in args.runs.split(","):
            started = time.monotonic()
            command = [*runs[name], "--out-dir", str(out / name)]
            with open(out / f"{name}.log", "w") as log:
                run_bounded(command, args.timeout_s, env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
            found = rows_of(name, out / name, uuid, poller) or [{"run": name, "status": "no record"}]
            for row in found:
                _extra(row)
                row.update(command=" ".join(command), wall_s=time.monotonic() - started)
                print("ENDPOINT " + json.dumps(row, default=str), flush=True)
            rows.extend(found)
    print(markdown_table(rows, HEADER, digits=4))
    return exit_status(rows)


if __name__ == "__main__":
    sys.exit(main())
