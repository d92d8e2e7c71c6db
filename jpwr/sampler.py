"""The per-node sampler: polls the node's sensors on absolute deadlines and answers window queries.

One sampler per node meters the accelerators the job owns there; ranks only send marks.
Instantaneous power and latent metrics are read every `interval_s`; energy counters at
`counter_interval_s` (an H100 counter read costs ~4 ms) unless a read is cheap, and at
every window mark. Readings go to append-only segments flushed every second and on stop.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from jpwr import __version__
from jpwr.channel import MAX_DATAGRAM, Mark
from jpwr.claims import claim_node_dir, claim_socket
from jpwr.clock import SYSTEM_CLOCK, Clock
from jpwr.domains import Backend, Discovery, Domain, MetricReading, Reading, Sensor, Signal, WindowFollower
from jpwr.energy import WindowEnergy
from jpwr.errors import MethodUnavailableError, OutputDirError, os_error_message
from jpwr.live import NodeLive, NodeLiveDict, node_live
from jpwr.node import directory_node_name
from jpwr.output import utc_now, write_json_atomic
from jpwr.phases import PhaseBatch, phase_summary
from jpwr.selectors import empty_selection
from jpwr.summary import SUMMARY_FILE, NodeSummary, NodeWindow
from jpwr.trace_io import SEGMENT_DIR, TRACE_FILE, SegmentWriter, TraceData, write_hdf5
from jpwr.windows import DEFAULT_MIN_COVERAGE, accelerator_domains, job_domains, spans_from_marks, window_energy

CHEAP_READ_S = 0.001
CHASE_S = 0.01  # counter poll gap right after a mark  # counters cheaper than this are read every tick
COST_PROBE_READS = 5


def open_backends(
    methods: Sequence[str] | None, clock: Clock, strict: bool = True, whole_node: bool = False,
    option: str = "--methods",
) -> tuple[list[Backend], list[Discovery]]:
    """Create the requested backends (None = every known one, keeping those that find sensors).

    A vendor backend meters the job's devices (jpwr.selectors.job_devices). With `whole_node` it meters every
    device of the node and names those outside the job's binding in `Discovery.outside_job`: the node's other
    devices get their own line over the same windows, never a place in the headline.

    With `strict`, an explicitly named method that finds nothing of the job's raises before any command starts;
    `jpwr info` is not strict: it lists what is missing and why. `option`: the caller's name for the methods
    option, which the error's fix names (a driver's in-process meter takes `--energy-methods`).
    """
    from jpwr.backends import BACKEND_NAMES, create_backend
    from jpwr.selectors import job_devices

    vendor_of = {"nvml": "nvidia", "amdsmi": "amd"}
    names = list(methods) if methods else list(BACKEND_NAMES)
    backends: list[Backend] = []
    discoveries: list[Discovery] = []
    for name in names:
        known = [d for disc in discoveries for d in disc.domains]
        selection = job_devices(vendor_of[name]) if name in vendor_of else None
        selectors = None if selection is None else selection.selector_list
        nothing_selected = selectors == []  # the job owns no device of this vendor here: not a failure
        backend = create_backend(name, clock, selectors=selectors, gpu_domains=known)
        found = backend.discover()
        if whole_node and selectors is not None and name in vendor_of:
            backend, found = _whole_node(name, clock, known, backend, found)
        if selection is not None:
            found.info["selection"] = selection.described  # which devices are the job's, and who said so
        if methods and strict and not nothing_selected and not _has_job_sensors(found):
            backend.close()
            reasons = "; ".join(found.unavailable) or "no sensors found"
            raise MethodUnavailableError(
                f"method {name!r} is not available on this machine ({reasons}). "
                f"Fix: drop it from {option}, or use {option} auto to meter whatever exists")
        discoveries.append(found)
        if found.available:
            backends.append(backend)
        else:
            backend.close()
    return backends, discoveries


def _has_job_sensors(found: Discovery) -> bool:
    """Whether a discovery has a sensor on a device of the job's, not only on the node's other devices."""
    outside = set(found.outside_job)
    return any(s.domain_id not in outside for s in found.sensors)


def _whole_node(name: str, clock: Clock, known: list[Domain], job_backend: Backend, job_found: Discovery
                ) -> tuple[Backend, Discovery]:
    """Every device of the node through one backend, the ones the job's discovery did not find named outside the
    job. The job's own discovery resolved its selectors exactly as the meter does (UUID prefixes, MIG, PCI ids)."""
    from jpwr.backends import create_backend

    job_backend.close()
    backend = create_backend(name, clock, selectors=None, gpu_domains=known)
    found = backend.discover()
    job_ids = {d.id for d in job_found.domains}
    found.outside_job = [d.id for d in found.domains if d.id not in job_ids]
    found.unavailable += [line for line in job_found.unavailable if line not in found.unavailable]
    return backend, found


class Sampler:
    """Polls sensors in a background thread; thread-safe `add_mark` and `window_energies`."""

    def __init__(
        self,
        backends: Sequence[Backend],
        discoveries: Sequence[Discovery],
        out_dir: Path,
        interval_s: float = 0.1,
        counter_interval_s: float = 1.0,
        clock: Clock = SYSTEM_CLOCK,
        run_id: str | None = None,
        node: str | None = None,
        background: bool = True,
        min_coverage: float = DEFAULT_MIN_COVERAGE,
    ) -> None:
        self.backends = list(backends)
        self.discoveries = list(discoveries)
        self.interval_s = interval_s
        self.counter_interval_s = counter_interval_s
        self.clock = clock
        self.background = background  # False: the caller drives poll_once() (replay tests on a virtual clock)
        self.min_coverage = min_coverage  # below it a window's energy is withheld as untrusted (docs/jpwr.md)
        self.node = node or directory_node_name()
        self.run_id = run_id or f"run-{int(time.time())}"
        self.node_dir = Path(out_dir) / self.node
        try:
            self.node_dir.mkdir(parents=True, exist_ok=True)
            probe = self.node_dir / ".write-test"
            probe.write_text("")
            probe.unlink()
        except OSError as exc:
            raise OutputDirError(f"cannot write to output directory {self.node_dir}: {exc}. "
                                 "Fix: choose a writable --out directory") from exc
        self.domains = [d for disc in self.discoveries for d in disc.domains]
        # A whole-node request: the node's devices outside the job's binding, metered on their own line only.
        self.outside_job = [i for disc in self.discoveries for i in disc.outside_job]
        # Only a node without accelerators of the job's can have metered nothing on purpose.
        self.empty_selection = None if accelerator_domains(self.job_domains) else empty_selection()
        self.sensors: list[Sensor] = []
        self._sensor_backend: dict[str, Backend] = {}
        for backend, disc in zip(self.backends, [d for d in self.discoveries if d.available], strict=True):
            for sensor in disc.sensors:
                self.sensors.append(sensor)
                self._sensor_backend[sensor.id] = backend
        self.readings: dict[str, list[Reading]] = {s.id: [] for s in self.sensors}
        self.metrics: list[MetricReading] = []
        self.marks: list[Mark] = []
        self.phases: list[PhaseBatch] = []
        self.missed_ticks = 0
        self.started_at = utc_now()
        self._clock_pairs: list[tuple[int, int]] = []
        self._io = threading.Lock()  # vendor libraries (amdsmi) are not thread-safe; one reader at a time
        self._data = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        try:  # the first writes with content: a full disk takes an empty probe, not these
            self._claim = claim_node_dir(self.node_dir, self.run_id, (SUMMARY_FILE, TRACE_FILE, SEGMENT_DIR))
            self._writer = SegmentWriter(self.node_dir)
        except OSError as exc:  # a flush's error names no file: this one says where
            raise OutputDirError(f"cannot write to output directory {self.node_dir} ({exc.strerror or exc}). Fix: "
                                 "free space on that file system, or choose another --out directory") from exc
        self._stopped = False

    @property
    def job_domains(self) -> list[Domain]:
        """The domains of the job's devices: every domain but those a whole-node request added."""
        return job_domains(self.domains, self.outside_job)

    # --- sensor I/O -------------------------------------------------------------------------
    def _read(self, sensors: Sequence[Sensor]) -> None:
        by_backend: dict[int, list[Sensor]] = {}
        for s in sensors:
            by_backend.setdefault(id(self._sensor_backend[s.id]), []).append(s)
        got: list[Reading] = []
        with self._io:
            for group in by_backend.values():
                got += self._sensor_backend[group[0].id].read(group)
        with self._data:
            for r in got:
                self.readings[r.sensor_id].append(r)
                self._writer.reading(r)

    def _read_metrics(self) -> None:
        got: list[MetricReading] = []
        with self._io:
            for backend in self.backends:
                got += backend.read_metrics()
        with self._data:
            self.metrics += got
            for m in got:
                self._writer.metric(m)

    @property
    def counters(self) -> list[Sensor]:
        return [s for s in self.sensors if s.signal is Signal.ENERGY_COUNTER]

    def read_counters(self) -> None:
        if self.counters:
            self._read(self.counters)

    def _measure_costs(self) -> None:
        """Time each sensor's read so `jpwr info` and the cadence decision use this machine's cost."""
        measured = []
        for s in self.sensors:
            t0 = self.clock.monotonic_ns()
            with self._io:
                for _ in range(COST_PROBE_READS):
                    self._sensor_backend[s.id].read([s])
            cost = (self.clock.monotonic_ns() - t0) / 1e9 / COST_PROBE_READS
            measured.append(_with_cost(s, cost))
        self.sensors = measured
        self._sensor_backend = {s.id: self._sensor_backend[s.id] for s in self.sensors}

    # --- loop -------------------------------------------------------------------------------
    def start(self, measure_costs: bool = True) -> Sampler:
        if measure_costs:
            self._measure_costs()
        self._clock_pairs.append((self.clock.wall_ns(), self.clock.monotonic_ns()))
        self._writer.header(self.domains, self.sensors, self.info())
        if self.background:
            self._thread = threading.Thread(target=self._loop, name="jpwr-sampler", daemon=True)
            self._thread.start()
        return self

    def poll_once(self, tick: int = 0) -> None:
        """One sampling round: fast sensors and metrics, plus the counters when due."""
        fast, counters_due = self._fast_and_due(tick)
        slow_counters = [s for s in self.counters if s not in fast] if counters_due else []
        if fast or slow_counters:
            self._read(fast + slow_counters)
        self._read_metrics()

    def _fast_and_due(self, tick: int) -> tuple[list[Sensor], bool]:
        fast = [s for s in self.sensors if s.signal is not Signal.ENERGY_COUNTER
                or (s.read_cost_s is not None and s.read_cost_s < CHEAP_READ_S)]
        every = max(1, round(self.counter_interval_s / self.interval_s))
        return fast, tick % every == 0

    def _loop(self) -> None:
        period = int(self.interval_s * 1e9)
        deadline = self.clock.monotonic_ns()
        tick = 0
        last_flush = deadline
        while not self._stop.is_set():
            self.poll_once(tick)
            now = self.clock.monotonic_ns()
            if now - last_flush >= 1_000_000_000:
                with self._data:
                    self._writer.flush()
                last_flush = now
            deadline += period  # absolute deadlines: no drift, no near-duplicate pairs
            if deadline <= now:
                skipped = (now - deadline) // period + 1
                self.missed_ticks += int(skipped)
                deadline += skipped * period
            tick += 1
            if not self.clock.sleep_until_ns(deadline, self._stop):
                break

    # --- marks and windows ------------------------------------------------------------------
    def add_mark(self, mark: Mark) -> None:
        """Record a rank's window edge and pin the counters around it (they anchor the edge)."""
        with self._data:
            self.marks.append(mark)
            self._writer.mark(mark)
        with self._io:
            for backend in self.backends:
                if isinstance(backend, WindowFollower):
                    backend.follow_window(mark.name, mark.edge)
        if self.background:
            threading.Thread(target=self._chase_counters, name="jpwr-chase", daemon=True).start()
        else:
            self._chase_counters()

    def add_phases(self, batch: PhaseBatch) -> None:
        """Store a rank's phase intervals of one window (no counter chase: the window's end mark did that)."""
        with self._data:
            self.phases.append(batch)
            self._writer.phases(batch)

    def _chase_counters(self) -> None:
        """Read the counters every CHASE_S until each has ticked once.

        A counter value is only known to stem from some update within the last period; the
        first read that shows a new value pins that update to the gap since the read before,
        so the window edge's knot is placed to within ~one read instead of ~one update period.
        """
        counters = self.counters
        if not counters:
            return
        update = max((s.est_update_s or 0.1) for s in counters)
        self.read_counters()
        with self._data:
            first = {s.id: self.readings[s.id][-1].value for s in counters}
        deadline = self.clock.monotonic_ns() + int(1.5 * update * 1e9)
        while self.clock.monotonic_ns() < deadline:
            self.clock.sleep_until_ns(self.clock.monotonic_ns() + int(CHASE_S * 1e9))
            self.read_counters()
            with self._data:
                if all(self.readings[s.id][-1].value != first[s.id] for s in counters):
                    return

    def latest(self) -> tuple[dict[str, Reading], list[Mark], int | None]:
        """Each sensor's latest valid reading, the marks so far, and wall minus monotonic time (ns) from the pair
        read at start: what `--metrics-port` serves, without a sensor read."""
        with self._data:
            latest = {sid: r for sid, rs in self.readings.items()
                      if (r := next((x for x in reversed(rs) if x.value is not None), None)) is not None}
            marks = list(self.marks)
        offset = self._clock_pairs[0][0] - self._clock_pairs[0][1] if self._clock_pairs else None
        return latest, marks, offset

    def live(self, span_s: float) -> NodeLive:
        """Recent power, temperature and update period per accelerator, from readings already taken."""
        with self._data:
            return node_live(self.node, accelerator_domains(self.job_domains), self.sensors, self.readings,
                             self.metrics, self.clock.monotonic_ns(), span_s)

    def trace(self) -> TraceData:
        with self._data:
            return TraceData(
                list(self.domains), list(self.sensors), self.info(),
                {k: list(v) for k, v in self.readings.items()}, list(self.metrics), list(self.marks),
                list(self.phases))

    def _settle_after(self, t_end_ns: int) -> None:
        """Wait until counters have updated past the window end, then read them once more."""
        update = max((s.est_update_s or 0.0) for s in self.counters) if self.counters else 0.0
        if update:
            self.clock.sleep_until_ns(t_end_ns + int(2 * update * 1e9))
            self.read_counters()

    def window_energies(self, names: Sequence[str] | None = None) -> dict[str, WindowEnergy]:
        spans = spans_from_marks(self.trace().marks, intervals=names is not None)
        wanted = list(names) if names is not None else list(spans)
        if any(n in spans for n in wanted):
            self._settle_after(max(spans[n].t1_ns for n in wanted if n in spans))
        trace = self.trace()
        result = {}
        for name in wanted:
            span = spans.get(name)
            if span is None:
                result[name] = WindowEnergy.unavailable(f"window {name!r} was not marked (begin and end) on node "
                                                        f"{self.node}")
            else:
                result[name] = window_energy(trace, span, self.interval_s, self.node, self.unavailable,
                                             self.empty_selection, self.min_coverage)
        return result

    @property
    def unavailable(self) -> list[str]:
        return [u for d in self.discoveries for u in d.unavailable]

    def info(self) -> dict[str, Any]:
        return {
            "jpwr_version": __version__, "run_id": self.run_id, "node": self.node, "host": socket.gethostname(),
            "pid": os.getpid(), "interval_s": self.interval_s, "counter_interval_s": self.counter_interval_s,
            "min_coverage": self.min_coverage,
            "backends": {d.backend: d.info for d in self.discoveries if d.available},
            "unavailable": self.unavailable, "empty_selection": self.empty_selection, "outside_job": self.outside_job,
            "clock_pairs_wall_mono_ns": self._clock_pairs,
            "started_at": self.started_at,
        }

    # --- stop -------------------------------------------------------------------------------
    def stop(self) -> NodeSummary:
        """Stop polling, flush, assemble the HDF5 trace and write the node summary. Idempotent.

        Backends are closed even when a write fails (a full disk): the caller still has the
        measurement in memory (`in_memory_summary`) and can print it.
        """
        if self._stopped:
            return NodeSummary.from_dict(json.loads((self.node_dir / SUMMARY_FILE).read_text()))
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        try:
            spans = spans_from_marks(self.marks)
            if spans:
                self._settle_after(max(s.t1_ns for s in spans.values()))
            self.read_counters()
            self._clock_pairs.append((self.clock.wall_ns(), self.clock.monotonic_ns()))
            with self._data:
                self._writer.close()
            summary = self.in_memory_summary()
            if self._writer.error is not None:
                # The file system refused a write already; libhdf5 does not survive a failing write (it can
                # crash the process), so the summary alone is attempted and the segments hold what was written.
                summary.trace_error = f"segments stopped: {os_error_message(self._writer.error)}"
            else:
                try:
                    write_hdf5(self.node_dir / TRACE_FILE, self.trace())
                    summary.trace_file = TRACE_FILE
                except Exception as exc:  # the segments stay readable; never lose the summary over HDF5
                    summary.trace_error = repr(exc)
            write_json_atomic(self.node_dir / SUMMARY_FILE, summary.to_dict())
        finally:
            for backend in self.backends:
                with contextlib.suppress(Exception):
                    backend.close()
            self._stopped = True
            self._claim.close()  # the directory now holds a finished trace, which keeps later runs out
        return summary

    def in_memory_summary(self) -> NodeSummary:
        """The node summary from what this process holds, written nowhere (trace_file still unset)."""
        return summarize_trace(self.trace(), self.interval_s, missed_ticks=self.missed_ticks)


def summarize_trace(trace: TraceData, interval_s: float, missed_ticks: int | None = None) -> NodeSummary:
    """A node summary from a node's trace: the sampler's at its stop, combine's for a node whose sampler was
    killed before writing one (from its segments)."""
    info = trace.info
    node = str(info.get("node"))
    unavailable = list(info.get("unavailable", []))
    windows = {}
    for name, span in spans_from_marks(trace.marks).items():
        energy = window_energy(trace, span, interval_s, node, unavailable, info.get("empty_selection"),
                               float(info.get("min_coverage", DEFAULT_MIN_COVERAGE)))
        windows[name] = NodeWindow(t0_ns=span.t0_ns, t1_ns=span.t1_ns, duration_s=(span.t1_ns - span.t0_ns) / 1e9,
                                   steps=span.steps, work=span.work, energy=energy,
                                   phases=phase_summary([b for b in trace.phases if b.window == name]))
    return NodeSummary(
        run_id=info.get("run_id"), node=node, finished_at=utc_now(), info=info, missed_ticks=missed_ticks,
        domains=[d.to_dict() for d in trace.domains], sensors=[s.to_dict() for s in trace.sensors], windows=windows)


def _with_cost(sensor: Sensor, cost: float) -> Sensor:
    from dataclasses import replace

    return replace(sensor, read_cost_s=cost)


class SocketServer:
    """Receives marks and answers queries on the node's Unix datagram socket."""

    def __init__(self, sampler: Sampler, addr: str) -> None:
        self.sampler = sampler
        self.addr = addr
        claim_socket(addr)
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.bind(addr)
        self._sock.settimeout(0.2)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="jpwr-marks", daemon=True)

    def start(self) -> SocketServer:
        self._thread.start()
        return self

    def _serve(self) -> None:
        """Until stopped, and then until nothing is queued: a command that marks a window and exits at once (or a
        loaded machine whose server thread had not read them yet) must not lose its last marks."""
        while True:
            try:
                data, peer = self._sock.recvfrom(MAX_DATAGRAM)
            except (TimeoutError, OSError):
                if self._stop.is_set():
                    return
                continue
            self._handle(data, peer)

    def _handle(self, data: bytes, peer: Any) -> None:
        try:
            msg = json.loads(data)
        except json.JSONDecodeError:
            return
        if msg.get("type") == "mark":
            self.sampler.add_mark(Mark.from_dict(msg))
        elif msg.get("type") == "who" and peer:
            who = {"type": "who", "pid": os.getpid(), "node": self.sampler.node, "run_id": self.sampler.run_id}
            with contextlib.suppress(OSError):
                self._sock.sendto(json.dumps(who).encode(), peer)
        elif msg.get("type") == "live" and peer:  # answered at once: only readings already held
            reply = json.dumps({"type": "live", "live": self.sampler.live(float(msg.get("span_s", 1.0))).to_dict()})
            with contextlib.suppress(OSError):
                self._sock.sendto(reply.encode(), peer)
        elif msg.get("type") == "phases":
            self.sampler.add_phases(PhaseBatch.from_dict(msg))
        elif msg.get("type") == "query" and peer:
            # Answer from a worker thread: settling waits for the counter, marks keep flowing.
            threading.Thread(target=self._answer, args=(msg, peer), daemon=True).start()

    def _answer(self, msg: dict[str, Any], peer: Any) -> None:
        energies = self.sampler.window_energies(msg.get("names"))
        reply = json.dumps({"type": "energy", "windows": {k: v.to_dict() for k, v in energies.items()}}).encode()
        with contextlib.suppress(OSError):
            self._sock.sendto(reply, peer)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self._sock.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.addr)


class LocalChannel:
    """Library mode: the rank talks to an in-process sampler directly (single-process runs, tests)."""

    def __init__(self, sampler: Sampler) -> None:
        self.sampler = sampler

    def send_mark(self, mark: Mark) -> None:
        self.sampler.add_mark(mark)

    def send_phases(self, batch: PhaseBatch) -> None:
        self.sampler.add_phases(batch)

    def query_energy(self, names: Sequence[str], timeout_s: float) -> dict[str, dict[str, Any]]:
        return {k: v.to_dict() for k, v in self.sampler.window_energies(names).items()}

    def query_live(self, span_s: float, timeout_s: float) -> NodeLiveDict:
        return self.sampler.live(span_s).to_dict()

    def close(self) -> None:
        """Nothing to release: the sampler is stopped by its owner."""


def start_local_sampler(methods: str, out_dir: Path, interval_s: float, counter_interval_s: float = 1.0
                        ) -> tuple[Sampler, LocalChannel]:
    from jpwr.backends import parse_methods

    backends, discoveries = open_backends(parse_methods(methods), SYSTEM_CLOCK, option="--energy-methods")
    sampler = Sampler(backends, discoveries, out_dir, interval_s, counter_interval_s).start()
    return sampler, LocalChannel(sampler)


def default_socket_path(run_id: str) -> str:
    """A short socket path (Unix socket paths are limited to 107 bytes) with the node placeholder."""
    return os.path.join(tempfile.gettempdir(), f"jpwr-{run_id[:40]}-{{node}}.sock")
