"""Meter overhead: throughput with a `jpwr serve` sampler running vs. not (or with phase marks on vs. off),
alternating, in one job.

    python benchmarks/jpwr_overhead.py --alternations 10 --seconds 3                 # bf16 8192³ matmul
    python benchmarks/jpwr_overhead.py --workload llm --steps 5 -- --model 800M     # GPT-800M training steps
    python benchmarks/jpwr_overhead.py --compare phase-marks --workload llm --steps 5 -- --model 800M

The training workloads are built once, exactly as `benchmarks/kernel_profile.py` builds them
(options after `--` go to the driver's own parser), and each segment runs --steps steps.

--compare sampler (default): the sampler runs as a separate process, as in a job (one per node); each
alternation measures the load once with it and once without (order alternating), after the sampler is ready.
--compare phase-marks: one sampler for the whole run; every segment is a window, and the driver's phase
marks (CUDA events, jpwr.phases) are switched on in one segment of each alternation and off in the other;
converting and sending a window's marks happens after its end edge, outside the timed steps, as in a run.
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
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.common import split_at_double_dash
from benchmarks.kernel_profile import WORKLOADS, Workload
from joulebench.launch import LaunchEnv
from jpwr import ADDR_ENV, WindowMeter
from jpwr.phases import DeviceEventStamps
from jpwr.selftest_load import MATMUL_N, matmul_operands, matmuls_until


def matmul_rate(a: torch.Tensor, b: torch.Tensor, seconds: float) -> float:
    torch.cuda.synchronize()
    t0 = time.monotonic()
    return matmuls_until(torch, a, b, t0 + seconds) / (time.monotonic() - t0)


def start_sampler(out: Path, interval_ms: float, counter_interval_ms: float) -> subprocess.Popen:
    env = dict(os.environ, JPWR_ADDR=str(out / "s-{node}.sock"), JPWR_RUN_ID="overhead")
    proc = subprocess.Popen([sys.executable, "-m", "jpwr", "serve", "--methods", "nvml", "--out", str(out),
                             "--interval", str(interval_ms), "--counter-interval", str(counter_interval_ms)],
                            env=env, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not list(out.glob("*/ready")):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("jpwr serve did not start")
        time.sleep(0.05)
    return proc


def steps_rate(step: Callable[[], object], steps: int) -> float:
    torch.cuda.synchronize()
    t0 = time.monotonic()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    return steps / (time.monotonic() - t0)


def build_load(args: argparse.Namespace, workload_argv: list[str]
               ) -> tuple[Callable[[], float], str, float, Callable[[], None], Workload | None]:
    """(one segment's rate, its unit, factor to that unit, release, the training workload) for the chosen
    workload, warmed up."""
    if args.workload == "matmul":
        a, b = matmul_operands(torch)
        matmul_rate(a, b, 3.0)  # warm-up to steady clocks
        return (lambda: matmul_rate(a, b, args.seconds)), "TFLOP/s", 2 * MATMUL_N**3 / 1e12, (lambda: None), None
    workload = WORKLOADS[args.workload](workload_argv)
    for _ in range(args.warmup):
        workload.step()
    return (lambda: steps_rate(workload.step, args.steps)), "steps/s", 1.0, workload.close, workload


def sampler_on_off(measure: Callable[[], float], interval_ms: float, counter_ms: float) -> Callable[[bool], float]:
    """One segment with a fresh `jpwr serve` process running (True) or none (False)."""
    def segment(on: bool) -> float:
        if not on:
            return measure()
        with tempfile.TemporaryDirectory() as tmp:
            proc = start_sampler(Path(tmp), interval_ms, counter_ms)
            try:
                return measure()
            finally:
                proc.send_signal(signal.SIGTERM)
                proc.wait()
    return segment


def phase_marks_on_off(measure: Callable[[], float], workload: Workload, out: Path, interval_ms: float,
                       counter_ms: float) -> tuple[Callable[[bool], float], Callable[[], None]]:
    """One segment per window of a sampler that runs throughout; the driver's phase marks on or off."""
    proc = start_sampler(out, interval_ms, counter_ms)
    os.environ[ADDR_ENV] = str(out / "s-{node}.sock")  # this process's meter talks to that sampler
    meter = WindowMeter.open(LaunchEnv.from_env(), sync=torch.cuda.synchronize,
                             phase_stamps=DeviceEventStamps(torch))
    workload.mark_phases(meter.phases)
    count = iter(range(1_000_000))

    def segment(on: bool) -> float:
        meter.phases.enabled = on
        name = f"segment{next(count)}-{'on' if on else 'off'}"
        meter.begin(name, 0)
        rate = measure()
        meter.end(name, 1)
        return rate

    def stop() -> None:
        meter.close()
        proc.send_signal(signal.SIGTERM)
        proc.wait()
    return segment, stop


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", choices=("matmul", *WORKLOADS), default="matmul")
    parser.add_argument("--compare", choices=("sampler", "phase-marks"), default="sampler",
                        help="what is switched on and off (phase-marks needs a training workload)")
    parser.add_argument("--alternations", type=int, default=10)
    parser.add_argument("--seconds", type=float, default=3.0, help="matmul: seconds per segment")
    parser.add_argument("--steps", type=int, default=5, help="training workloads: steps per segment")
    parser.add_argument("--warmup", type=int, default=4, help="training workloads: steps before the first segment")
    parser.add_argument("--interval", type=float, default=100.0, help="sampler interval in ms")
    parser.add_argument("--counter-interval", type=float, default=1000.0, help="sampler counter interval in ms "
                                                                               "(20 as for attribution runs)")
    parser.add_argument("--out", type=Path, help="phase-marks: keep the sampler's trace here (default: temporary)")
    own, workload_argv = split_at_double_dash(sys.argv[1:])
    args = parser.parse_args(own)
    if args.compare == "phase-marks" and args.workload == "matmul":
        parser.error("--compare phase-marks needs --workload llm or resnet50 (the matmul load marks no phases)")
    measure, unit, scale, close, workload = build_load(args, workload_argv)
    with tempfile.TemporaryDirectory() as tmp:
        if args.compare == "phase-marks":
            assert workload is not None
            segment, stop = phase_marks_on_off(measure, workload, args.out or Path(tmp), args.interval,
                                               args.counter_interval)
        else:
            segment, stop = sampler_on_off(measure, args.interval, args.counter_interval), (lambda: None)
        rows = []
        for i in range(args.alternations):
            measured = {}
            for on in ((True, False) if i % 2 == 0 else (False, True)):
                measured["on" if on else "off"] = segment(on)
            change = measured["on"] / measured["off"] - 1.0
            rows.append({"alternation": i, **measured, "change": change})
            print(f"alternation {i:2d}: on {measured['on'] * scale:9.4f} {unit}  "
                  f"off {measured['off'] * scale:9.4f} {unit}  change {change * 100:+.2f}%", flush=True)
        stop()
    changes = [r["change"] for r in rows]
    summary = {"compare": args.compare, "median_change": statistics.median(changes), "min_change": min(changes),
               "max_change": max(changes), "stdev_change": statistics.stdev(changes) if len(changes) > 1 else None,
               "alternations": len(rows), "workload": args.workload, "interval_ms": args.interval,
               "counter_interval_ms": args.counter_interval,
               "segment": f"{args.seconds} s" if args.workload == "matmul" else f"{args.steps} steps"}
    close()
    print("JPWR_OVERHEAD " + json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
