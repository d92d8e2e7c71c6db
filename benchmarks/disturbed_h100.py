#!/usr/bin/env python3
"""A disturbed run is named (issue 32 item 5): GPT-800M with its defaults alone, then beside a competing process.

    PYTHONUNBUFFERED=1 python benchmarks/disturbed_h100.py --out $OUT/disturbed --wheel '.whl/megatron_core-*.whl'

Both runs are `jpwr --methods nvml -- python -m llm_training train --model 800M` (the README's command, steady
window sized by the bound rule, idle baseline taken) on the first GPU. The second runs beside a bf16 matmul loop that
this script starts itself on the same GPU (a second process, jpwr's selftest load, capped below 10 GiB of GPU
memory); the loop is stopped on every exit path: the script kills it in a `finally`, at exit and on SIGTERM/SIGINT,
the kernel kills it when the script dies (PR_SET_PDEATHSIG), and it stops by itself after --compete-s.
Expected: the first record not disturbed, the second disturbed with the loop's PID named among the other processes.
Writes results.md and results.json to --out (each run's record and jpwr files beside them) and prints the table.
"""

from __future__ import annotations

import argparse
import atexit
import ctypes
import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.common import first_gpus_env, markdown_table, write_results  # noqa: E402 (the repository on sys.path)
from benchmarks.llm_h100 import ensure_megatron  # noqa: E402
from joulebench.bounded_run import run_bounded  # noqa: E402

GIB = 2**30
COMPETITOR_GIB = 10  # the loop's memory cap (its two 8192² bf16 operands and product take 0.4 GiB)
HEADER = ("run", "status", "disturbed", "competitor pid", "competitor named", "tokens/s", "steady s", "energy Wh",
          "tokens/Wh", "W/dev", "method", "coverage", "step CV", "load > cores", "reasons")


def compete(seconds: float) -> None:
    """The competing process: jpwr's selftest matmul load on the current GPU until `seconds` have passed."""
    import torch

    from jpwr.selftest_load import matmul_operands, matmuls_until

    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, COMPETITOR_GIB * GIB / total))
    a, b = matmul_operands(torch)
    matmuls_until(torch, a, b, time.monotonic() + 1.0)
    print(f"READY {torch.cuda.max_memory_reserved() / GIB:.2f} GiB", flush=True)
    matmuls_until(torch, a, b, time.monotonic() + seconds)


def _die_with_parent() -> None:
    """In the competitor before exec: the kernel sends it SIGKILL when this script dies, however it dies."""
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class Competitor:
    """The matmul loop as a child process, stopped on every way out of this script."""

    def __init__(self, env: dict[str, str], seconds: float) -> None:
        self.proc = subprocess.Popen([sys.executable, __file__, "--compete-s", str(seconds)], env=env, cwd=REPO,
                                     stdout=subprocess.PIPE, text=True, preexec_fn=_die_with_parent)
        atexit.register(self.stop)
        self.ready = self.proc.stdout.readline().strip() if self.proc.stdout else ""
        if not self.ready.startswith("READY"):
            self.stop()
            raise RuntimeError(f"the competing process did not start (exit {self.proc.returncode})")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def run_driver(name: str, out: Path, env: dict[str, str], timeout_s: float) -> int | str:
    """One `jpwr -- python -m llm_training train --model 800M` in its own session (stopped whole on a timeout)."""
    run_dir = out / name
    cmd = [sys.executable, "-m", "jpwr", "--methods", "nvml", "--out", str(run_dir / "jpwr"), "--run-id", name, "--",
           sys.executable, "-m", "llm_training", "train", "--model", "800M", "--out-dir", str(run_dir),
           "--run-id", name]
    print(f"=== {name}: {' '.join(cmd)}", flush=True)
    started = time.monotonic()
    with open(out / f"{name}.log", "w") as log:
        code = run_bounded(cmd, timeout_s, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    print(f"=== {name}: exit {code} after {time.monotonic() - started:.0f} s", flush=True)
    return code


def row(name: str, out: Path, code: int | str, competitor_pid: int | None) -> dict[str, Any]:
    path = out / name / "run_record.json"
    if not path.is_file():
        return {"run": name, "status": f"no record (exit {code})"}
    record = json.loads(path.read_text())
    m, block = record.get("metrics", {}), record.get("disturbed") or {}
    checks = block.get("checks", {})
    others = checks.get("other_processes") or {}
    named = [p["pid"] for p in others.get("value") or []]
    hidden = [str(p["pid"]) for p in others.get("value") or [] if p.get("name") is None]
    if competitor_pid is None:
        found = "n/a"
    elif competitor_pid in named:
        found = "by its PID"
    else:  # NVML's PIDs from another PID namespace: the record names them by their own number and memory
        found = f"as hidden PIDs {', '.join(hidden)}" if hidden else "no"
    return {"run": name, "status": record["status"], "disturbed": str(block.get("disturbed", "no block")),
            "competitor pid": competitor_pid, "competitor named": found, "tokens/s": m.get("tokens_per_s"),
            "steady s": m.get("duration_s"),
            "energy Wh": m.get("energy_wh"), "tokens/Wh": m.get("tokens_per_wh"),
            "W/dev": m.get("mean_power_w_per_device"), "method": m.get("energy_method"),
            "coverage": m.get("energy_coverage"), "step CV": (checks.get("step_time_cv") or {}).get("value"),
            "load > cores": (checks.get("host_load") or {}).get("value"),
            "reasons": " / ".join(block.get("reasons") or []) or "-", "record": str(path)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="disturbed")
    parser.add_argument("--wheel", help="megatron-core wheel (glob) to use when megatron.core is not importable")
    parser.add_argument("--timeout-s", type=float, default=240.0, help="per run")
    parser.add_argument("--compete-s", type=float, help=argparse.SUPPRESS)  # the competing process itself
    args = parser.parse_args(argv)
    if args.compete_s is not None:
        compete(args.compete_s)
        return 0
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    env = {**first_gpus_env(1, ensure_megatron(args.wheel, out / "deps")), "PYTHONUNBUFFERED": "1"}
    for signum in (signal.SIGTERM, signal.SIGINT):  # the finally below and atexit run on these too
        signal.signal(signum, lambda s, _f: sys.exit(128 + s))
    rows = [row("alone", out, run_driver("alone", out, env, args.timeout_s), None)]
    write_results(out, markdown_table(rows, HEADER, digits=5) + "\n", rows)  # kept if the second run cannot start
    competitor = Competitor(env, seconds=args.timeout_s + 30)
    try:
        print(f"=== competitor pid {competitor.proc.pid}: {competitor.ready}", flush=True)
        code = run_driver("beside-matmul", out, env, args.timeout_s)
    finally:
        competitor.stop()
    rows.append(row("beside-matmul", out, code, competitor.proc.pid))
    text = markdown_table(rows, HEADER, digits=5)
    write_results(out, text + "\n", rows)
    print(text)
    expected = rows[0].get("disturbed") == "False" and rows[1].get("competitor named", "no") != "no"
    print(f"DISTURBED_CHECK {'met' if expected else 'NOT met'}", flush=True)
    return 0 if expected else 1


if __name__ == "__main__":
    sys.exit(main())
