"""Two node identities on two real GPUs through the JUBE workflow: combined energy against independent reads (issue 21).

    python benchmarks/two_node_gpt.py --out /tmp/tn --jube /tmp/site/bin/jube --steady-seconds 30   # ~6 min, 2 GPUs

Each case is the README's `jube run jube/llm_benchmark.xml` on the `local` system (GPT-800M, the one-GPU node's
settings), so the job script does what it does on a cluster: one `jpwr serve` per node identity, the ranks,
`jpwr combine`. Cases (profile keys through JOULEBENCH_* variables):

* single: nodes = 1 on GPU 0 (CUDA_VISIBLE_DEVICES): the per-GPU tokens/s baseline of the same session.
* dp2: nodes = 2: node identities <host>-n0 and <host>-n1, each with its GPU and its sampler, data parallel.
  The record's and combine's energy must equal the sum of the two GPUs' independent counter reads over the
  record's steady window within --tolerance (0.5 %), each GPU listed once; tokens/s per GPU must stay at or
  above --scaling (95 %) of single's.
* overlap: nodes = 2 with local_node_devices = all: both samplers meter both GPUs; each is counted once and the
  overlap is named.

A thread of this process reads both GPUs' energy counters on its own (benchmarks.common.CounterPoller, no jpwr
code). Prints one `TWO_NODE {json}` line per case and a Markdown table; exit status 1 if a check fails.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # run as a script from a checkout

from benchmarks.common import CounterPoller, markdown_table, write_results  # noqa: E402 (needs REPO on sys.path)
from joulebench.bounded_run import run_bounded  # noqa: E402

CASES = {  # profile overrides per case; single also hides GPU 1 from the job
    "single": {"JOULEBENCH_NODES": "1"},
    "dp2": {"JOULEBENCH_NODES": "2", "JOULEBENCH_LOCAL_NODE_DEVICES": "own"},
    "overlap": {"JOULEBENCH_NODES": "2", "JOULEBENCH_LOCAL_NODE_DEVICES": "all"},
}


def run_case(case: str, uuids: list[str], args: argparse.Namespace, poller: CounterPoller) -> dict[str, Any]:
    out = Path(args.out).resolve() / case
    env = {**os.environ, **CASES[case], "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    if args.steady_seconds is not None:
        env["JOULEBENCH_STEADY_SECONDS"] = str(args.steady_seconds)
    if case == "single":
        env["CUDA_VISIBLE_DEVICES"] = uuids[0]
    command = [args.jube, "run", "jube/llm_benchmark.xml", "--outpath", str(out), "-e"]
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f"{case}.log", "w") as log:
        run_bounded(command, args.timeout_s, env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    (record_path,) = out.rglob("run_record.json")
    record = json.loads(record_path.read_text())
    summary = json.loads((record_path.parent / "energy" / "summary.json").read_text())
    used = uuids[:1] if case == "single" else uuids
    return evaluate(case, used, record, summary, args, poller)


def evaluate(case: str, uuids: list[str], record: dict[str, Any], summary: dict[str, Any],
             args: argparse.Namespace, poller: CounterPoller) -> dict[str, Any]:
    steady = next(w for w in record["windows"] if w["name"] == "steady")
    energy = steady["energy"]
    combined = summary["windows"]["steady"]["energy"]
    independent_j, independent_bound_j = poller.energy_j(steady["t_start_ns"], steady["t_end_ns"], uuids)
    deviation = energy["energy_j"] / independent_j - 1.0
    checks = {
        "status_ok": record["status"] == "OK",
        "record_lists_each_gpu_once": energy["devices"] == len(uuids),
        "combine_lists_each_gpu_once": combined["devices"] == len(uuids),
        "within_tolerance": abs(deviation) <= args.tolerance,
        "within_stated_bounds":
            abs(energy["energy_j"] - independent_j) <= energy["error_bound_j"] + independent_bound_j,
        "combine_agrees_with_the_record": abs(combined["energy_j"] - energy["energy_j"]) <= energy["error_bound_j"],
    }
    overlap = [w for w in combined["warnings"] if "metered by the samplers of nodes" in w]
    checks["overlap_named" if case == "overlap" else "no_overlap"] = bool(overlap) == (case == "overlap")
    return {
        "case": case, "gpus": len(uuids), "nodes": ",".join(combined.get("nodes", [])), "status": record["status"],
        "steady_s": steady["duration_s"], "tokens_per_s_per_device": record["metrics"].get("tokens_per_s_per_device"),
        "record_energy_j": energy["energy_j"], "record_bound_j": energy["error_bound_j"],
        "record_devices": energy["devices"], "combine_energy_j": combined["energy_j"],
        "independent_j": independent_j, "independent_uncertainty_j": independent_bound_j, "deviation": deviation,
        "warnings": combined["warnings"], "checks": checks,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="two_node_out")
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--jube", default="jube", help="the jube command")
    parser.add_argument("--steady-seconds", type=float, default=None, help="default: the drivers' sizing rule")
    parser.add_argument("--tolerance", type=float, default=0.005)
    parser.add_argument("--scaling", type=float, default=0.95, help="least DP=2 tokens/s per GPU against single")
    parser.add_argument("--timeout-s", type=float, default=300.0, help="per case")
    args = parser.parse_args(argv)
    import pynvml

    pynvml.nvmlInit()
    if pynvml.nvmlDeviceGetCount() < 2:
        print("two_node_gpt: this machine has fewer than 2 GPUs. Fix: run it on a 2-GPU machine", file=sys.stderr)
        return 2
    uuids = []
    for index in range(2):
        raw = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(index))
        uuids.append(raw.decode() if isinstance(raw, bytes) else raw)
    results: list[dict[str, Any]] = []
    with CounterPoller(uuids) as poller:
        for case in args.cases.split(","):
            try:
                result = run_case(case, uuids, args, poller)
            except (subprocess.SubprocessError, OSError, ValueError, KeyError, StopIteration) as exc:
                result = {"case": case, "error": f"{type(exc).__name__}: {exc}", "checks": {"ran": False}}
            results.append(result)
            print("TWO_NODE " + json.dumps(result), flush=True)
            write_results(Path(args.out), table(results), results)  # each case kept as it ends
    by_case = {r["case"]: r for r in results}
    single, dp2 = by_case.get("single", {}), by_case.get("dp2", {})
    if single.get("tokens_per_s_per_device") and dp2.get("tokens_per_s_per_device"):
        dp2["scaling_vs_single"] = dp2["tokens_per_s_per_device"] / single["tokens_per_s_per_device"]
        dp2["checks"]["scaling_per_gpu"] = dp2["scaling_vs_single"] >= args.scaling
    for r in results:
        r["ok"] = all(r["checks"].values())
    text = table(results)
    print(text)
    write_results(Path(args.out), text, results)
    return 0 if all(r["ok"] for r in results) else 1


def table(results: list[dict[str, Any]]) -> str:
    return markdown_table(results, ["case", "gpus", "nodes", "status", "steady_s", "tokens_per_s_per_device",
                                    "scaling_vs_single", "record_energy_j", "record_bound_j", "combine_energy_j",
                                    "independent_j", "deviation", "ok"])


if __name__ == "__main__":
    sys.exit(main())
