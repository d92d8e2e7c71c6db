"""Phase marks: the recorder's exclusive intervals, one batch per window, the socket transport and trace storage."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from joulebench.launch import LaunchEnv
from jpwr.channel import Mark, SocketChannel
from jpwr.clock import VirtualClock
from jpwr.meter import WindowMeter
from jpwr.phases import MAX_PART_BYTES, HostStamps, PhaseBatch, PhaseRecorder, place_between
from jpwr.sampler import LocalChannel, Sampler, SocketServer
from jpwr.trace_io import read_hdf5, read_segments


class Steps:
    """A recorder on a virtual clock: each call happens `dt_ns` after the previous one."""

    def __init__(self) -> None:
        self.clock = VirtualClock(start_ns=1_000)
        self.recorder = PhaseRecorder(HostStamps(self.clock))

    def at(self, t_ns: int) -> PhaseRecorder:
        self.clock.set_ns(t_ns)
        return self.recorder


def test_time_belongs_to_the_innermost_open_phase_and_end_closes_inner_phases() -> None:
    s = Steps()
    s.recorder.window_begin("steady", s.recorder.edge_stamp(), 1_000)
    s.at(2_000).begin("backward")
    s.at(5_000).begin("grad_reduce")  # begun inside backward (the DDP hook), never ended by itself
    s.at(7_000).end("backward")
    with s.at(8_000).phase("optimizer"):
        s.at(9_000)
    batch = s.at(10_000).window_end("steady", s.recorder.edge_stamp(), 10_000, rank=1, local_rank=1)
    assert batch is not None and (batch.window, batch.rank, batch.clock) == ("steady", 1, "host")
    assert list(batch.intervals()) == [("backward", 2_000, 5_000), ("grad_reduce", 5_000, 7_000),
                                       ("optimizer", 8_000, 9_000)]
    assert s.recorder.current is None


def test_a_phase_open_at_a_window_edge_counts_from_and_up_to_the_edge() -> None:
    s = Steps()
    s.at(500).begin("forward")  # before any window: no stamp taken
    s.recorder.window_begin("steady", s.at(1_000).edge_stamp(), 1_000)
    s.at(3_000).end("forward")
    s.at(4_000).begin("backward")
    batch = s.at(6_000).window_end("steady", s.recorder.edge_stamp(), 6_000, 0, 0)
    assert list(batch.intervals()) == [("forward", 1_000, 3_000), ("backward", 4_000, 6_000)]
    s.at(7_000).end("backward")  # still balanced after the window


def test_a_disabled_recorder_takes_no_stamps_and_marks_nothing() -> None:
    s = Steps()
    s.recorder.enabled = False
    assert s.recorder.edge_stamp() is None
    s.recorder.window_begin("steady", None, 1_000)
    with s.recorder.phase("forward"):
        s.recorder.end("never begun")  # ignored while off
    assert s.recorder.window_end("steady", None, 2_000, 0, 0) is None


def test_ending_a_phase_that_is_not_open_is_an_error() -> None:
    s = Steps()
    s.recorder.begin("forward")
    with pytest.raises(RuntimeError, match="'backward' ended but not begun"):
        s.recorder.end("backward")


def test_device_events_are_placed_between_the_synced_edges() -> None:
    # edges 1 s apart on the host, 999.9 ms apart on the device timer: the event halfway lands halfway
    assert place_between(10_000_000_000, 11_000_000_000, 999.9, 499.95) == 10_500_000_000
    assert place_between(10, 10, 0.0, 0.001) == 1_010  # edges closer than the timer: offset only


def _batch(count: int) -> PhaseBatch:
    names = ("forward", "backward")
    return PhaseBatch("steady", 0, 0, "device_events", names, tuple(i % 2 for i in range(count)),
                      tuple(1_000_000_000_000 + 10_000_000 * i for i in range(count)),
                      tuple(1_000_000_000_000 + 10_000_000 * i + 7_000_000 for i in range(count)))


def test_a_long_batch_is_split_into_datagram_sized_parts_that_add_up() -> None:
    batch = _batch(7_000)
    parts = batch.split()
    assert len(parts) > 1 and [p.part for p in parts] == list(range(1, len(parts) + 1))
    assert all(p.parts == len(parts) and len(json.dumps(p.to_dict())) <= MAX_PART_BYTES for p in parts)
    assert [i for p in parts for i in p.intervals()] == list(batch.intervals())
    assert PhaseBatch.from_dict(json.loads(json.dumps(parts[1].to_dict()))) == parts[1]


def test_socket_transport_reaches_the_sampler_and_the_trace_keeps_it(tmp_path: Path) -> None:
    sampler = Sampler([], [], tmp_path, 0.1, 1.0, run_id="phases", node="n1").start()
    addr = str(tmp_path / "s.sock")
    server = SocketServer(sampler, addr).start()
    channel = SocketChannel(addr)
    batch = _batch(7_000)
    t0, t1 = batch.t0_ns[0] - 1, batch.t1_ns[-1] + 1
    channel.send_mark(Mark("steady", "begin", 0, t0))
    channel.send_mark(Mark("steady", "end", 10, t1))
    channel.send_phases(batch)
    deadline = time.monotonic() + 20
    while sum(len(b) for b in sampler.phases) < len(batch) and time.monotonic() < deadline:
        time.sleep(0.05)
    server.stop()
    channel.close()
    summary = sampler.stop()
    rows = summary.windows["steady"].phases
    assert {r["phase"]: r["intervals"] for r in rows} == {"forward": 3_500, "backward": 3_500}
    assert all(r["complete"] for r in rows)
    assert rows[0]["seconds"] == pytest.approx(3_500 * 0.007)
    for trace in (read_hdf5(tmp_path / "n1" / "trace.h5"), read_segments(tmp_path / "n1")):
        assert sorted(i for b in trace.phases for i in b.intervals()) == sorted(batch.intervals())


def test_marks_queued_when_the_server_stops_still_reach_the_sampler(tmp_path: Path) -> None:
    """A command that marks a window and exits at once: its marks may still sit in the socket when `jpwr --` stops
    the server (seen under a loaded test suite: the window was missing from the summary). The server reads them
    before it closes."""
    sampler = Sampler([], [], tmp_path, 0.1, 1.0, run_id="late", node="n1").start()
    addr = str(tmp_path / "s.sock")
    server = SocketServer(sampler, addr)  # not started yet: nothing reads the socket
    channel = SocketChannel(addr)
    now = time.monotonic_ns()
    channel.send_mark(Mark("steady", "begin", 0, now - 1_000_000))
    channel.send_mark(Mark("steady", "end", 1, now))
    channel.close()
    server._stop.set()  # the command ended before the server thread read anything
    server.start().stop()
    assert "steady" in sampler.stop().windows


def test_the_meter_sends_one_batch_per_window_after_its_end_edge(tmp_path: Path) -> None:
    clock = VirtualClock(start_ns=5_000_000_000)
    sampler = Sampler([], [], tmp_path, 0.1, 1.0, clock=clock, run_id="meter", node="n1", background=False).start()
    meter = WindowMeter(LaunchEnv.from_env({}), LocalChannel(sampler), clock=clock, phase_stamps=HostStamps(clock))
    sends: list[int] = []
    original = sampler.add_phases
    sampler.add_phases = lambda batch: (sends.append(len(batch)), original(batch))  # type: ignore[method-assign]
    for window in ("warmup", "steady"):
        meter.begin(window, 0)
        for _ in range(5):
            for phase in ("forward", "backward", "optimizer"):
                with meter.phases.phase(phase):
                    clock.advance_ns(10_000_000)
        assert sends == ([] if window == "warmup" else [15])  # nothing per step
        meter.end(window, 5)
    assert sends == [15, 15]
    steady = next(b for b in sampler.phases if b.window == "steady")
    assert all(meter.windows[1].t_start_ns <= a < b <= meter.windows[1].t_end_ns for _, a, b in steady.intervals())


def test_a_meter_without_sampler_keeps_its_recorder_off() -> None:
    meter = WindowMeter(LaunchEnv.from_env({}), None)
    assert not meter.phases.enabled
    meter.begin("steady", 0)
    with meter.phases.phase("forward"):
        pass
    meter.end("steady", 1)


def test_marking_from_another_thread_inside_a_phase_is_kept(tmp_path: Path) -> None:
    """DDP's gradient hook runs on autograd's thread while the loop waits inside backward."""
    s = Steps()
    s.recorder.window_begin("steady", s.recorder.edge_stamp(), 1_000)
    s.at(2_000).begin("backward")
    hook = threading.Thread(target=lambda: s.at(3_000).begin("grad_reduce"))
    hook.start()
    hook.join()
    s.at(4_000).end("backward")
    batch = s.recorder.window_end("steady", s.at(5_000).edge_stamp(), 5_000, 0, 0)
    assert [name for name, _, _ in batch.intervals()] == ["backward", "grad_reduce"]


class _DeviceTimer:
    """The hardware boundary of DeviceEventStamps: a GPU whose event timer runs 0.1 % fast from its own origin and
    executes work `lag_ns` after the host queues it (the host runs ahead; only syncs line the two up)."""

    def __init__(self, clock: VirtualClock, lag_ns: int) -> None:
        self.clock, self.lag_ns, self.created = clock, lag_ns, 0
        timer = self

        class Event:
            def __init__(self, enable_timing: bool = False) -> None:
                assert enable_timing
                timer.created += 1
                self.device_ns: float | None = None

            def record(self) -> None:
                self.device_ns = (timer.clock.monotonic_ns() + timer.lag_ns) * 1.001 + 7e12

            def elapsed_time(self, other: Event) -> float:
                return (other.device_ns - self.device_ns) / 1e6

        self.cuda = type("cuda", (), {"Event": Event})


def test_device_events_map_onto_host_time_through_the_synced_edges() -> None:
    from jpwr.phases import DeviceEventStamps

    clock = VirtualClock(start_ns=1_000_000_000)
    device = _DeviceTimer(clock, lag_ns=40_000_000)
    recorder = PhaseRecorder(DeviceEventStamps(device))
    for window in ("warmup", "steady"):
        edge = recorder.edge_stamp()  # queued, then the sync waits until the device has run it
        clock.advance_ns(device.lag_ns)
        recorder.window_begin(window, edge, clock.monotonic_ns())
        start = clock.monotonic_ns()
        for phase in ("forward", "backward"):
            with recorder.phase(phase):
                clock.advance_ns(100_000_000)
        edge = recorder.edge_stamp()
        clock.advance_ns(device.lag_ns)
        batch = recorder.window_end(window, edge, clock.monotonic_ns(), 0, 0)
        # the device ran each phase lag_ns after the host queued it: that is where the marks land
        assert [(n, a - start, b - start) for n, a, b in batch.intervals()] == [
            ("forward", pytest.approx(40_000_000, abs=10), pytest.approx(140_000_000, abs=10)),
            ("backward", pytest.approx(140_000_000, abs=10), pytest.approx(240_000_000, abs=10))]
    assert device.created == 2 + 4  # per window: two edges, four boundaries; steady reused warm-up's events
