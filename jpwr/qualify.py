"""`jpwr qualify METER_A METER_B`: check a meter against a reference the way MLPerf Training's power rules do.

Five windows (one minute each by default): idle, load 1, load 2, load 1, load 2. The loads come from a
built-in generator (bf16 matmuls of 8192² and of 2048² on the first GPU, jpwr.selftest_load) or from
commands (--load1/--load2, started --lead-seconds before their window so that averaging sensors have
followed the change, stopped after it). Per window the relative energy difference (A - B) / B, B being the
reference; the Olympic score drops the highest and the lowest |difference| and averages the other three.
PASS at <= 5 %; the report also says whether the tighter 1 % target is met.

Clocks: a CSV meter runs on the site's clock. Its offset to ours is measured by correlating its power with
the load schedule; an offset beyond --max-clock-offset (1 s: a 1 s averaging sensor already lags by half
of that) makes the result INVALID unless corrected with --offset-a/--offset-b, which is applied and
reported. Every run writes the schedule to OUT/qualify.json; `--windows OUT/qualify.json` evaluates it
again with CSV meters, e.g. once the PDU export is there.

Exit status: 0 PASS, 1 FAIL, 2 INVALID (missing data, misaligned clocks); 64, 69, 73 as every jpwr command.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from jpwr.arguments import OFFSET_S, SECONDS, SECONDS_OR_ZERO, Number, state_ranges
from jpwr.errors import ArgumentParser, ExitCode, ValidationError
from jpwr.output import fmt, write_json_atomic
from jpwr.qualify_meters import SPEC_FORMS, CsvMeter, Meter, parse_meter

SCHEMA = "jpwr.qualify/1"
SEQUENCE = ("idle", "load1", "load2", "load1", "load2")
PASS_LIMIT = 0.05
RELATIVE_ERROR = Number(float, 0.0, 1.0, low_open=True)  # --pass-limit, --target: 0 could never pass
TARGET = 0.01
BUILTIN_SIZES = {"load1": 8192, "load2": 2048}  # matmul sides: the steady full-power load, and a lighter one
LOAD_CODE = ("import sys, torch; from jpwr.selftest_load import matmul_operands, matmuls_until; "
             "a, b = matmul_operands(torch, int(sys.argv[1])); matmuls_until(torch, a, b, float('inf'))")
STATUS_CODE = {"PASS": 0, "FAIL": 1, "INVALID": 2}


def _now() -> tuple[int, float]:
    return time.monotonic_ns(), time.time()


def _start_load(command: list[str] | None) -> subprocess.Popen | None:
    return None if command is None else subprocess.Popen(command, stdout=subprocess.DEVNULL)


def _stop_load(proc: subprocess.Popen | None, name: str) -> str | None:
    """Stop a load; say so if it had ended on its own before its window did (the window was not loaded)."""
    if proc is None:
        return None
    early = proc.poll()
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    return None if early is None else f"the load of window {name} exited with code {early} before the window ended"


def run_schedule(meters: Sequence[Meter], window_s: float, lead_s: float,
                 loads: dict[str, list[str] | None]) -> dict[str, Any]:
    """Run the five windows with the meters recording; returns the schedule (wall and monotonic edges)."""
    for meter in meters:
        meter.start()
    windows, segments, problems = [], [], []
    try:
        time.sleep(lead_s)  # the idle window gets a lead-in too, so power-averaging sensors start settled
        for index, load in enumerate(SEQUENCE, start=1):
            name = f"w{index}-{load}"
            proc = _start_load(loads.get(load))
            started = time.time()
            time.sleep(lead_s)
            t0_mono, t0_wall = _now()
            for meter in meters:
                meter.mark(name, "begin", t0_mono)
            time.sleep(window_s)
            t1_mono, t1_wall = _now()
            for meter in meters:
                meter.mark(name, "end", t1_mono)
            problem = _stop_load(proc, name)
            problems += [problem] if problem else []
            windows.append({"name": name, "load": load, "t0_wall_s": t0_wall, "t1_wall_s": t1_wall,
                            "t0_mono_ns": t0_mono, "t1_mono_ns": t1_mono})
            if load != "idle":
                segments.append({"load": load, "start_wall_s": started, "end_wall_s": t1_wall})
    finally:
        for meter in meters:
            meter.stop()
    return {"schema": SCHEMA, "window_seconds": window_s, "lead_seconds": lead_s, "windows": windows,
            "loads": segments, "load_commands": {k: v for k, v in loads.items()}, "problems": problems}


def detect_offset(t: np.ndarray, p: np.ndarray, segments: Sequence[dict[str, float]], span: tuple[float, float],
                  search_s: float, step_s: float = 0.02) -> tuple[float | None, float]:
    """The lag L (s) at which the CSV's power p(t + L) best follows the load schedule, and that correlation.

    The schedule is 1 while a load runs and 0 otherwise; only lags whose shifted span the CSV covers for
    at least 80 % count. (None, 0) when nothing can be told (no load edge, or no covered lag).
    """
    grid = np.arange(span[0], span[1], step_s)
    loaded = np.zeros_like(grid)
    for seg in segments:
        loaded[(grid >= seg["start_wall_s"]) & (grid < seg["end_wall_s"])] = 1.0
    if loaded.std() == 0:
        return None, 0.0

    def corr(lag: float) -> float:
        x = grid + lag
        inside = (x >= t[0]) & (x <= t[-1])
        if inside.mean() < 0.8:
            return -np.inf
        values = np.interp(x[inside], t, p)
        if values.std() == 0 or loaded[inside].std() == 0:
            return -np.inf
        return float(np.corrcoef(values, loaded[inside])[0, 1])

    coarse = max(np.arange(-search_s, search_s + 1e-9, 0.5), key=corr)
    best = max(np.arange(coarse - 0.5, coarse + 0.5 + 1e-9, step_s), key=corr)
    strength = corr(best)
    return (None, 0.0) if not np.isfinite(strength) else (float(best), strength)


def check_clock(meter: CsvMeter, schedule: dict[str, Any], max_offset_s: float, search_s: float) -> str | None:
    """Why the CSV meter's clock cannot be trusted for these windows, or None when it can."""
    windows = schedule["windows"]
    span = (min(w["t0_wall_s"] for w in windows), max(w["t1_wall_s"] for w in windows))
    lag, strength = detect_offset(meter.t, meter.p, schedule["loads"], span, search_s)
    meter.detected_offset_s, meter.offset_strength = lag, strength
    if lag is None or strength < 0.5:
        return (f"{meter.spec}: its power does not follow the load schedule (best correlation {strength:.2f}), so "
                "its clock offset cannot be checked. Fix: make sure it meters the loaded devices, and that its "
                "export covers the qualification period")
    residual = lag - meter.offset_s
    if abs(residual) > max_offset_s:
        return (f"{meter.spec}: its clock is {residual:+.2f} s off ours (power follows the load schedule best at "
                f"{lag:+.2f} s, correlation {strength:.2f}; {meter.offset_s:+.2f} s applied), more than the "
                f"{max_offset_s:g} s allowed. Fix: synchronise the meter's clock (NTP/PTP), or pass "
                f"--offset-{meter.role} {lag:.2f} to correct it")
    return None


def evaluate(meters: dict[str, Meter], schedule: dict[str, Any], pass_limit: float, target: float,
             max_offset_s: float, search_s: float) -> dict[str, Any]:
    problems = list(schedule.get("problems", []))
    for meter in meters.values():
        if isinstance(meter, CsvMeter) and (why := check_clock(meter, schedule, max_offset_s, search_s)):
            problems.append(why)
    rows = []
    for w in schedule["windows"]:
        args = (w["name"], w["t0_wall_s"], w["t1_wall_s"], w.get("t0_mono_ns"), w.get("t1_mono_ns"))
        (a, why_a), (b, why_b) = meters["a"].energy(*args), meters["b"].energy(*args)
        problems += [why for why in (why_a, why_b) if why]
        diff = (a - b) / b if a is not None and b else None
        rows.append({"window": w["name"], "load": w["load"], "seconds": w["t1_wall_s"] - w["t0_wall_s"],
                     "energy_a_j": a, "energy_b_j": b, "relative_difference": diff})
    diffs = sorted(abs(r["relative_difference"]) for r in rows if r["relative_difference"] is not None)
    olympic = statistics.fmean(diffs[1:-1]) if len(diffs) == len(rows) and len(rows) >= 3 else None
    if len(rows) < 3:
        problems.append(f"{len(rows)} windows: the Olympic score needs at least three")
    status = "INVALID" if problems or olympic is None else ("PASS" if olympic <= pass_limit else "FAIL")
    offsets = {role: {"spec": m.spec, "applied_s": m.offset_s, "detected_s": m.detected_offset_s,
                      "correlation": m.offset_strength} for role, m in meters.items() if isinstance(m, CsvMeter)}
    return {"meter_a": meters["a"].spec, "meter_b": meters["b"].spec, "windows": rows, "olympic_score": olympic,
            "pass_limit": pass_limit, "target": target, "status": status,
            "meets_target": None if olympic is None else olympic <= target, "problems": problems,
            "clock_offsets": offsets}


def report(result: dict[str, Any]) -> str:
    lines = [f"meter A (under test): {result['meter_a']}", f"meter B (reference):  {result['meter_b']}",
             f"{'window':<10} {'load':<6} {'s':>6} {'A J':>12} {'B J':>12} {'(A-B)/B':>9}"]
    for r in result["windows"]:
        diff = r["relative_difference"]
        lines.append(f"{r['window']:<10} {r['load']:<6} {r['seconds']:>6.1f} {fmt(r['energy_a_j'], 7):>12} "
                     f"{fmt(r['energy_b_j'], 7):>12} {'n/a' if diff is None else f'{diff:+.2%}':>9}")
    for role, off in result["clock_offsets"].items():
        lines.append(f"clock of meter {role.upper()} ({off['spec']}): detected {fmt(off['detected_s'], 3)} s, "
                     f"applied {off['applied_s']:+.2f} s")
    score = result["olympic_score"]
    lines.append(f"Olympic score (middle three |differences|): {'n/a' if score is None else f'{score:.2%}'}; "
                 f"{result['status']} (limit {result['pass_limit']:.0%}); target {result['target']:.0%} "
                 f"{'met' if result['meets_target'] else 'not met' if score is not None else 'n/a'}")
    lines += [f"problem: {p}" for p in result["problems"]]
    return "\n".join(lines)


def _loads(args: argparse.Namespace) -> dict[str, list[str] | None]:
    given = {"load1": args.load1, "load2": args.load2}
    if all(given.values()):
        return {k: shlex.split(v) for k, v in given.items()}
    if any(given.values()):
        raise ValidationError("only one of --load1/--load2 given", "give both commands, or neither for the built-in")
    if importlib.util.find_spec("torch") is None:
        raise ValidationError("the built-in load needs PyTorch with a GPU, and torch is not installed",
                              "pip install torch (the build for your GPUs), or give --load1 CMD --load2 CMD")
    return {k: [sys.executable, "-c", LOAD_CODE, str(n)] for k, n in BUILTIN_SIZES.items()}


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog="jpwr qualify", description=__doc__.split("\n\n")[0],
                            formatter_class=argparse.RawDescriptionHelpFormatter,
                            epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    parser.add_argument("meter_a", metavar="METER_A", help=f"the meter under test: {SPEC_FORMS}")
    parser.add_argument("meter_b", metavar="METER_B", help="the reference meter, same forms")
    parser.add_argument("--window-seconds", type=SECONDS, default=60.0, help="length of each window (default 60)")
    parser.add_argument("--lead-seconds", type=SECONDS_OR_ZERO, default=10.0,
                        help="a load starts this long before its window opens (default 10; 0 = with it)")
    parser.add_argument("--load1", help="command for load 1 (default: built-in 8192² bf16 matmuls)")
    parser.add_argument("--load2", help="command for load 2 (default: built-in 2048² bf16 matmuls)")
    parser.add_argument("--windows", type=Path, help="evaluate this recorded schedule (qualify.json) instead of "
                                                     "running one; CSV meters only")
    parser.add_argument("--offset-a", type=OFFSET_S, default=0.0,
                        help="seconds added to our clock to reach A's clock (default 0 = the same clock)")
    parser.add_argument("--offset-b", type=OFFSET_S, default=0.0, help="the same for B (0 = the same clock)")
    parser.add_argument("--max-clock-offset", type=SECONDS_OR_ZERO, default=1.0,
                        help="seconds a CSV meter may be off (1; 0 = none)")
    parser.add_argument("--offset-search", type=SECONDS_OR_ZERO, default=120.0,
                        help="seconds searched for a CSV offset (0 = no search)")
    parser.add_argument("--pass-limit", type=RELATIVE_ERROR, default=PASS_LIMIT,
                        help="largest relative error that passes")
    parser.add_argument("--target", type=RELATIVE_ERROR, default=TARGET, help="relative error reported as the goal")
    parser.add_argument("--out", type=Path, default=Path("jpwr_qualify"))
    return state_ranges(parser)


def main(argv: Sequence[str]) -> int:
    args = build_parser().parse_args(argv)
    if args.window_seconds <= 0 or args.lead_seconds < 0:
        raise ValidationError("--window-seconds must be > 0 and --lead-seconds >= 0", "pass e.g. 60 and 10")
    args.out.mkdir(parents=True, exist_ok=True)
    meters = {"a": parse_meter(args.meter_a, args.out, args.offset_a, "a"),
              "b": parse_meter(args.meter_b, args.out, args.offset_b, "b")}
    if args.windows is not None:
        live = [m.spec for m in meters.values() if m.live]
        if live:
            raise ValidationError(f"meter {live[0]} measures live and cannot re-evaluate recorded windows",
                                  "use csv: meters with --windows (a live run writes its schedule to OUT)")
        schedule = json.loads(args.windows.read_text())
    else:
        if not any(m.live for m in meters.values()):
            raise ValidationError("two CSV meters and no --windows", "pass --windows FILE (qualify.json of a run)")
        schedule = run_schedule(list(meters.values()), args.window_seconds, args.lead_seconds, _loads(args))
        write_json_atomic(args.out / "qualify.json", schedule)
    for meter in meters.values():
        if isinstance(meter, CsvMeter):
            try:
                meter.load()
            except ValidationError as exc:
                raise ValidationError(exc.problem, f"{exc.fix}; then run jpwr qualify again with --windows "
                                                   f"{args.out / 'qualify.json'}") from None
    result = evaluate(meters, schedule, args.pass_limit, args.target, args.max_clock_offset, args.offset_search)
    write_json_atomic(args.out / "qualify_result.json", {**result, "schedule": schedule})
    print(report(result))
    return STATUS_CODE[result["status"]] if result["status"] != "PASS" else ExitCode.OK
