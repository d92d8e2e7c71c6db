"""`jpwr selftest`: does this GPU's sensor see the energy of periodic work? (the aliasing check)

Runs the same matrix-multiply work as a steady load and as bursts at several periods (default
37, 100, 250 ms; 30 % on-time), each repeated with random phase offsets, and integrates every
signal separately: the energy counter alone, the instantaneous-power field, the averaged power.
Per signal and period it prints energy above idle per unit of work and its spread over the
repeats. A sensor that samples only part of each period (H100: ~25 of 100 ms) shows a large
spread at periods near its own; a good signal stays flat. Needs torch with a GPU.
"""

from __future__ import annotations

import argparse
import functools
import json
import random
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from jpwr.arguments import INTERVAL_MS, SECONDS, UNIT_OPEN, Number, state_ranges
from jpwr.channel import Mark
from jpwr.clock import SYSTEM_CLOCK
from jpwr.domains import Signal
from jpwr.errors import ExitCode, ValidationError
from jpwr.estimator import PowerCurve, counter_segments, counter_window, power_window
from jpwr.output import write_json_atomic
from jpwr.sampler import Sampler, open_backends
from jpwr.selftest_load import matmul_operands, matmuls_until
from jpwr.trace_io import TraceData
from jpwr.windows import WindowSpan, accelerator_domains, spans_from_marks


def _load(torch: Any, period_s: float | None, seconds: float, on_fraction: float) -> int:
    """Run matmuls steadily (period None) or in bursts; return how many were done."""
    a, b = matmul_operands(torch)
    done = 0
    end = time.monotonic() + seconds
    if period_s is None:
        return matmuls_until(torch, a, b, end)
    next_start = time.monotonic() + random.uniform(0, period_s)  # random phase against the sensor
    time.sleep(max(0.0, next_start - time.monotonic()))
    while next_start < end:
        busy_until = next_start + period_s * on_fraction
        while time.monotonic() < busy_until:
            a @ b
            torch.cuda.synchronize()
            done += 1
        next_start += period_s
        time.sleep(max(0.0, next_start - time.monotonic()))
    return done


def signal_energies(trace: TraceData, span: WindowSpan, interval_s: float) -> dict[str, float | None]:
    """Energy of the window on the first accelerator per signal, each integrated on its own."""
    domain = accelerator_domains(trace.domains)[0]
    out: dict[str, float | None] = {}
    for sensor in (s for s in trace.sensors if s.domain_id == domain.id):
        series = trace.series(sensor.id)
        p_max = 1000.0
        if sensor.signal is Signal.ENERGY_COUNTER:
            segments, _ = counter_segments(series, sensor.est_update_s)
            result = counter_window(segments, None, span.t0_ns, span.t1_ns, p_max) if segments else None
        else:
            curve = PowerCurve(series, interval_s)
            result = power_window(curve, span.t0_ns, span.t1_ns, p_max) if curve else None
        out[sensor.signal.value] = None if result is None else result.energy_j
    return out


def burst_periods(text: str, window_s: float) -> list[tuple[str, float]]:
    """--periods-ms as (label, seconds) per item, checked before the GPU check: a 0 or negative period once
    looped for ever, an empty item ended in an internal error. A period is 1 ms to the window's length (a
    longer one may fit no burst in the window), each once (repeats share a window's name)."""
    period_ms = Number(float, 1.0, window_s * 1000.0)
    fix = (f"pass comma-separated burst periods in milliseconds, each from 1 to {window_s * 1000.0:g} (the --seconds "
           "window) and each once, e.g. --periods-ms 37,100,250")
    periods: list[tuple[str, float]] = []
    for position, raw in enumerate(text.split(","), 1):
        item = raw.strip()
        where = f"--periods-ms {text!r}, item {position}"
        if not item:
            raise ValidationError(f"{where} is empty", fix)
        try:
            seconds = period_ms(item) / 1000.0
        except argparse.ArgumentTypeError as exc:
            raise ValidationError(f"{where}: {exc}", fix) from None
        if any(seconds == earlier for _, earlier in periods):
            raise ValidationError(f"{where}: {item} is given twice", fix)
        periods.append((f"{item}ms", seconds))
    return periods


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="jpwr selftest", description=__doc__.split("\n\n")[0])
    parser.add_argument("--methods", default="nvml")
    parser.add_argument("--periods-ms", default="37,100,250",
                        help="comma-separated burst periods in ms, each from 1 to the --seconds window")
    parser.add_argument("--repeats", type=Number(int, 1, 1000), default=3)
    parser.add_argument("--seconds", type=SECONDS, default=4.0, help="length of each load window")
    parser.add_argument("--on-fraction", type=UNIT_OPEN, default=0.3)
    parser.add_argument("--interval", type=INTERVAL_MS, default=20.0, help="power sampling interval in ms")
    parser.add_argument("--out", default="jpwr_selftest")
    args = state_ranges(parser).parse_args(argv)
    periods = burst_periods(args.periods_ms, args.seconds)
    try:
        import torch
    except ImportError:
        print("jpwr selftest: needs PyTorch with a GPU: pip install torch (the build for your GPUs)")
        return ExitCode.UNAVAILABLE
    if not torch.cuda.is_available():
        print("jpwr selftest: no CUDA/ROCm GPU visible; nothing to test")
        return ExitCode.UNAVAILABLE
    from jpwr.backends import parse_methods

    backends, discoveries = open_backends(parse_methods(args.methods), SYSTEM_CLOCK)
    interval_s = args.interval / 1000.0
    sampler = Sampler(backends, discoveries, Path(args.out), interval_s, counter_interval_s=interval_s).start()
    configs: list[tuple[str, float | None]] = [("steady", None), *periods]
    work: dict[str, int] = {}

    def window(name: str, fn: Callable[[], int]) -> None:
        torch.cuda.synchronize()
        sampler.add_mark(Mark(name, "begin", 0, SYSTEM_CLOCK.monotonic_ns()))
        work[name] = fn()
        torch.cuda.synchronize()
        sampler.add_mark(Mark(name, "end", 1, SYSTEM_CLOCK.monotonic_ns()))

    _load(torch, None, 1.0, 1.0)  # warm-up: clocks, cuBLAS handles
    time.sleep(2.0)
    def sleep_through() -> int:
        time.sleep(args.seconds)
        return 0  # no work

    window("idle", sleep_through)
    for rep in range(args.repeats):
        for label, period in configs:
            window(f"{label}#{rep}", functools.partial(_load, torch, period, args.seconds, args.on_fraction))
            time.sleep(1.0)  # let averaged signals fall back between windows
    sampler.stop()
    trace = sampler.trace()
    spans = spans_from_marks(trace.marks)
    idle_span = spans["idle"]
    idle = signal_energies(trace, idle_span, interval_s)
    idle_power = {k: (v / ((idle_span.t1_ns - idle_span.t0_ns) / 1e9) if v is not None else None)
                  for k, v in idle.items()}
    rows: list[dict[str, Any]] = []
    for label, _ in configs:
        per_signal: dict[str, list[float]] = {}
        for rep in range(args.repeats):
            name = f"{label}#{rep}"
            span = spans[name]
            seconds = (span.t1_ns - span.t0_ns) / 1e9
            for sig, energy in signal_energies(trace, span, interval_s).items():
                idle_w = idle_power.get(sig)
                if energy is None or idle_w is None or not work[name]:
                    continue
                per_signal.setdefault(sig, []).append((energy - idle_w * seconds) / work[name])
        for sig, values in sorted(per_signal.items()):
            mean = statistics.fmean(values)
            rows.append({"load": label, "signal": sig, "j_per_matmul_above_idle": values, "mean": mean,
                         "spread": (max(values) - min(values)) / mean if mean else None})
    steady = {r["signal"]: r["mean"] for r in rows if r["load"] == "steady"}
    print(f"{'load':<8} {'signal':<16} {'J/matmul above idle (mean)':>27} {'vs steady':>10} {'spread':>8}")
    for r in rows:
        ratio = r["mean"] / steady[r["signal"]] if steady.get(r["signal"]) else float("nan")
        r["ratio_vs_steady"] = ratio
        print(f"{r['load']:<8} {r['signal']:<16} {r['mean']:>27.4f} {ratio:>10.3f} "
              f"{(r['spread'] or 0) * 100:>7.1f}%")
    write_json_atomic(Path(args.out) / "selftest.json", {
        "idle_power_w": idle_power, "rows": rows, "config": vars(args),
        "devices": [d.to_dict() for d in accelerator_domains(trace.domains)]})
    print(json.dumps({"selftest": str(Path(args.out) / "selftest.json")}))
    return ExitCode.OK
