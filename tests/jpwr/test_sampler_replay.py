"""The sampler and estimator on the real H100 trace, replayed through the fake pynvml.

The fake answers each NVML call with what the real GPU returned at that moment of the trace;
the sampler, backend and estimator are the production code, driven on a virtual clock.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from jpwr.channel import Mark
from jpwr.clock import VirtualClock
from jpwr.sampler import Sampler, open_backends

TICK_NS = 100_000_000


def _dense_counter_energy(replay, t0_ns: int, t1_ns: int) -> float:
    """Reference: the trace's own counter, polled every ~7 ms, interpolated between its update instants."""
    trace = replay.trace
    t = np.array([r["counter_t_after_ns"] - trace.t_start_ns for r in trace.rows], dtype=float)
    e = np.array([r["energy_mJ"] / 1000.0 for r in trace.rows])
    change = np.flatnonzero(np.diff(e)) + 1  # reads showing a new value: the update happened just before
    knots_t = (t[change - 1] + t[change]) / 2
    rel0, rel1 = t0_ns - replay.origin_ns, t1_ns - replay.origin_ns
    return float(np.interp(rel1, knots_t, e[change]) - np.interp(rel0, knots_t, e[change]))


def _replay_sampler(fake_pynvml, trace_dir, tmp_path) -> tuple[Sampler, VirtualClock]:
    """A started sampler on the replayed trace, polled only when `_drive` moves its virtual clock."""
    clock = VirtualClock()
    fake_pynvml.configure(trace_dir, clock, origin_ns=0)
    backends, discoveries = open_backends(["nvml"], clock)
    sampler = Sampler(backends, discoveries, tmp_path, 0.1, 1.0, clock=clock, node="n1", background=False)
    return sampler.start(measure_costs=False), clock


def _drive(sampler: Sampler, clock: VirtualClock, until_s: float) -> None:
    """Poll every 100 ms of virtual time until `until_s` seconds after the trace's start."""
    tick = 0
    while clock.monotonic_ns() < until_s * 1e9:
        sampler.poll_once(tick)
        tick += 1
        clock.set_ns(clock.monotonic_ns() + TICK_NS - clock.monotonic_ns() % TICK_NS)


def _replay_run(fake_pynvml, h100_trace_dir, tmp_path, faults=None):
    clock = VirtualClock()
    replay = fake_pynvml.configure(h100_trace_dir, clock, call_costs=True, faults=faults, origin_ns=0)
    backends, discoveries = open_backends(["nvml"], clock)
    sampler = Sampler(backends, discoveries, tmp_path, 0.1, 1.0, clock=clock, run_id="replay", node="n1",
                      background=False).start()
    marks = sorted(replay.marks_ns(), key=lambda m: m[2])
    names: dict[str, str] = {}
    seen: dict[str, int] = {}
    tick = 0
    end = marks[-1][2] + 2 * 10**9
    steps = {"burst100": 60, "burst37": 109, "steady": 1, "idle": 1}
    while clock.monotonic_ns() < end:
        while marks and marks[0][2] <= clock.monotonic_ns():
            name, edge, t = marks.pop(0)
            if edge == "begin":  # phases repeat ("idle" four times): number them
                seen[name] = seen.get(name, 0) + 1
            label = f"{name}{seen[name]}"
            names[label] = name
            sampler.add_mark(Mark(label, edge, 0 if edge == "begin" else steps[name], t))
        sampler.poll_once(tick)
        tick += 1
        clock.set_ns(clock.monotonic_ns() + TICK_NS - clock.monotonic_ns() % TICK_NS)
    return replay, sampler, names


@pytest.fixture
def replayed(fake_pynvml, h100_trace_dir, tmp_path):
    return _replay_run(fake_pynvml, h100_trace_dir, tmp_path)


def test_counter_anchored_windows_match_the_traces_counter(replayed):
    replay, sampler, _ = replayed
    energies = sampler.window_energies(["steady1", "idle1", "idle2"])
    spans = {m.name: m for m in sampler.marks}
    for name, energy in energies.items():
        begin = next(m for m in sampler.marks if m.name == name and m.edge == "begin")
        end = next(m for m in sampler.marks if m.name == name and m.edge == "end")
        reference = _dense_counter_energy(replay, begin.t_ns, end.t_ns)
        assert energy.method == "counter+power", name
        assert energy.coverage == pytest.approx(1.0)
        assert abs(energy.energy_j - reference) <= energy.error_bound_j, (name, energy.energy_j, reference)
    assert spans  # marks were recorded
    steady = energies["steady1"]
    reference = _dense_counter_energy(replay, *[m.t_ns for m in sampler.marks if m.name == "steady1"])
    assert abs(steady.energy_j / reference - 1) < 0.005
    assert 650 < steady.mean_power_w < 720  # the recorded steady matmul ran at the 700 W cap


def test_bursts_at_the_sensor_period_raise_the_aliasing_warning(replayed):
    _, sampler, _ = replayed
    energies = sampler.window_energies(["burst1001", "burst371"])
    assert any("aliasing" in w for w in energies["burst1001"].warnings)
    assert not any("aliasing" in w for w in energies["burst371"].warnings)
    assert energies["burst1001"].error_bound_j >= 0.08 * energies["burst1001"].energy_j


def test_averaged_power_fallback_is_labelled_and_bounded(fake_pynvml, h100_trace_dir, tmp_path):
    """No counter, no instant field: the 1 s average is used, warned about, and the bound covers its lag."""
    Fail = fake_pynvml.Fail
    faults = fake_pynvml.Faults(fails=(
        Fail("nvmlDeviceGetTotalEnergyConsumption"), Fail(f"field:{fake_pynvml.NVML_FI_DEV_POWER_INSTANT}")))
    replay, sampler, _ = _replay_run(fake_pynvml, h100_trace_dir, tmp_path, faults=faults)
    energy = sampler.window_energies(["steady1"])["steady1"]
    begin = next(m for m in sampler.marks if m.name == "steady1" and m.edge == "begin")
    end = next(m for m in sampler.marks if m.name == "steady1" and m.edge == "end")
    reference = _dense_counter_energy(replay, begin.t_ns, end.t_ns)
    assert energy.method == "power"
    assert any("averaged over 1 s" in w for w in energy.warnings)
    assert abs(energy.energy_j - reference) <= energy.error_bound_j


def test_stop_writes_summary_and_hdf5_that_reload_identically(replayed, tmp_path):
    from jpwr.trace_io import load_trace, read_segments
    from jpwr.windows import spans_from_marks, window_energy

    _, sampler, _ = replayed
    summary = sampler.stop()
    node_dir = tmp_path / "n1"
    assert (node_dir / "trace.h5").exists() and (node_dir / "summary.json").exists()
    for loaded in (load_trace(node_dir), read_segments(node_dir)):
        span = spans_from_marks(loaded.marks)["steady1"]
        again = window_energy(loaded, span, 0.1, "n1")
        assert again.energy_j == pytest.approx(summary.windows["steady1"].energy.energy_j, rel=1e-9)
    assert {m.name for m in loaded.metrics} >= {"sm_clock_hz", "utilization_gpu"}


def test_slow_reads_keep_absolute_deadlines(fake_pynvml, h100_trace_dir, tmp_path):
    """A read slower than the interval skips ticks (counted) instead of drifting or bunching samples."""
    clock = VirtualClock()
    fake_pynvml.configure(h100_trace_dir, clock, faults=fake_pynvml.Faults(slow_ms={"nvmlDeviceGetFieldValues": 250.0}))
    backends, discoveries = open_backends(["nvml"], clock)
    sampler = Sampler(backends, discoveries, tmp_path, 0.1, 1.0, clock=clock, node="n1")
    sampler.start(measure_costs=False)
    field_reads = sampler.readings[next(s.id for s in sampler.sensors if s.signal.value == "power_instant")]
    deadline = time.monotonic() + 30  # the virtual clock runs the loop fast: until slow reads have skipped ticks
    while (sampler.missed_ticks == 0 or len(field_reads) < 4) and time.monotonic() < deadline:
        time.sleep(0.01)
    sampler._stop.set()
    sampler._thread.join(timeout=30)
    gaps = np.diff([r.t_before_ns for r in field_reads])
    assert sampler.missed_ticks > 0
    assert (gaps >= 0.25e9).all()  # never two reads closer than the slow read itself
    assert (gaps % TICK_NS < 0.26e9).all()
