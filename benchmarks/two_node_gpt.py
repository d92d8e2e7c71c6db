"""Two node identities on two real GPUs: combined energy against independent counter reads (issue 21).

    python benchmarks/two_node_gpt.py --out /tmp/tn --steady-seconds 30       # three cases, ~6 min, 2 GPUs

As a Slurm job on two nodes does, the script starts one `jpwr serve` per node identity (JPWR_NODE_NAME n1, n2,
each restricted by CUDA_VISIBLE_DEVICES to what it meters) and one GPT-800M rank per node identity
(`python -m llm_training train --model 800M`, default settings, torch.distributed over NCCL, LOCAL_RANK 0 so each
rank leads its node), then `jpwr combine` over the node directories. Each rank's own GPU is its cuda:0; the
other GPU stays visible to it (listed second) so NCCL can use the GPUs' direct link, as on a real node pair it
would use the network. Cases:

* single: n1 alone on GPU 0, one rank: the per-GPU tokens/s baseline of the same run.
* dp2: n1 meters GPU 0, n2 GPU 1, data parallel over both. The record's and combine's energy must equal the sum
  of the two GPUs' independent counter reads over the record's steady window within --tolerance (0.5 %), each
  GPU listed once; tokens/s per GPU must stay >= --scaling (95 %) of single's.
* overlap: both samplers meter both GPUs: each GPU counted once, the overlap named, never summed twice.

A thread of this process reads both GPUs' energy counters on its own (benchmarks.common.CounterPoller, no jpwr
code). What this does not run: the job script (`jube/job.sh`) itself, whose `local` system has one node identity;
on a cluster the same steps come from srun. Prints one `TWO_NODE {json}` line per case and a Markdown table;
exit status 1 if a check fails.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # run as a script from a checkout

from benchmarks.common import CounterPoller, markdown_table  # noqa: E402 (needs REPO on sys.path)
from benchmarks.device_counting import _free_port, _serve  # noqa: E402

CASES = ("single", "dp2", "overlap")


def layout(case: str, uuids: list[str]) -> tuple[dict[str, str], list[str]]:
    """What each node's sampler sees, and each rank's node (rank i runs on GPU i)."""
    both = ",".join(uuids)
    if case == "single":
        return {"n1": uuids[0]}, ["n1"]
    if case == "dp2":
        return {"n1": uuids[0], "n2": uuids[1]}, ["n1", "n2"]
    return {"n1": both, "n2": both}, ["n1", "n2"]


def run_case(case: str, uuids: list[str], args: argparse.Namespace, poller: CounterPoller) -> dict[str, Any]:
    out = Path(args.out) / case
    out.mkdir(parents=True, exist_ok=True)
    socket = os.path.join(tempfile.gettempdir(), f"jpwr-tn-{os.getpid()}-{case}-{{node}}.sock")
    base = {**os.environ, "JPWR_ADDR": socket, "JPWR_RUN_ID": case,
            "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    metered, rank_nodes = layout(case, uuids)
    serves = [_serve(node, {**base, "CUDA_VISIBLE_DEVICES": seen}, out, args.timeout_s)
              for node, seen in metered.items()]
    world, port = len(rank_nodes), str(_free_port())
    train = [sys.executable, "-m", "llm_training", "train", "--model", "800M", "--device", "cuda",
             "--out-dir", str(out / "run")]
    if args.steady_seconds is not None:
        train += ["--steady-seconds", str(args.steady_seconds)]
    ranks = []
    for rank, node in enumerate(rank_nodes):
        own_first = ",".join([uuids[rank], *[u for u in uuids if u != uuids[rank]]])
        env = {**base, "CUDA_VISIBLE_DEVICES": own_first, "JPWR_NODE_NAME": node, "RANK": str(rank),
               "WORLD_SIZE": str(world), "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "GROUP_RANK": str(rank),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
        with open(out / f"rank{rank}.log", "w") as log:
            ranks.append(subprocess.Popen(train, env=env, stdout=log, stderr=subprocess.STDOUT))
    try:
        codes = [proc.wait(timeout=args.timeout_s) for proc in ranks]
    finally:
        for proc in ranks:
            if proc.poll() is None:
                proc.kill()
        serve_stderr = []
        for proc in serves:
            proc.send_signal(signal.SIGTERM)
            serve_stderr.append(proc.communicate(timeout=60)[1])
        (out / "serve.stderr").write_text("\n".join(serve_stderr))
    if any(codes):
        raise RuntimeError(f"case {case}: rank exit codes {codes} (logs: {out}/rank*.log)")
    combine = subprocess.run([sys.executable, "-m", "jpwr", "combine", str(out), "--run-id", case,
                              "--expected-nodes", str(len(metered))], env=base, capture_output=True, text=True,
                             timeout=120, check=True)
    (out / "combine.stdout").write_text(combine.stdout)
    return evaluate(case, uuids[:world], out, combine.stdout, args, poller)


def evaluate(case: str, uuids: list[str], out: Path, combine_stdout: str, args: argparse.Namespace,
             poller: CounterPoller) -> dict[str, Any]:
    record = json.loads((out / "run" / "run_record.json").read_text())
    steady = next(w for w in record["windows"] if w["name"] == "steady")
    energy = steady["energy"]
    combined = json.loads((out / "summary.json").read_text())["windows"]["steady"]["energy"]
    independent_j, independent_bound_j = poller.energy_j(steady["t_start_ns"], steady["t_end_ns"], uuids)
    deviation = energy["energy_j"] / independent_j - 1.0
    checks = {
        "record_lists_each_gpu_once": energy["devices"] == len(uuids),
        "combine_lists_each_gpu_once": combined["devices"] == len(uuids),
        "within_tolerance": abs(deviation) <= args.tolerance,
        "within_stated_bounds":
            abs(energy["energy_j"] - independent_j) <= energy["error_bound_j"] + independent_bound_j,
        "combine_agrees_with_the_record": abs(combined["energy_j"] - energy["energy_j"]) <= energy["error_bound_j"],
    }
    if case == "overlap":
        named = [w for w in energy["warnings"] + combined["warnings"] if "n1" in w and "n2" in w and "Fix:" in w]
        checks["overlap_named"] = bool(named) and "counted once" in combine_stdout
    return {
        "case": case, "gpus": len(uuids), "status": record["status"], "steady_s": steady["duration_s"],
        "tokens_per_s_per_device": record["metrics"].get("tokens_per_s_per_device"),
        "record_energy_j": energy["energy_j"], "record_bound_j": energy["error_bound_j"],
        "record_devices": energy["devices"], "combine_energy_j": combined["energy_j"],
        "independent_j": independent_j, "independent_uncertainty_j": independent_bound_j, "deviation": deviation,
        "warnings": energy["warnings"], "checks": checks,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="two_node_out")
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--steady-seconds", type=float, default=None, help="default: jpwr's sizing rule")
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
            except (RuntimeError, subprocess.SubprocessError, OSError, ValueError, KeyError) as exc:
                result = {"case": case, "error": f"{type(exc).__name__}: {exc}", "checks": {"ran": False}}
            results.append(result)
            print("TWO_NODE " + json.dumps(result), flush=True)
    by_case = {r["case"]: r for r in results}
    single, dp2 = by_case.get("single", {}), by_case.get("dp2", {})
    if single.get("tokens_per_s_per_device") and dp2.get("tokens_per_s_per_device"):
        ratio = dp2["tokens_per_s_per_device"] / single["tokens_per_s_per_device"]
        dp2["scaling_vs_single"] = ratio
        dp2["checks"]["scaling_per_gpu"] = ratio >= args.scaling
    for r in results:
        r["ok"] = all(r["checks"].values())
    print(markdown_table(results, ["case", "gpus", "status", "steady_s", "tokens_per_s_per_device",
                                   "scaling_vs_single", "record_energy_j", "record_bound_j", "combine_energy_j",
                                   "independent_j", "deviation", "ok"]))
    Path(args.out, "results.json").write_text(json.dumps(results, indent=1))
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
