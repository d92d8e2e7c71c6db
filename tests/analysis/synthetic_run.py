"""A training run with known per-phase powers, metered by the production sampler through the fake pynvml.

The GPU is the only fake. A step schedule (two micro-batches of forward and backward, the optimizer step, a
short unmarked gap; each occurrence at its phase's power ±2 %, step lengths jittered ±10 %) becomes a trace
file for tests/fakes/pynvml: the energy counter holds the exact integral up to its last update (every
~100 ms, jittered ±5 ms), instant power the power at that update. The WindowMeter, PhaseRecorder, sampler,
estimator, trace files and run record are the production code, on a virtual clock. Phase stamps are the
schedule's own times, which is what device events report: when the device ran the phase, whatever the
host (here: the virtual clock, pushed ahead by the sampler's after-mark counter chase) was doing.
"""

from __future__ import annotations

import csv
import dataclasses
import gzip
import json
from pathlib import Path

import numpy as np

from benchmarks.record_nvml_trace import TRACE_COLUMNS
from joulebench.launch import LaunchEnv
from joulebench.phases import BACKWARD, FORWARD, OPTIMIZER, REPLAY_PREFIX
from joulebench.record import RunRecord, write_run_record
from jpwr.clock import VirtualClock
from jpwr.meter import WindowMeter
from jpwr.phases import PhaseRecorder
from jpwr.sampler import LocalChannel, Sampler, open_backends

NS = 1_000_000_000
POWER_W = {FORWARD: 420.0, BACKWARD: 640.0, OPTIMIZER: 300.0, None: 250.0}  # None: the unmarked gap
SECONDS = {FORWARD: 0.15, BACKWARD: 0.225, OPTIMIZER: 0.02, None: 0.02}
MICRO_BATCHES = 2
IDLE_W = 120.0
ROW_S = 0.002  # the fake answers each call from the last row at or before it
COUNTER_PERIOD_S = 0.1
POLL_S = 0.02  # jpwr --interval 20 --counter-interval 20
REPLAY_S = 3.0


@dataclasses.dataclass(frozen=True)
class Piece:
    t0: float
    t1: float
    watts: float
    phase: str | None  # None: unmarked (idle or the gap)


@dataclasses.dataclass
class Schedule:
    pieces: list[Piece] = dataclasses.field(default_factory=list)
    windows: list[tuple[str, float, float, int]] = dataclasses.field(default_factory=list)  # name, t0, t1, steps
    t: float = 1.0

    def add(self, seconds: float, watts: float, phase: str | None) -> None:
        self.pieces.append(Piece(self.t, self.t + seconds, watts, phase))
        self.t += seconds

    def idle(self, seconds: float) -> None:
        self.add(seconds, IDLE_W, None)

    def true_mean_w(self, phase: str | None, t0: float, t1: float) -> float:
        inside = [p for p in self.pieces if p.phase == phase and p.t0 >= t0 and p.t1 <= t1]
        return sum(p.watts * (p.t1 - p.t0) for p in inside) / sum(p.t1 - p.t0 for p in inside)

    def true_energy(self, t0: float, t1: float) -> float:
        return sum(p.watts * (min(p.t1, t1) - max(p.t0, t0)) for p in self.pieces if p.t1 > t0 and p.t0 < t1)


def _phase(schedule: Schedule, rng: np.random.Generator, phase: str | None, stretch: float, extra_w: float) -> None:
    schedule.add(SECONDS[phase] * stretch, POWER_W[phase] * (1 + 0.02 * rng.standard_normal()) + extra_w, phase)


def _step(schedule: Schedule, rng: np.random.Generator, parts: tuple[str | None, ...], extra_w: float = 0.0) -> None:
    stretch = rng.uniform(0.9, 1.1)
    for phase in parts:
        _phase(schedule, rng, phase, stretch, extra_w)


STEP = (FORWARD, BACKWARD) * MICRO_BATCHES + (OPTIMIZER, None)
REPLAYS = {"forward": (FORWARD,) * MICRO_BATCHES, "forward+backward": (FORWARD, BACKWARD) * MICRO_BATCHES,
           "optimizer": (OPTIMIZER,), "step": STEP}


def build_schedule(seed: int, steady_s: float, interference_w: float = 0.0) -> Schedule:
    """Warm-up, steady window, then the four replay windows; `interference_w` is added to everything in the
    steady window's second half (work that was not marked: the misfit case)."""
    rng = np.random.default_rng(seed)
    s = Schedule()
    s.idle(1.0)
    for name, seconds in (("warmup", 2.0), ("steady", steady_s)):
        s.idle(0.3)  # the sampler's counter chase after an edge mark runs ahead of the virtual clock
        start, steps = s.t, 0
        while s.t - start < seconds:
            late = name == "steady" and s.t - start >= seconds / 2
            _step(s, rng, STEP, interference_w if late else 0.0)
            steps += 1
        s.windows.append((name, start, s.t, steps))
    for name, parts in REPLAYS.items():
        s.idle(0.5)
        start, count = s.t, 0
        while s.t - start < REPLAY_S:
            _step(s, rng, parts)
            count += 1
        s.windows.append((REPLAY_PREFIX + name, start, s.t, count))
    s.idle(3.0)
    return s


def write_fake_trace(schedule: Schedule, directory: Path, seed: int) -> Path:
    """tests/fakes/pynvml's trace format (trace.csv.gz + meta.json) for this schedule."""
    rng = np.random.default_rng(seed + 1)
    edges = np.array([p.t0 for p in schedule.pieces] + [schedule.pieces[-1].t1])
    watts = np.array([p.watts for p in schedule.pieces])
    cumulative = np.concatenate(([0.0], np.cumsum(watts * np.diff(edges))))

    def energy(t: np.ndarray) -> np.ndarray:
        i = np.clip(np.searchsorted(edges, t, side="right") - 1, 0, len(watts) - 1)
        return cumulative[i] + watts[i] * (t - edges[i])

    end = schedule.pieces[-1].t1
    updates = np.cumsum(COUNTER_PERIOD_S + rng.uniform(-0.005, 0.005, int(end / COUNTER_PERIOD_S) + 10))
    rows_t = np.arange(0.0, end, ROW_S)
    last = np.clip(np.searchsorted(updates, rows_t, side="right") - 1, 0, None)
    update_t = np.where(rows_t >= updates[0], updates[last], 0.0)
    counter_mj = (5_000_000 + energy(update_t) * 1000).astype(np.int64)
    power_mw = (watts[np.clip(np.searchsorted(edges, update_t, side="right") - 1, 0, len(watts) - 1)] * 1000)
    directory.mkdir(parents=True, exist_ok=True)
    with gzip.open(directory / "trace.csv.gz", "wt", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(TRACE_COLUMNS)
        for t, e, p in zip((rows_t * NS).astype(np.int64), counter_mj, power_mw.astype(np.int64), strict=True):
            writer.writerow([t, t, e, t, t, p, t // 1000, p, t, t, p, 1980, 100])
    meta = {"name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-00000000-1111-2222-3333-444444444444",
            "pci_bus_id": "00000000:00:06.0", "driver": "synthetic", "nvml": "synthetic", "power_limit_mW": 700000,
            "memory_total_bytes": 85520809984, "marks": [], "t_start_ns": 0,
            "call_cost_s": {"counter": 0.0036, "fields": 9e-6, "clock": 6e-5, "utilization": 5e-5}}
    (directory / "meta.json").write_text(json.dumps(meta))
    return directory


class ScheduleStamps:
    """Phase stamps from the schedule: the device-side time of each boundary, set before each call."""

    clock = "host"

    def __init__(self) -> None:
        self.now_ns = 0

    def stamp(self) -> int:
        return self.now_ns

    def host_times(self, stamps: list[int], edges: list[tuple[int, int]]) -> list[int]:
        return [int(s) for s in stamps]

    def release(self, stamps: list[int]) -> None:
        """Plain integers."""


def run(run_dir: Path, pynvml, seed: int = 7, steady_s: float = 40.0, interference_w: float = 0.0,
        mark: tuple[str, ...] = (FORWARD, BACKWARD, OPTIMIZER), sensor: bool = True) -> Schedule:
    """Meter the schedule into RUN_DIR (run_record.json, jpwr/n1/trace.h5); phases not in `mark` go unmarked.
    Without `sensor` the fake NVML stays unconfigured: a machine with no accelerator sensor."""
    schedule = build_schedule(seed, steady_s, interference_w)
    clock = VirtualClock()
    if sensor:
        pynvml.configure(write_fake_trace(schedule, run_dir.parent / f"{run_dir.name}-fake", seed), clock,
                         call_costs=True, origin_ns=0)
    backends, discoveries = open_backends(["nvml"], clock, strict=sensor)
    sampler = Sampler(backends, discoveries, run_dir / "jpwr", POLL_S, POLL_S, clock=clock, run_id="synthetic",
                      node="n1", background=False).start()
    stamps = ScheduleStamps()
    meter = WindowMeter(LaunchEnv.from_env({}), LocalChannel(sampler), clock=clock, phase_stamps=stamps)
    events = _events(schedule, mark)
    tick, poll_ns = 0, 0
    for t_ns, action, name, step in events:
        while poll_ns < t_ns:  # sensor polls up to this event
            if clock.monotonic_ns() <= poll_ns:
                clock.set_ns(poll_ns)
                sampler.poll_once(tick)
            tick += 1
            poll_ns = tick * int(POLL_S * NS)
        clock.set_ns(t_ns)
        stamps.now_ns = t_ns
        _do(meter, action, name, step)
    meter.attach_energy()
    sampler.stop()
    record = RunRecord(benchmark="synthetic_training", run_id="synthetic", config={"data_parallel": 1},
                       windows=meter.windows)
    write_run_record(run_dir / "run_record.json", record)
    return schedule


def _events(schedule: Schedule, mark: tuple[str, ...]) -> list[tuple[int, str, str, int]]:
    """(time, action, name, step) in time order: window edges and phase boundaries (steady and warm-up only)."""
    events = []
    for name, t0, t1, steps in schedule.windows:
        events += [(round(t0 * NS), "window_begin", name, 0), (round(t1 * NS), "window_end", name, steps)]
    in_training = [(t0, t1) for name, t0, t1, _ in schedule.windows if not name.startswith(REPLAY_PREFIX)]
    for piece in schedule.pieces:
        if piece.phase in mark and any(a <= piece.t0 < b for a, b in in_training):
            events += [(round(piece.t0 * NS), "phase_begin", piece.phase, 0),
                       (round(piece.t1 * NS), "phase_end", piece.phase, 0)]
    order = {"phase_end": 0, "window_end": 1, "window_begin": 2, "phase_begin": 3}  # at equal times
    return sorted(events, key=lambda e: (e[0], order[e[1]]))


def _do(meter: WindowMeter, action: str, name: str, step: int) -> None:
    recorder: PhaseRecorder = meter.phases
    if action == "window_begin":
        meter.begin(name, 0)
    elif action == "window_end":
        work = {"invocations": float(step)} if name.startswith(REPLAY_PREFIX) else {"tokens": 1000.0 * step}
        meter.end(name, step, work)
    elif action == "phase_begin":
        recorder.begin(name)
    else:
        recorder.end(name)
