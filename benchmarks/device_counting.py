"""Each device counted once, on a real sensor: two node identities on one host, one `jpwr serve` each (issue 20).

    python benchmarks/device_counting.py --out /tmp/dc          # both cases on this machine's first GPU, ~3 min

As a job script does on two nodes, the script starts `jpwr serve` twice with distinct JPWR_NODE_NAME (n1, n2)
and one rank per node identity (torch.distributed over gloo, LOCAL_RANK 0, so each rank leads its "node"):

* shared: both samplers meter the same GPU. The energy the ranks combine (WindowMeter.attach_energy, what the
  drivers put in the record) and `jpwr combine` must count it once, with a warning naming n1, n2 and the fix.
* disjoint: n1 meters the GPU (CUDA_VISIBLE_DEVICES=<its UUID>), n2 none (CUDA_VISIBLE_DEVICES=""). The
  combined energy must equal an independent read of the GPU's counter over the same window within
  --tolerance (0.5 %), and n2 must say that it metered nothing.

Each case: idle baseline, warm-up steps that time the step, a steady window sized by jpwr's rule (or
--steady-seconds) in which rank 0 runs bf16 matmuls (--load sleep: no GPU work, for the CPU test with the
fake NVML). Every step ends in a barrier, as a data-parallel step ends in its all-reduce. A thread of this
process reads the GPU's counter on its own (benchmarks.common.CounterPoller) and is interpolated at the
record's steady-window edges. Prints one `DEVICE_COUNTING {json}` line per case; exit status 1 if a check fails.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # run as a script from a checkout

from benchmarks.common import CounterPoller  # noqa: E402 (needs REPO on sys.path)

CASES = ("shared", "disjoint")
NODES = ("n1", "n2")


def _gather(dist: Any) -> Any:
    def gather(obj: object) -> list[object]:
        out: list[object] = [None] * dist.get_world_size()
        dist.all_gather_object(out, obj)
        return out

    return gather


def rank_worker(args: argparse.Namespace) -> int:
    """One rank: idle baseline, timed warm-up, a planned steady window; rank 0 writes what it combined."""
    import torch
    import torch.distributed as dist

    from joulebench.launch import LaunchEnv
    from joulebench.sizing import StepTimer, plan_steady
    from jpwr import IdlePlan, SettleRule, WindowMeter
    from jpwr.output import write_json_atomic

    launch = LaunchEnv.from_env()
    dist.init_process_group("gloo")
    gather = _gather(dist)
    loads = launch.rank == 0 and args.load == "matmul"
    if loads:
        from jpwr.selftest_load import matmul_operands

        a, b = matmul_operands(torch)
    sync = torch.cuda.synchronize if loads else None

    def step() -> None:
        if loads:
            for _ in range(args.matmuls_per_step):
                a @ b
            torch.cuda.synchronize()
        else:
            time.sleep(args.sleep_step_s)
        dist.barrier()

    meter = WindowMeter.open(launch, sync=sync)
    meter.measure_idle(IdlePlan(SettleRule(max_wait_s=args.settle_s), args.idle_s), gather)
    timer = StepTimer(sync)
    meter.begin("warmup", 0)
    timer.tick()
    for _ in range(args.warmup_steps):
        step()
        timer.tick()
    meter.end("warmup", args.warmup_steps)
    plan = plan_steady(meter, timer.step_s or args.sleep_step_s, args.steady_seconds, gather)
    meter.begin("steady", 0)
    for _ in range(plan.iterations):
        step()
    meter.end("steady", plan.iterations, work={"steps": plan.iterations}, reason=plan.end_reason(plan.iterations))
    meter.attach_energy(gather)
    if launch.rank == 0:
        write_json_atomic(args.result, {"windows": [w.to_dict() for w in meter.windows], "plan": plan.to_dict(),
                                        "idle": meter.idle.to_dict() if meter.idle else None})
    meter.close()
    dist.destroy_process_group()
    return 0


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _serve(node: str, env: dict[str, str], out: Path, timeout_s: float) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "jpwr", "serve", "--methods", "nvml", "--out", str(out)],
                            env={**env, "JPWR_NODE_NAME": node}, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + timeout_s
    while not (out / node / "ready").exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"jpwr serve for {node} did not start: {proc.stderr.read() if proc.stderr else ''}")
        time.sleep(0.05)
    return proc


def run_case(case: str, uuid: str, args: argparse.Namespace, poller: CounterPoller) -> dict[str, Any]:
    out = Path(args.out) / case
    out.mkdir(parents=True, exist_ok=True)
    socket = os.path.join(tempfile.gettempdir(), f"jpwr-dc-{os.getpid()}-{case}-{{node}}.sock")  # short: 107 bytes
    base = {**os.environ, "JPWR_ADDR": socket, "JPWR_RUN_ID": case,
            "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    visible = {"n1": uuid, "n2": uuid if case == "shared" else ""}
    serves = [_serve(node, {**base, "CUDA_VISIBLE_DEVICES": visible[node]}, out, args.timeout_s) for node in NODES]
    result_file = out / "ranks.json"
    port = str(_free_port())
    worker = [sys.executable, __file__, "--rank-worker", "--result", str(result_file), "--load", args.load,
              "--settle-s", str(args.settle_s), "--idle-s", str(args.idle_s), "--warmup-steps", str(args.warmup_steps),
              "--matmuls-per-step", str(args.matmuls_per_step), "--sleep-step-s", str(args.sleep_step_s)]
    if args.steady_seconds is not None:
        worker += ["--steady-seconds", str(args.steady_seconds)]
    ranks = [subprocess.Popen(worker, env={
        **base, "CUDA_VISIBLE_DEVICES": visible[node], "JPWR_NODE_NAME": node, "RANK": str(rank), "WORLD_SIZE": "2",
        "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port})
        for rank, node in enumerate(NODES)]
    codes = [proc.wait(timeout=args.timeout_s) for proc in ranks]
    stderr = []
    for proc in serves:
        proc.send_signal(signal.SIGTERM)
        stderr.append(proc.communicate(timeout=args.timeout_s)[1])
    if any(codes):
        raise RuntimeError(f"case {case}: rank exit codes {codes}")
    combine = subprocess.run([sys.executable, "-m", "jpwr", "combine", str(out), "--run-id", case], env=base,
                             capture_output=True, text=True, timeout=args.timeout_s, check=True)
    return evaluate(case, uuid, out, json.loads(result_file.read_text()), combine.stdout, stderr, args, poller)


def evaluate(case: str, uuid: str, out: Path, ranks: dict[str, Any], combine_stdout: str, serve_stderr: list[str],
             args: argparse.Namespace, poller: CounterPoller) -> dict[str, Any]:
    steady = next(w for w in ranks["windows"] if w["name"] == "steady")
    energy = steady["energy"]
    combined = json.loads((out / "summary.json").read_text())["windows"]["steady"]["energy"]
    independent_j, independent_bound_j = poller.energy_j(steady["t_start_ns"], steady["t_end_ns"], [uuid])
    deviation = energy["energy_j"] / independent_j - 1.0
    checks = {
        "record_counts_the_gpu_once": energy["devices"] == 1,
        "combine_counts_the_gpu_once": combined["devices"] == 1,
        "within_tolerance": abs(deviation) <= args.tolerance,
        "within_stated_bounds": abs(energy["energy_j"] - independent_j)
        <= energy["error_bound_j"] + independent_bound_j,
        "combine_agrees_with_the_record": abs(combined["energy_j"] - energy["energy_j"]) <= energy["error_bound_j"],
    }
    overlap = [w for w in energy["warnings"] + combined["warnings"] if "n1" in w and "n2" in w and "Fix:" in w]
    if case == "shared":
        checks["overlap_named_in_record_and_combine"] = (
            any(w in energy["warnings"] for w in overlap) and any(w in combined["warnings"] for w in overlap))
        checks["combine_prints_the_overlap"] = "counted once" in combine_stdout
    else:
        n2 = json.loads((out / "n2" / "summary.json").read_text())["windows"]["steady"]["energy"]
        checks["empty_node_metered_nothing"] = bool(n2["metered_nothing"]) and n2["energy_j"] is None
        checks["empty_node_named_in_record"] = any("node n2 metered no accelerators" in w for w in energy["warnings"])
        checks["empty_node_says_so_itself"] = "n2 metered no accelerators" in serve_stderr[1]
    return {
        "case": case, "gpu": uuid, "steady_s": steady["duration_s"], "plan": ranks["plan"]["reason"],
        "record_energy_j": energy["energy_j"], "record_bound_j": energy["error_bound_j"],
        "record_devices": energy["devices"], "combine_energy_j": combined["energy_j"],
        "independent_j": independent_j, "independent_uncertainty_j": independent_bound_j, "deviation": deviation,
        "idle_power_w": ranks["idle"]["power_w"], "warnings": energy["warnings"], "checks": checks,
        "ok": all(checks.values()),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="device_counting_out")
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--gpu", type=int, default=0, help="NVML index of the GPU both node identities use")
    parser.add_argument("--load", choices=("matmul", "sleep"), default="matmul")
    parser.add_argument("--steady-seconds", type=float, default=None, help="default: jpwr's sizing rule")
    parser.add_argument("--warmup-steps", type=int, default=5)
    parser.add_argument("--matmuls-per-step", type=int, default=25)
    parser.add_argument("--sleep-step-s", type=float, default=0.05)
    parser.add_argument("--settle-s", type=float, default=30.0, help="longest cooldown wait before the idle baseline")
    parser.add_argument("--idle-s", type=float, default=3.0)
    parser.add_argument("--tolerance", type=float, default=0.005)
    parser.add_argument("--timeout-s", type=float, default=240.0)
    parser.add_argument("--rank-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--result", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.rank_worker:
        return rank_worker(args)
    import pynvml

    pynvml.nvmlInit()
    raw = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(args.gpu))
    uuid = raw.decode() if isinstance(raw, bytes) else raw
    ok = True
    with CounterPoller([uuid]) as poller:
        for case in args.cases.split(","):
            result = run_case(case, uuid, args, poller)
            ok = ok and result["ok"]
            print("DEVICE_COUNTING " + json.dumps(result), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
