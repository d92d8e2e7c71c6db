"""One run's life, the same for every driver: stop requests, the meter, the idle baseline, exception → status,
energy on the windows, the run record, the exit code and the summary line.

    with Lifecycle("resnet50", launch, config.exit_duration_mins) as life:
        with life.run(run_id, out_dir, config_dict, metrics=lambda record: {...}, gather=backend.gather) as run:
            meter = run.open_meter(sync=backend.sync, methods=config.energy_methods)
            run.idle_baseline(config.idle_baseline, accelerator=True)
            ... the driver's windows (joulebench.loop) ...
            run.stopped_early(completed, planned)    # when the loop ended at a stop request
    return life.exit_code()

Stops: SIGTERM (Slurm's time limit, scancel), SIGUSR1 (Slurm's `--signal=USR1@T` warning) and SIGINT (Ctrl-C)
only set a flag; the loop checks it at a step boundary and the ranks agree there, so no handler raises inside a CUDA
call and the steady window covers whole steps; every wait of a run asks it too (joulebench.waits). A second Ctrl-C
stops at once (KeyboardInterrupt). `--exit-duration-mins` is the same request from the run's own clock, counted
from the driver's start like Megatron-LM.

Statuses and exit codes (joulebench.record.EXIT_CODES, the one table): OK/PARTIAL 0; TIMEOUT 124 (a clean stop
at a request: the record is complete and its steady window a valid measurement of the steps done); CANCELLED at
Ctrl-C, exit 130 as a shell reports it (128 + SIGINT; the steps done are kept as at TIMEOUT); FAILED 1, or
the joulebench error's own code (64 for a configuration refused on the device, 73 for an output directory that
cannot be written at the start). An exception is FAILED even while a stop was pending: a clean stop never raises.
What a stopped or failed run keeps: every window it closed, with its energy (a failure after the steady window,
in a phase replay, keeps the window's figures; the status stays FAILED with its reason). Only a failed run on
several nodes loses the energy: the other nodes' cannot be gathered once a rank has failed (a warning says so).
Global rank 0 writes the record on every outcome; the summary line `JOULEBENCH_RESULT ...` is the last thing it
prints. A record its output directory cannot take (a full or read-only disk) goes to $TMPDIR, else /dev/shm, else
to stderr only, the driver says which, and the process exits 74 (joulebench.record.RECORD_NOT_WRITTEN): the
summary line is printed all the same.
A run that ends with its windows also says whether it was disturbed (joulebench.disturbed: the record's
`disturbed` block and a warning; never a status).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import sys
import time
import traceback
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar

from joulebench.disturbed import WINDOW, RankPart, Watch, judge, summary, unjudged
from joulebench.exports.intervals import IntervalLog
from joulebench.exports.run import Exports
from joulebench.failures import failure_reason
from joulebench.launch import LaunchEnv
from joulebench.progress import Heartbeat, next_command
from joulebench.record import (
    EXIT_CODES,
    RECORD_FILE,
    RECORD_NOT_WRITTEN,
    RunRecord,
    read_run_record,
    settle_record,
    software_versions,
    summary_line,
    write_run_record,
)
from joulebench.record_shape import checked_block, checked_metrics
from joulebench.record_types import ClockAnchor, HardwareBlock, IdleBaselineBlock, Metrics
from jpwr import IdleBaseline, JpwrError, WindowEnergy, WindowMeter
from jpwr.energy import ACCELERATORS, split_energy
from jpwr.errors import stop_if_interrupted
from jpwr.output import json_text
from jpwr.phases import DeviceEventStamps

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)
SIGNAL_MEANING = {"SIGTERM": "Slurm time limit or job cancelled", "SIGUSR1": "Slurm's time-limit warning",
                  "SIGINT": "Ctrl-C"}
INTERRUPTED_EXIT = 128 + int(signal.SIGINT)  # 130: a CANCELLED run ended by Ctrl-C, as a shell reports the signal
Gather = Callable[[object], Sequence[object]]


def new_run_id(*parts: str) -> str:
    """A run id that sorts by time and does not collide: `<parts>-<UTC time>-<6 hex digits>`."""
    return "-".join((*parts, time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()), uuid.uuid4().hex[:6]))


def default_out_dir(benchmark: str, run_id: str) -> str:
    """Where a run writes without --out-dir, the same for every driver: runs/<benchmark>/<run id>."""
    return str(Path("runs") / benchmark / run_id)


def fallback_paths(run_id: str, out_dir: str | os.PathLike[str]) -> list[Path]:
    """Where a record goes when its output directory `out_dir` cannot take it, in order: $TMPDIR, else /dev/shm
    (memory: writable when every disk is full), under a name with the run id, the user id and a short hash of the
    resolved output directory: run ids repeat across JUBE outpaths, and users share /dev/shm (jube/jbrecord.py
    looks there too)."""
    where = hashlib.sha256(str(Path(out_dir).resolve()).encode()).hexdigest()[:10]
    name = f"run_record-{run_id.replace(os.sep, '_')}-{os.getuid()}-{where}.json"
    return [Path(directory) / name for directory in (os.environ.get("TMPDIR"), "/dev/shm") if directory]


def write_elsewhere(record: RunRecord, wanted: Path, exc: OSError) -> str:
    """The record that `wanted` could not take, written to the first fallback path that can take it, else to
    stderr only; says on stderr which, and returns where it went."""
    problem = f"[{record.benchmark}] error: cannot write the run record {wanted} ({exc.strerror or exc})"
    for fallback in fallback_paths(record.run_id, wanted.parent):
        try:
            path = write_run_record(fallback, record)
        except OSError:
            continue
        print(f"{problem}; wrote it to {path} instead: move it to {wanted} once that file system can take it",
              file=sys.stderr, flush=True)
        return str(path)
    tried = " or ".join(str(path.parent) for path in fallback_paths(record.run_id, wanted.parent))
    print(f"{problem}, nor to {tried}: the record follows on stderr only", file=sys.stderr, flush=True)
    sys.stderr.write(json_text(record.to_dict()))
    sys.stderr.flush()
    return "stderr"


def merged_metrics(benchmark: str, computed: Metrics, body: Metrics) -> Metrics:
    """The record's figures: the metrics callback's and those the run's body set on `record.metrics` (a loss
    curve), as the `benchmark` driver's type. A key both set is a driver bug that once let the body's value win
    unseen: refused, naming the keys."""
    both = sorted(set(computed) & set(body))
    if both:
        raise ValueError(f"metric(s) {', '.join(both)} set both by the run's body (record.metrics) and by its metrics "
                         "callback: set each figure in one place only")
    return checked_metrics(benchmark, {**computed, **body})


class StopRequest:
    """Why this rank wants to stop early, if it does: a signal arrived or the run's own deadline passed."""

    def __init__(self, deadline: float | None) -> None:
        self.deadline = deadline  # a time.monotonic() value, or None
        self.signal_name: str | None = None
        self.writing = False  # a record is being written: a second Ctrl-C must not cost it

    @classmethod
    def after(cls, exit_duration_mins: float | None, started: float) -> StopRequest:
        """Stop `exit_duration_mins` after `started` (time.monotonic()), or only on a signal when None."""
        return cls(None if exit_duration_mins is None else started + 60.0 * exit_duration_mins)

    def on_signal(self, signum: int, _frame: FrameType | None) -> None:
        """The handler: it only records the signal (the loop acts on it at its next step boundary); a second Ctrl-C
        stops at once."""
        name = signal.Signals(signum).name
        if name == "SIGINT":
            if self.signal_name == "SIGINT" and not self.writing:
                raise KeyboardInterrupt
            os.write(2, b"Ctrl-C: stopping at the next step boundary with the run record (Ctrl-C again: at once)\n")
        if self.signal_name != "SIGINT":  # Ctrl-C decides the status over a signal before it
            self.signal_name = name

    def stopped_status(self) -> str:
        """The status of a run that ended at this request: CANCELLED at Ctrl-C, else TIMEOUT."""
        return "CANCELLED" if self.signal_name == "SIGINT" else "TIMEOUT"

    def exit_code(self, status: str) -> int:
        """A status's exit code: EXIT_CODES', but 130 for a run cancelled by Ctrl-C."""
        return INTERRUPTED_EXIT if status == "CANCELLED" and self.signal_name == "SIGINT" else EXIT_CODES[status]

    def local_reason(self) -> str | None:
        if self.signal_name:
            return f"{self.signal_name} received ({SIGNAL_MEANING.get(self.signal_name, 'a signal to the job')})"
        if self.deadline is not None and time.monotonic() >= self.deadline:
            return "--exit-duration-mins reached"
        return None


class RunFailed(JpwrError):
    """A run that cannot go on, for a reason its message states with the fix (a server that never answers, a load
    too small to open its window): FAILED with that reason, and no traceback, which would say it was a bug."""

    exit_code = EXIT_CODES["FAILED"]


class StopRequested(Exception):
    """Raised by a driver's loop at a step boundary (never by a signal handler) after it closed its open window:
    the run ends there as TIMEOUT (CANCELLED at Ctrl-C), with the energy of the windows it completed."""


class Run:
    """One run record in the making: its meter, its idle baseline and how it ended."""

    def __init__(self, record: RunRecord, out_dir: Path, launch: LaunchEnv, stop: StopRequest) -> None:
        self.record = record
        self.out_dir = out_dir
        self.launch = launch
        self.stop = stop
        self.meter: WindowMeter | None = None
        self.exports: Exports | None = None  # --log-to, on global rank 0
        self.exit_code = 0
        self.watch = Watch(launch.is_node_leader)
        self._step_times: tuple[list[float] | None, str] = (None, "the driver gives no step times")
        self._processes_unjudged: str | None = None
        self.accelerator = False  # the run computes on GPUs (idle_baseline says so)

    def step_times(self, seconds: Sequence[float] | None, basis: str) -> None:
        """The driver's step times in the steady window (what `basis` says they are), or None with `basis` saying
        why there are none: the disturbance check's step-time spread."""
        self._step_times = (None if seconds is None else list(seconds), basis)

    def processes_unjudged(self, reason: str) -> None:
        """The GPUs' processes cannot be told this run's or another job's (`reason`): that check is n/a."""
        self._processes_unjudged = reason

    def judge_disturbance(self, gather: Gather | None) -> None:
        """Every rank's view of the steady window (collective), judged into the record's `disturbed` block; a
        disturbed run keeps its status and gets a warning naming why (joulebench.disturbed)."""
        try:
            self.watch.stop()
            window = next((w for w in self.meter.windows if w.name == WINDOW), None) if self.meter else None
            part = self.watch.part(None if window is None else (window.t_start_ns, window.t_end_ns))
        except Exception as exc:  # this rank's view fails: it still joins the gather, and every check is n/a
            traceback.print_exc()
            part = RankPart(unjudged=f"rank {self.launch.rank}'s view failed: {type(exc).__name__}: {exc}")
        try:
            parts = list(gather(part)) if gather is not None and self.launch.world_size > 1 else [part]
            views = [checked_block(RankPart, p, f"rank {k}'s view") for k, p in enumerate(parts) if isinstance(p, dict)]
            self.record.disturbed = judge(views, *self._step_times, self._processes_unjudged)
        except Exception as exc:  # a check that cannot be made must not cost the record
            traceback.print_exc()
            reason = f"whether the run was disturbed could not be judged: {type(exc).__name__}: {exc}"
            self.record.disturbed = unjudged(reason)
            self.record.warn(reason)
            return
        text = summary(self.record.disturbed)
        if text and text not in self.record.warnings:
            self.record.warnings.insert(0, text)  # first, as every table's note shows it

    def withhold_cpu_headline(self) -> None:
        """A GPU run whose meter read no accelerator (NVML failed) would get the CPU packages' energy (RAPL) as its
        headline: each such window's energy is withheld with why, and the RAPL figures stay beside it."""
        meter = self.meter
        if meter is None or not self.accelerator:
            return
        for window in meter.windows:
            energy = window.energy
            if energy is None or not energy.domain or energy.domain.startswith(ACCELERATORS):
                continue
            why = "; ".join(w for w in energy.warnings if w.startswith("headline from RAPL")) or energy.domain
            withheld = WindowEnergy.unavailable(f"the run computes on accelerators but none was metered ({why}); the "
                                                f"CPU's energy ({energy.domain}) is not the run's: see other_domains")
            withheld.other_domains, withheld.nodes = [*energy.per_device, *energy.other_domains], energy.nodes
            window.energy = withheld
            window.split = split_energy(withheld, window.duration_s, meter.idle)

    def open_meter(self, sync: Callable[[], None] | None = None, methods: str | None = None,
                   phase_stamps: DeviceEventStamps | None = None, read_every_s: float | None = None) -> WindowMeter:
        """The node's sampler (JPWR_ADDR), or an in-process one for `methods`, writing beside the record;
        `read_every_s`: the in-process sampler reads power and the energy counter this often (default 0.1 s and 1 s)."""
        rates = {} if read_every_s is None else {"interval_s": read_every_s, "counter_interval_s": read_every_s}
        self.meter = WindowMeter.open(self.launch, sync=sync, methods=methods, out_dir=self.out_dir / "jpwr",
                                      phase_stamps=phase_stamps, **rates)
        # The clock anchor: UTC of the windows' monotonic edges (jube/jbfootprint.py weights energy by the hour)
        anchor: ClockAnchor = {"wall_ns": time.time_ns(), "monotonic_ns": time.monotonic_ns()}
        self.record.meter.update({"sampler": self.meter.has_sampler, "energy_methods": methods, "clock": anchor,
                                  "in_process_out_dir": str(self.out_dir / "jpwr") if methods else None})
        return self.meter

    def intervals(self, work_unit: str, work_per_step: float, devices: int) -> IntervalLog | None:
        """Energy per log interval for the loop (joulebench.loop), where this rank logs to tools (--log-to)."""
        return IntervalLog(self._meter(), self.exports, work_unit, work_per_step, devices) if self.exports else None

    def idle_baseline(self, enabled: bool, accelerator: bool, gather: Gather | None = None,
                      reuse: IdleBaseline | None = None) -> IdleBaseline:
        """Measure the idle baseline before the first window (collective), or reuse one measured earlier in
        this process (a sweep's later points), so that every window's energy splits into idle and dynamic."""
        meter = self._meter()
        self.accelerator = accelerator
        if reuse is not None:
            meter.idle = reuse
            self.record.meter["idle_baseline"] = _idle_block(reuse, "before the first point of this invocation")
            return reuse
        idle = meter.take_idle_baseline(enabled, accelerator, gather, self.stop.local_reason)
        self.record.meter["idle_baseline"] = _idle_block(idle, "before this run's first window")
        return idle

    def stopped_early(self, completed: int, planned: int | None, warmup: int = 0, unit: str = "iterations") -> None:
        """The loop ended at a stop request: TIMEOUT (CANCELLED at Ctrl-C), with the request and how far it got.
        `completed` and `planned` count every step, the `warmup` ones included: a stop before the steady window
        says so and names the windows that exist (never a negative count of measured steps)."""
        reason = self.stop.local_reason() or "another rank requested the stop"
        self.record.status = self.stop.stopped_status()
        windows = [w.name for w in self.meter.windows] if self.meter else []
        if completed <= warmup or WINDOW not in windows:
            self.record.status_reason = (f"{reason}: stopped before the steady window, after {completed} of {warmup} "
                                         f"warm-up {unit}; windows kept: {', '.join(windows) or 'none'}")
            return
        measured = "the not yet planned" if planned is None else planned - warmup
        self.record.status_reason = (f"{reason}: stopped cleanly after {completed - warmup} of {measured} measured "
                                     f"{unit}; the steady window covers the steps completed")

    def failed(self, exc: BaseException) -> None:
        """Exception → status: FAILED with the error's code, also while a stop was pending (a clean stop never
        raises; an exception then is often a peer killed by the launcher, and the reason says the stop was asked).
        A deliberate error (JpwrError) prints its message; anything else its traceback."""
        if isinstance(exc, JpwrError):
            print(f"{self.record.benchmark}: error: {exc}", file=sys.stderr)
        else:
            traceback.print_exc()
        self.record.status = "FAILED"
        self.record.status_reason = str(exc) if isinstance(exc, JpwrError) else failure_reason(exc)
        pending = self.stop.local_reason()
        if pending:
            self.record.status_reason += f" (while stopping: {pending})"
        self.exit_code = int(getattr(exc, "exit_code", EXIT_CODES["FAILED"]))

    def interrupted(self) -> None:
        """A second Ctrl-C stopped the run at once (KeyboardInterrupt): CANCELLED, exit 130, the windows it closed
        kept; the window it was in is left out (its last step may not have finished)."""
        print(f"{self.record.benchmark}: stopped at once by a second Ctrl-C", file=sys.stderr)
        self.record.status = "CANCELLED"
        self.record.status_reason = ("SIGINT received twice (Ctrl-C): stopped at once; the windows closed before it "
                                     "are kept, the one it was in is not")
        self.exit_code = INTERRUPTED_EXIT

    def energy_after_failure(self) -> None:
        """The energy of the windows closed before a failure or an interrupt, so that a steady window measured
        before a later part failed keeps its figures. Not collective (a failed rank's peers may never join one):
        on one node the node leader's sampler covers every device of the run; on several, the other nodes' energy
        cannot be gathered and the windows stay without energy, with a warning saying why."""
        meter = self.meter
        if meter is None or not meter.windows:
            return
        if self.launch.num_nodes > 1:
            self.record.warn(f"the windows' energy is n/a: the run {self.record.status} on {self.launch.num_nodes} "
                             "nodes, and the other nodes' energy cannot be gathered after a failure")
            return
        try:
            meter.attach_energy(None)
            self.withhold_cpu_headline()
        except Exception as exc:  # a sampler that cannot answer now must not cost the record
            traceback.print_exc()
            self.record.warn(f"the energy of the windows closed before the run ended could not be read: "
                             f"{type(exc).__name__}: {exc}")

    def _meter(self) -> WindowMeter:
        if self.meter is None:
            raise RuntimeError("open_meter() first: the run has no meter")
        return self.meter


def _idle_block(idle: IdleBaseline, measured: str) -> IdleBaselineBlock:
    """The record's meter.idle_baseline: jpwr's idle baseline and when it was measured."""
    return checked_block(IdleBaselineBlock, {**idle.to_dict(), "measured": measured}, "meter.idle_baseline")


def _close_meter(meter: WindowMeter, record: RunRecord) -> None:
    """Stop the meter; an in-process sampler that cannot write its files (a full disk) costs the record a warning,
    never the record itself: the windows' energy is in memory already."""
    try:
        meter.close()
    except Exception as exc:
        traceback.print_exc()
        record.warn(f"the in-process sampler could not finish its files: {type(exc).__name__}: {exc}")


class Lifecycle:
    """A driver process: its stop request and signal handlers, its run records, its exit code."""

    def __init__(self, benchmark: str, launch: LaunchEnv, exit_duration_mins: float | None = None,
                 started: float | None = None, software_extra: Sequence[str] = ()) -> None:
        self.benchmark = benchmark
        self.launch = launch
        self.stop = StopRequest.after(exit_duration_mins, time.monotonic() if started is None else started)
        self.software = software_versions(extra=software_extra)
        self.runs: list[Run] = []
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> Lifecycle:
        stop_if_interrupted()  # a Ctrl-C during the imports that a library swallowed: no run begins
        for signum in STOP_SIGNALS:
            self._previous[signum] = signal.signal(signum, self.stop.on_signal)
        return self

    def __exit__(self, *_exc: object) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    @contextlib.contextmanager
    def run(self, run_id: str, out_dir: str | Path, config: Mapping[str, Any],
            metrics: Callable[[RunRecord], Metrics], gather: Gather | None = None,
            hardware: HardwareBlock | None = None, log_to: Sequence[str] = ()) -> Iterator[Run]:
        """One record: the body runs the windows; afterwards the run's energy is attached (collective, via
        `gather` across ranks), any exception becomes the status, `metrics(record)` fills the figures and global
        rank 0 writes the record, also after a failure, and logs its figures to the `log_to` tools (--log-to).
        Exceptions do not propagate: the exit code carries them."""
        record = RunRecord(benchmark=self.benchmark, run_id=run_id, config=dict(config), launch=self.launch.to_dict(),
                           hardware=hardware.copy() if hardware else HardwareBlock(), software=dict(self.software))
        run = Run(record, Path(out_dir), self.launch, self.stop)
        self.runs.append(run)
        run.watch.start()  # never raises: an unreadable check is n/a with its reason
        try:
            try:
                if log_to and self.launch.is_global_zero:
                    run.exports = Exports(log_to, run.out_dir, run_id, self.benchmark, self.stop.local_reason,
                                          say=self._say_tool_problem)
                yield run
            except StopRequested as stopped:
                record.status, record.status_reason = self.stop.stopped_status(), str(stopped)
            if run.meter is not None:
                run.meter.attach_energy(gather)
                run.withhold_cpu_headline()
                run.judge_disturbance(gather)
        except KeyboardInterrupt:  # a second Ctrl-C
            run.interrupted()
            run.energy_after_failure()
        except BaseException as exc:  # the record is written on any failure; the exit code says what happened
            run.failed(exc)
            run.energy_after_failure()
        finally:
            self.stop.writing = True
            try:
                run.watch.stop()
                if run.meter is not None:
                    record.windows = run.meter.windows
                    _close_meter(run.meter, record)
                self._write(run, metrics)
            finally:
                self.stop.writing = False
        if run.exit_code == 0:
            run.exit_code = self.stop.exit_code(record.status)

    def _say_tool_problem(self, problem: str) -> None:
        """A --log-to tool left out or dropped, on stderr when it happens: the user watching the run need not wait
        for the record's warnings to learn that MLflow or W&B gets nothing."""
        print(f"[{self.benchmark}] warning: --log-to: {problem}", file=sys.stderr, flush=True)

    def _write(self, run: Run, metrics: Callable[[RunRecord], Metrics]) -> None:
        record = run.record
        try:
            record.metrics = merged_metrics(record.benchmark, metrics(record), record.metrics)
        except Exception as exc:  # figures that cannot be computed must not cost the record
            traceback.print_exc()
            record.warn(f"metrics could not be computed: {type(exc).__name__}: {exc}")
        settle_record(record)  # the tools get the status and warnings the record is written with
        if run.exports is not None:  # a tool that fails costs neither the run nor the record: the warnings say so
            run.exports.finish(record.status, record.metrics, record.energy_domain)
            for problem in run.exports.close():  # each was said on stderr when it happened
                record.warn(f"--log-to: {problem}")
        if self.launch.is_global_zero:
            try:
                path = write_run_record(run.out_dir / RECORD_FILE, record)
            except OSError as exc:  # a full or read-only disk must not cost a finished run its figures
                write_elsewhere(record, run.out_dir / RECORD_FILE, exc)
                run.exit_code = RECORD_NOT_WRITTEN
            else:
                print(f"[{self.benchmark}] run record: {path}", flush=True)

    def exit_code(self, summary_keys: Sequence[str] = ()) -> int:
        """Print the command to run next (where every run ended OK) and every record's summary line (global rank 0),
        and return the process's exit code: 74 when any run's record is not where it belongs (a wrapper must look
        elsewhere for it, whatever else happened), else the first run that did not end OK decides (a TIMEOUT ends a
        sweep; a FAILED point leaves the others valid)."""
        if self.launch.is_global_zero:
            if self.runs and all(run.record.status == "OK" for run in self.runs):
                print(next_command([(run.out_dir, run.record.metrics.get("energy_wh")) for run in self.runs]))
            for run in self.runs:
                print(summary_line(run.record, summary_keys), flush=True)
        sys.stdout.flush()
        codes = [run.exit_code for run in self.runs]
        return RECORD_NOT_WRITTEN if RECORD_NOT_WRITTEN in codes else next((code for code in codes if code), 0)


def amend_written_record(record_dir: str | os.PathLike[str], amend: Callable[[RunRecord], bool]) -> bool:
    """A finished run's record gains what only later runs can tell (a sweep's joint per-request fit): read, changed
    by `amend` (False: nothing to add, nothing written), written back atomically. Besides a run's own end, the one
    place a record is written."""
    path = Path(record_dir) / RECORD_FILE
    record = read_run_record(path)
    if not amend(record):
        return False
    write_run_record(path, record)
    return True


PointT = TypeVar("PointT")
RunPoint = Callable[[PointT, IdleBaseline | None, Callable[[str], None]], tuple[RunRecord, IdleBaseline | None]]


def sweep(life: Lifecycle, points: Sequence[PointT], name: Callable[[PointT], str], run_point: RunPoint[PointT],
          progress: Callable[[RunRecord], str], log: Callable[[str], None], summary_keys: Sequence[str] = (),
          ends_sweep: Callable[[RunRecord], bool] | None = None) -> int:
    """Every point of a driver's sweep, one record each, the same loop for every sweep: a heartbeat line while a
    point runs, the idle baseline measured by the first point and handed to the next (`run_point(point, idle, say)`
    returns its record and the baseline), a progress line per point; a TIMEOUT or CANCELLED point ends the sweep
    (the job is being stopped), as does a point for which `ends_sweep(record)` is true (no further point can
    finish). Returns the process's exit code (Lifecycle.exit_code)."""
    with Heartbeat(log) as beat:
        idle: IdleBaseline | None = None
        for n, point in enumerate(points, start=1):
            beat.begin(f"{name(point)} (point {n} of {len(points)})")
            record, idle = run_point(point, idle, beat.say)
            beat.say(progress(record))
            if record.status in ("TIMEOUT", "CANCELLED") or (ends_sweep is not None and ends_sweep(record)):
                break
        return life.exit_code(summary_keys)
