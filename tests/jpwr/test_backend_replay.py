"""jpwr.backends.replay: the recorded H100 trace plays the segment that matches the run's window (idle for the idle
baseline, steady for the work), and its energy counter only climbs across the switches."""

from __future__ import annotations

import itertools
import json

import pytest

from jpwr.backends.replay import IDLE, STEADY, ReplayBackend
from jpwr.clock import VirtualClock
from jpwr.domains import Sensor, Signal, WindowFollower

S = 10**9


@pytest.fixture
def replay(h100_trace_dir) -> tuple[ReplayBackend, VirtualClock, Sensor]:
    """The backend on a virtual clock, discovered, and its energy counter."""
    clock = VirtualClock(start_ns=5 * S)
    backend = ReplayBackend(clock, h100_trace_dir)
    found = backend.discover()
    return backend, clock, next(s for s in found.sensors if s.signal is Signal.ENERGY_COUNTER)


def _mean_power_w(backend: ReplayBackend, clock: VirtualClock, counter: Sensor, seconds: float) -> float:
    """The counter's climb over `seconds` of this clock, as mean power."""
    before = backend.read([counter])[0].value
    clock.advance_ns(int(seconds * S))
    return (backend.read([counter])[0].value - before) / seconds


def _recorded_mean_w(h100_trace_dir, name: str) -> float:
    """The recording's own mean power over its first `name` segment (its marks and counter)."""
    import csv
    import gzip

    meta = json.loads((h100_trace_dir / "meta.json").read_text())
    begin, end = [t for n, _, t in meta["marks"] if n == name][:2]
    with gzip.open(h100_trace_dir / "trace.csv.gz", "rt") as fh:
        rows = [(int(r["counter_t_after_ns"]), int(r["energy_mJ"])) for r in csv.DictReader(fh)]
    inside = [(t, e) for t, e in rows if begin <= t <= end]
    return (inside[-1][1] - inside[0][1]) / 1e3 / ((inside[-1][0] - inside[0][0]) / S)


def test_the_replay_follows_the_runs_windows(replay, h100_trace_dir) -> None:
    backend, clock, counter = replay
    assert isinstance(backend, WindowFollower)
    idle_w, steady_w = _recorded_mean_w(h100_trace_dir, IDLE), _recorded_mean_w(h100_trace_dir, STEADY)
    assert idle_w < steady_w / 3  # the recording: an idle H100, then a loaded one
    assert _mean_power_w(backend, clock, counter, 2.0) == pytest.approx(idle_w, rel=0.15)  # before any window: idle
    backend.follow_window("command", "begin")  # jpwr's whole-command window says nothing of the load
    assert _mean_power_w(backend, clock, counter, 2.0) == pytest.approx(idle_w, rel=0.15)
    backend.follow_window("warmup", "begin")
    # 20 s: the 8 s segment loops
    assert _mean_power_w(backend, clock, counter, 20.0) == pytest.approx(steady_w, rel=0.05)
    backend.follow_window("replay/forward", "begin")  # a phase replay: the GPU stays busy, the segment plays on
    assert _mean_power_w(backend, clock, counter, 3.0) == pytest.approx(steady_w, rel=0.05)
    backend.follow_window("idle", "begin")
    assert _mean_power_w(backend, clock, counter, 2.0) == pytest.approx(idle_w, rel=0.15)


def test_the_counter_only_climbs_across_switches(replay) -> None:
    backend, clock, counter = replay
    values = []
    for step, window in enumerate(["idle", "steady", "replay/step", "idle", "steady"] * 3):
        backend.follow_window(window, "begin")
        for _ in range(40):
            clock.advance_ns(S // 7 + step)
            values.append(backend.read([counter])[0].value)
    assert all(b >= a for a, b in itertools.pairwise(values)) and values[-1] > values[0]


def test_the_counter_never_steps_back_by_a_rounding_error(replay) -> None:
    """Read every 2 ms through loops and switches: summed in floats, the counter stepped back by one ulp (4.5e-13 J)
    where two pieces of the recording joined, and the meter warned of a counter reset in the demo's windows."""
    backend, clock, counter = replay
    values = []
    for window in ["idle", "steady"] * 6:
        backend.follow_window(window, "begin")
        for _ in range(3000):
            clock.advance_ns(S // 500 + 7)
            values.append(backend.read([counter])[0].value)
    assert all(b >= a for a, b in itertools.pairwise(values))


def test_a_trace_without_segments_plays_whole(h100_trace_dir, tmp_path) -> None:
    """A recording with no idle/steady marks plays from its start, looping, whatever the run's windows."""
    meta = json.loads((h100_trace_dir / "meta.json").read_text())
    meta["marks"] = []
    (tmp_path / "meta.json").write_text(json.dumps(meta))
    (tmp_path / "trace.csv.gz").symlink_to(h100_trace_dir / "trace.csv.gz")
    clock = VirtualClock()
    backend = ReplayBackend(clock, tmp_path)
    power = next(s for s in backend.discover().sensors if s.signal is Signal.POWER_INSTANT)
    seen = []
    for _ in range(300):
        backend.follow_window("idle", "begin")
        clock.advance_ns(S // 10)
        seen.append(backend.read([power])[0].value)
    assert max(seen) > 3 * min(seen)  # the whole recording plays: its loaded segments too, despite `idle`
