"""Run records and jpwr traces for the report tests, made from recorded GPU data (no typed-in measurements).

`replayed_runs` replays the real H100 NVML trace (tests/data/h100_trace) through the fake pynvml into the
production sampler on a virtual clock, once per load phase, as if a benchmark had marked that phase as its
steady window (the idle phase before it as warm-up). Each "run" is a directory like a driver's --out-dir:
run_record.json (built with joulebench.record from the sampler's window energies) and jpwr/<node>/trace.h5 +
summary.json. The work unit is the recorder's load period ("steps": 60 of 100 ms, 109 of 37 ms); the
recorder did not count matmuls, so these records carry no batch size.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from joulebench.record import RunRecord, steady_metrics, write_run_record
from jpwr.channel import Mark
from jpwr.clock import VirtualClock
from jpwr.energy import Window
from jpwr.sampler import Sampler, open_backends

REPO = Path(__file__).resolve().parents[2]
H100_TRACE_DIR = REPO / "tests" / "data" / "h100_trace"
H200_RESULTS = REPO / "benchmarks" / "results" / "2026-11-22-h200-jpwr"
TICK_NS = 100_000_000
# Recorded load phases: name -> load periods in the phase (recorder: 6 s of 100 ms, 4 s of 37 ms periods).
PHASE_STEPS = {"burst100": 60, "burst37": 109}


def _phase_marks(replay, phase: str) -> tuple[int, int, int]:
    """(begin of the idle phase before `phase`, begin of `phase`, end of `phase`) on the replay clock."""
    marks = replay.marks_ns()
    begin = next(i for i, (n, e, _) in enumerate(marks) if n == phase and e == "begin")
    return marks[begin - 2][2], marks[begin][2], marks[begin + 1][2]


def replay_run(phase: str, out_dir: Path, steps: int | None = None, run_id: str | None = None,
               sweep_point: Callable[[Any], tuple[dict[str, Any], float]] | None = None) -> Path:
    """Sample the recorded trace up to the end of `phase`, marking warm-up and steady; write the run record.

    sweep_point(replay), called before sampling on privileged fake GPUs, may change device settings; it returns
    config entries for the record and the phase's time factor under them (the fake's clock response): the window
    keeps the recording's length and the load gets `steps / factor` steps done in it.
    """
    pynvml = sys.modules.get("pynvml") or __import__("pynvml")
    clock = VirtualClock()
    replay = pynvml.configure(H100_TRACE_DIR, clock, origin_ns=0, privileged=sweep_point is not None)
    run_id = run_id or f"replay-{phase}"
    steps = steps or PHASE_STEPS[phase]
    extra_config: dict[str, Any] = {}
    try:
        if sweep_point is not None:
            extra_config, factor = sweep_point(replay)
            steps = round(steps / factor)
        backends, discoveries = open_backends(["nvml"], clock)
        sampler = Sampler(backends, discoveries, out_dir / "jpwr", 0.1, 1.0, clock=clock, run_id=run_id,
                          node="n1", background=False).start()
        warm0, steady0, steady1 = _phase_marks(replay, phase)
        pending = [Mark("warmup", "begin", 0, warm0), Mark("warmup", "end", 1, steady0),
                   Mark("steady", "begin", 1, steady0),
                   Mark("steady", "end", 1 + steps, steady1, work=(("steps", float(steps)),))]
        tick = 0
        while clock.monotonic_ns() < steady1 + 2 * 10**9:
            while pending and pending[0].t_ns <= clock.monotonic_ns():
                sampler.add_mark(pending.pop(0))
            sampler.poll_once(tick)
            tick += 1
            clock.set_ns(clock.monotonic_ns() + TICK_NS - clock.monotonic_ns() % TICK_NS)
        summary = sampler.stop()
    finally:
        pynvml.reset()
    windows = []
    for name, w in summary.windows.items():
        if name in ("warmup", "steady"):
            first = 0 if name == "warmup" else 1
            windows.append(Window(name, first, first + w.steps, w.t0_ns, w.t1_ns, dict(w.work), w.energy))
    steady = next(w for w in windows if w.name == "steady")
    record = RunRecord(
        benchmark="h100_replay", run_id=run_id,
        config={"system": f"H100 replay {phase}", "phase": phase, "source": str(H100_TRACE_DIR.relative_to(REPO)),
                **extra_config},
        hardware={"device_name": json.loads((H100_TRACE_DIR / "meta.json").read_text())["name"], "devices": 1},
        windows=windows, metrics={**steady_metrics(steady, "steps", devices=1), "devices": 1},
    )
    return write_run_record(out_dir / "run_record.json", record)


@pytest.fixture(scope="session")
def replayed_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory holding two replayed runs (burst100/, burst37/), each with run_record.json and jpwr/n1/."""
    root = tmp_path_factory.mktemp("replayed_runs")
    for phase in PHASE_STEPS:
        replay_run(phase, root / phase)
    return root


@pytest.fixture
def h200_trace() -> Path:
    return H200_RESULTS / "accuracy_trace.h5"
