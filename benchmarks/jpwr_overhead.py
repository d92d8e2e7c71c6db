"""Meter overhead: matmul throughput with a `jpwr serve` sampler running vs. not, alternating.

    python benchmarks/jpwr_overhead.py --alternations 10 --seconds 3

The sampler runs as a separate process, as in a job (one per node); each alternation measures
the load once with it and once without (order alternating), after the sampler is ready.
Prints per-alternation rates and the median relative change with its spread.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch


def rate(a: torch.Tensor, b: torch.Tensor, seconds: float) -> float:
    torch.cuda.synchronize()
    t0 = time.monotonic()
    done = 0
    while time.monotonic() - t0 < seconds:
        for _ in range(8):
            a @ b
        torch.cuda.synchronize()
        done += 8
    return done / (time.monotonic() - t0)


def start_sampler(out: Path, interval_ms: float) -> subprocess.Popen:
    env = dict(os.environ, JPWR_ADDR=str(out / "s-{node}.sock"), JPWR_RUN_ID="overhead")
    proc = subprocess.Popen([sys.executable, "-m", "jpwr", "serve", "--methods", "nvml", "--out", str(out),
                             "--interval", str(interval_ms)], env=env, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not list(out.glob("*/ready")):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("jpwr serve did not start")
        time.sleep(0.05)
    return proc


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--alternations", type=int, default=10)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--interval", type=float, default=100.0, help="sampler interval in ms")
    args = parser.parse_args()
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    rate(a, b, 3.0)  # warm-up to steady clocks
    rows = []
    for i in range(args.alternations):
        measured = {}
        for on in ((True, False) if i % 2 == 0 else (False, True)):
            if on:
                with tempfile.TemporaryDirectory() as tmp:
                    proc = start_sampler(Path(tmp), args.interval)
                    measured["on"] = rate(a, b, args.seconds)
                    proc.send_signal(signal.SIGTERM)
                    proc.wait()
            else:
                measured["off"] = rate(a, b, args.seconds)
        change = measured["on"] / measured["off"] - 1.0
        rows.append({"alternation": i, **measured, "change": change})
        print(f"alternation {i:2d}: on {measured['on'] * 2 * n**3 / 1e12:7.1f} TFLOP/s  "
              f"off {measured['off'] * 2 * n**3 / 1e12:7.1f} TFLOP/s  change {change * 100:+.2f}%", flush=True)
    changes = [r["change"] for r in rows]
    summary = {"median_change": statistics.median(changes), "min_change": min(changes), "max_change": max(changes),
               "stdev_change": statistics.stdev(changes) if len(changes) > 1 else None,
               "alternations": len(rows), "seconds_each": args.seconds, "interval_ms": args.interval}
    print("JPWR_OVERHEAD " + json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
