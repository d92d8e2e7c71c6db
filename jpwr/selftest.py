"""`jpwr selftest`: does this GPU's sensor see the energy of periodic work? (the aliasing check)

Runs the same matrix-multiply work as a steady load and as bursts (30 % on-time) in several modes, each window
repeated, and integrates every signal separately: the energy counter alone, the instantaneous-power field, the
averaged power. Per signal and mode it prints energy above idle per unit of work and its spread over the mode's
windows. A sensor that samples only part of each period (H100: ~25 of 100 ms) shows a large spread where the
bursts keep meeting it at the same phase; a good signal stays flat. The modes (--modes):

- random: bursts at each --periods-ms period (default 37, 100, 250 ms), each window at a random phase;
- locked: bursts at the counter's own update period, measured in the run, started at --lock-offsets phases
  evenly spaced over it (0, 1/4, 1/2, 3/4 by default), every phase in every repeat;
- detuned: bursts at the counter's period plus or minus --detune-pct (default -3, -1, 1, 3 %), random phase;
- multiple: bursts at whole --multiples of the counter's period (default 2), random phase.

For the energy counter each burst mode becomes a row of jpwr's aliasing table (jpwr/aliasing_table.py): card,
driver, date, mode, period, spread and the bound it implies (jpwr.aliasing: the bound is the spread), and
whether the estimator's aliasing rule flags a window of that mode. The rows are written to aliasing_rows.json and
printed ready to paste. Needs torch with a GPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import functools
import json
import random
import shlex
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from jpwr.aliasing import implied_bound, spread
from jpwr.aliasing_table import AliasingRow
from jpwr.arguments import INTERVAL_MS, SECONDS, UNIT_OPEN, Number, state_ranges
from jpwr.channel import Mark
from jpwr.clock import SYSTEM_CLOCK
from jpwr.counter_phase import UpdateGrid, fit_grid, probe_updates
from jpwr.domains import Reading, Sensor, Signal
from jpwr.errors import ArgumentParser, ExitCode, ValidationError
from jpwr.estimator import (
    MAX_ALIAS_MULTIPLE,
    PowerCurve,
    aliasing_warning,
    counter_segments,
    counter_window,
    power_window,
)
from jpwr.output import write_json_atomic
from jpwr.sampler import Sampler, open_backends
from jpwr.selftest_load import matmul_operands, matmuls_until
from jpwr.trace_io import TraceData
from jpwr.windows import WindowSpan, accelerator_domains, spans_from_marks

MODES = ("random", "locked", "detuned", "multiple")
PHASED = ("locked", "detuned", "multiple")  # modes whose period is the counter's, measured in the run
GRID_UPDATES = 10  # updates the first probe sees: enough to fit the counter's period to well under a millisecond
REFIT_UPDATES = 2  # updates each later probe adds between windows, keeping the grid on the counter's phase


@dataclasses.dataclass(frozen=True)
class Load:
    """One kind of window: its label, the group (mode and period) its spread is taken over, the burst period
    (None: steady) and the phase of the counter's period bursts start at (None: random)."""

    label: str
    group: str
    mode: str
    period_s: float | None
    phase: float | None = None


def _load(torch: Any, period_s: float | None, seconds: float, on_fraction: float,
          first_start: Callable[[float], float] | None = None) -> int:
    """Run matmuls steadily (period None) or in bursts; return how many were done. `first_start(now)` gives the
    first burst's monotonic time in seconds (default: a random phase within one period)."""
    a, b = matmul_operands(torch)
    done = 0
    now = time.monotonic()
    end = now + seconds
    if period_s is None:
        return matmuls_until(torch, a, b, end)
    next_start = first_start(now) if first_start else now + random.uniform(0, period_s)
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


def _number_list(option: str, text: str, parse: Number, fix: str) -> list[tuple[str, float]]:
    """A comma-separated option as (item, value) pairs: each item a number in `parse`'s range, none empty or twice."""
    values: list[tuple[str, float]] = []
    for position, raw in enumerate(text.split(","), 1):
        item = raw.strip()
        where = f"{option} {text!r}, item {position}"
        if not item:
            raise ValidationError(f"{where} is empty", fix)
        try:
            value = parse(item)
        except argparse.ArgumentTypeError as exc:
            raise ValidationError(f"{where}: {exc}", fix) from None
        if any(value == earlier for _, earlier in values):
            raise ValidationError(f"{where}: {item} is given twice", fix)
        values.append((item, value))
    return values


def burst_periods(text: str, window_s: float) -> list[tuple[str, float]]:
    """--periods-ms as (label, seconds) per item, checked before the GPU check: a 0 or negative period once
    looped for ever, an empty item ended in an internal error. A period is 1 ms to the window's length (a
    longer one may fit no burst in the window), each once (repeats share a window's name)."""
    fix = (f"pass comma-separated burst periods in milliseconds, each from 1 to {window_s * 1000.0:g} (the --seconds "
           "window) and each once, e.g. --periods-ms 37,100,250")
    items = _number_list("--periods-ms", text, Number(float, 1.0, window_s * 1000.0), fix)
    return [(f"{item}ms", value / 1000.0) for item, value in items]


def detune_percents(text: str) -> list[float]:
    """--detune-pct: how far from the counter's period the detuned mode's bursts run, in % (never 0: that is the
    locked mode)."""
    fix = "pass comma-separated percentages from -50 to 50, none 0 and each once, e.g. --detune-pct=-3,-1,1,3"
    items = _number_list("--detune-pct", text, Number(float, -50.0, 50.0), fix)
    for position, (item, value) in enumerate(items, 1):
        if value == 0:
            raise ValidationError(f"--detune-pct {text!r}, item {position}: {item} is the locked mode, not detuned",
                                  fix)
    return [value for _, value in items]


def period_multiples(text: str, window_s: float) -> list[int]:
    """--multiples: whole multiples of the counter's period for the multiple mode, from 2 to the most the aliasing
    rule considers (MAX_ALIAS_MULTIPLE), each burst period (at the nominal 100 ms) within the window."""
    most = max(2, min(MAX_ALIAS_MULTIPLE, int(window_s / 0.1 / 3)))  # three bursts at least
    fix = (f"pass comma-separated whole multiples of the counter's period from 2 to {most} (three bursts within the "
           f"--seconds window), each once, e.g. --multiples 2")
    return [int(value) for _, value in _number_list("--multiples", text, Number(int, 2, most), fix)]


def selftest_modes(text: str) -> list[str]:
    """--modes: which burst modes run (the steady load always runs: every ratio is against it)."""
    fix = f"pass comma-separated modes from {', '.join(MODES)}, each once, e.g. --modes random,locked"
    chosen: list[str] = []
    for position, raw in enumerate(text.split(","), 1):
        mode = raw.strip()
        where = f"--modes {text!r}, item {position}"
        if mode not in MODES:
            raise ValidationError(f"{where}: {mode!r} is not a mode" if mode else f"{where} is empty", fix)
        if mode in chosen:
            raise ValidationError(f"{where}: {mode} is given twice", fix)
        chosen.append(mode)
    return chosen


def planned_loads(modes: Sequence[str], periods: Sequence[tuple[str, float]], counter_period_s: float | None,
                  lock_offsets: int, detunes: Sequence[float], multiples: Sequence[int]) -> list[Load]:
    """Every window kind one repeat runs, steady first. The phased modes need the counter's period."""
    loads = [Load("steady", "steady", "steady", None)]
    if "random" in modes:
        loads += [Load(label, label, "random", seconds) for label, seconds in periods]
    if counter_period_s is None:
        return loads
    if "locked" in modes:
        loads += [Load(f"locked@{i}/{lock_offsets}", "locked", "locked", counter_period_s, i / lock_offsets)
                  for i in range(lock_offsets)]
    if "detuned" in modes:
        loads += [Load(f"detuned{d:+g}%", f"detuned{d:+g}%", "detuned", counter_period_s * (1 + d / 100))
                  for d in detunes]
    if "multiple" in modes:
        loads += [Load(f"x{k}", f"x{k}", "multiple", counter_period_s * k) for k in multiples]
    return loads


@dataclasses.dataclass(frozen=True)
class WindowResult:
    """One measured window: its load, length, work done and each signal's energy."""

    load: Load
    seconds: float
    work: int
    energies: dict[str, float | None]


def mode_rows(windows: Sequence[WindowResult], idle_power_w: dict[str, float | None]) -> list[dict[str, Any]]:
    """Per load group and signal: energy above idle per unit of work in each window, its mean and spread, and the
    ratio to the steady load's mean."""
    groups: dict[str, list[WindowResult]] = {}
    for window in windows:
        groups.setdefault(window.load.group, []).append(window)
    rows: list[dict[str, Any]] = []
    for group, members in groups.items():
        per_signal: dict[str, list[float]] = {}
        for w in members:
            for sig, energy in w.energies.items():
                idle_w = idle_power_w.get(sig)
                if energy is None or idle_w is None or not w.work:
                    continue
                per_signal.setdefault(sig, []).append((energy - idle_w * w.seconds) / w.work)
        for sig, values in sorted(per_signal.items()):
            load = members[0].load
            rows.append({"load": group, "mode": load.mode, "period_s": load.period_s, "signal": sig,
                         "j_per_matmul_above_idle": values, "mean": statistics.fmean(values),
                         "spread": spread(values)})
    steady = {r["signal"]: r["mean"] for r in rows if r["load"] == "steady"}
    for r in rows:
        r["ratio_vs_steady"] = r["mean"] / steady[r["signal"]] if steady.get(r["signal"]) else None
    return rows


@dataclasses.dataclass(frozen=True)
class RunFacts:
    """What every table row of one run states: the card, driver, date, window length and command."""

    card: str
    driver: str
    date: str
    window_s: float
    counter_period_s: float | None  # measured in the run; None where the counter's updates were not seen
    nominal_period_s: float  # the backend's stated update period, for the aliasing rule where none was measured
    source: str


def table_rows(rows: Sequence[dict[str, Any]], facts: RunFacts) -> list[AliasingRow]:
    """The energy counter's burst modes as rows of jpwr's aliasing table: spread, the bound it implies, and whether
    the estimator's aliasing rule flags a window of the mode (its bursts over the window against the counter)."""
    counter_period = facts.counter_period_s or facts.nominal_period_s
    out = []
    for r in rows:
        if r["signal"] != Signal.ENERGY_COUNTER.value or r["period_s"] is None or r["spread"] is None:
            continue
        bursts = int(facts.window_s / r["period_s"])
        flagged = aliasing_warning(bursts * r["period_s"], bursts, counter_period) is not None
        measured = None if facts.counter_period_s is None else round(facts.counter_period_s * 1e3, 3)
        out.append(AliasingRow(
            card=facts.card, driver=facts.driver, date=facts.date, mode=r["mode"],
            period_ms=round(r["period_s"] * 1e3, 3), counter_period_ms=measured,
            windows=len(r["j_per_matmul_above_idle"]), window_s=facts.window_s, spread=round(r["spread"], 4),
            bound=round(implied_bound(r["spread"]), 4), aliased=flagged, source=facts.source))
    return out


class CounterUpdates:
    """The first accelerator's counter updates seen so far, probed through the sampler, and the grid they fit."""

    def __init__(self, sampler: Sampler, sensor: Sensor) -> None:
        self._sampler = sampler
        self._sensor = sensor
        self.nominal_s = sensor.est_update_s or 0.1
        self._times: list[float] = []
        self.grid: UpdateGrid | None = None

    def _read(self) -> Reading:
        self._sampler.read_counters()  # recorded in the trace like the sampler's own reads
        latest = self._sampler.latest()[0].get(self._sensor.id)
        if latest is None:
            now = time.monotonic_ns()
            return Reading(self._sensor.id, now, now, None)
        return latest

    def probe(self, updates: int) -> UpdateGrid | None:
        """Watch `updates` more updates (at most three nominal periods each) and refit the grid."""
        self._times += probe_updates(self._read, updates, 3 * (updates + 1) * self.nominal_s)
        self.grid = fit_grid(self._times, self.nominal_s)
        return self.grid


def _first_counter(sampler: Sampler) -> Sensor | None:
    domains = accelerator_domains(sampler.domains)
    return next((s for s in sampler.counters if domains and s.domain_id == domains[0].id), None)


def _print_rows(rows: Sequence[dict[str, Any]], table: Sequence[AliasingRow]) -> None:
    print(f"{'load':<12} {'signal':<16} {'J/matmul above idle (mean)':>27} {'vs steady':>10} {'spread':>8}")
    for r in rows:
        ratio = float("nan") if r["ratio_vs_steady"] is None else r["ratio_vs_steady"]
        spread_text = "n/a" if r["spread"] is None else f"{r['spread'] * 100:.1f}%"
        print(f"{r['load']:<12} {r['signal']:<16} {r['mean']:>27.4f} {ratio:>10.3f} {spread_text:>8}")
    if table:
        print("\naliasing table rows (energy counter; paste into ROWS of jpwr/aliasing_table.py):")
        for row in table:
            print(f"    {row!r},")


def main(argv: Sequence[str]) -> int:
    parser = ArgumentParser(prog="jpwr selftest", description=__doc__.split("\n\n")[0])
    parser.add_argument("--methods", default="nvml")
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma-separated burst modes from {', '.join(MODES)}")
    parser.add_argument("--periods-ms", default="37,100,250",
                        help="random mode: comma-separated burst periods in ms, each from 1 to the --seconds window")
    parser.add_argument("--lock-offsets", type=Number(int, 1, 32), default=4,
                        help="locked mode: phases evenly spaced over the counter's period")
    parser.add_argument("--detune-pct", default="-3,-1,1,3",
                        help="detuned mode: comma-separated offsets from the counter's period in %%")
    parser.add_argument("--multiples", default="2", help="multiple mode: comma-separated multiples of its period")
    parser.add_argument("--repeats", type=Number(int, 1, 1000), default=3)
    parser.add_argument("--seconds", type=SECONDS, default=4.0, help="length of each load window")
    parser.add_argument("--on-fraction", type=UNIT_OPEN, default=0.3)
    parser.add_argument("--interval", type=INTERVAL_MS, default=20.0, help="power sampling interval in ms")
    parser.add_argument("--out", default="jpwr_selftest")
    args = state_ranges(parser).parse_args(argv)
    periods = burst_periods(args.periods_ms, args.seconds)
    modes = selftest_modes(args.modes)
    detunes = detune_percents(args.detune_pct)
    multiples = period_multiples(args.multiples, args.seconds)
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
    counter = _first_counter(sampler)
    updates = CounterUpdates(sampler, counter) if counter else None
    grid = updates.probe(GRID_UPDATES) if updates else None
    if grid is None and any(m in PHASED for m in modes):
        sampler.stop()
        print("jpwr selftest: the locked, detuned and multiple modes need the first accelerator's energy counter "
              "and its updates, and none were seen; run --modes random")
        return ExitCode.UNAVAILABLE
    loads = planned_loads(modes, periods, grid.period_s if grid else None, args.lock_offsets, detunes, multiples)
    work: dict[str, int] = {}
    starts: dict[str, tuple[float, float]] = {}  # locked windows: (planned phase, first burst's monotonic s)

    def locked_start(name: str, phase: float, on: UpdateGrid, now: float) -> float:
        starts[name] = (phase, on.next_at_phase(now * 1e9, phase) / 1e9)
        return starts[name][1]

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
        for load in loads:
            name = f"{load.label}#{rep}"
            begin = time.monotonic()
            if updates and grid:
                grid = updates.probe(REFIT_UPDATES) or grid  # stay on the counter's phase
            first = None if load.phase is None or grid is None else functools.partial(locked_start, name, load.phase,
                                                                                        grid)
            time.sleep(max(0.0, 1.0 - (time.monotonic() - begin)))  # let averaged signals fall back between windows
            window(name, functools.partial(_load, torch, load.period_s, args.seconds, args.on_fraction, first))
    sampler.stop()
    trace = sampler.trace()
    spans = spans_from_marks(trace.marks)
    idle_span = spans["idle"]
    idle = signal_energies(trace, idle_span, interval_s)
    idle_power = {k: (v / ((idle_span.t1_ns - idle_span.t0_ns) / 1e9) if v is not None else None)
                  for k, v in idle.items()}
    results = [WindowResult(load, (spans[n].t1_ns - spans[n].t0_ns) / 1e9, work[n],
                            signal_energies(trace, spans[n], interval_s))
               for rep in range(args.repeats) for load in loads for n in [f"{load.label}#{rep}"]]
    rows = mode_rows(results, idle_power)
    domain = accelerator_domains(trace.domains)[0]
    backend_info = trace.info.get("backends", {}).get(domain.backend, {})
    facts = RunFacts(card=domain.name, driver=str(backend_info.get("driver", "not recorded")),
                     date=datetime.datetime.now(datetime.UTC).date().isoformat(), window_s=args.seconds,
                     counter_period_s=grid.period_s if grid else None,
                     nominal_period_s=updates.nominal_s if updates else 0.1,
                     source=f"`{shlex.join(['jpwr', 'selftest', *argv])}`")
    table = table_rows(rows, facts)
    _print_rows(rows, table)
    out = Path(args.out)
    write_json_atomic(out / "aliasing_rows.json", [dataclasses.asdict(r) for r in table])
    write_json_atomic(out / "selftest.json", {
        "idle_power_w": idle_power, "rows": rows, "config": vars(args),
        "counter_grid": None if grid is None else {"period_ms": grid.period_s * 1e3,
                                                   "scatter_ms": grid.scatter_s * 1e3, "updates": grid.updates},
        "locked_phases": {name: {"planned": phase, "achieved": grid.phase_of(t * 1e9)}
                          for name, (phase, t) in starts.items() if grid},
        "devices": [d.to_dict() for d in accelerator_domains(trace.domains)]})
    print(json.dumps({"selftest": str(out / "selftest.json"), "aliasing_rows": str(out / "aliasing_rows.json")}))
    return ExitCode.OK
