"""Was the run disturbed, and by what? Four checks over the steady window, the same for every driver; the
thresholds are stated in docs/run-record.md ("What disturbed a run"). A disturbed run keeps its status (an OK
run stays OK): its figures are measured correctly, but of a machine that was not the run's alone, and every
table, report and comparison says so.

* step-time spread: coefficient of variation of the driver's step times in the steady window above 10 %;
* other processes on the metered GPUs (NVML's running processes), any not of this run's ranks on that host or their
  children;
* host load: the 1-minute load average (this run's own threads included) above the core count in more than
  half of the window's samples;
* clock events: thermal slowdown (SW or HW), HW slowdown or HW power brake on any GPU in more than 10 % of the
  window's samples. SW power cap is not counted: at full load it is how an H100 holds its power limit.

A node leader samples /proc/loadavg and the GPUs (jpwr.DeviceStateProbe) once a second in a thread; each rank
reduces its node's samples to the window on its own clock, the ranks are gathered once, and rank 0 judges.
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TypedDict

from joulebench.record_types import DisturbanceCheck, DisturbedBlock, OtherProcess
from jpwr.device_state import DeviceState, DeviceStateProbe, ProcessFacts, process_facts, reason_names
from jpwr.devices import host_id, node_name

STEP_CV_MAX = 0.10  # the step times' standard deviation over their mean
MIN_STEP_TIMES = 3  # fewer step times give no spread worth judging
LOAD_FRACTION_MAX = 0.5  # of the window's samples with the 1-minute load above the core count
CLOCK_FRACTION_MAX = 0.10  # of the window's samples with a counted clock event reason, on any GPU
COUNTED_CLOCK_REASONS = ("hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown")
SAMPLE_EVERY_S = 1.0
JOIN_MIN_S = 1.0  # the stop waits for the sampling thread two periods, but at least twice this
LOADAVG_ENV = "JOULEBENCH_LOADAVG"  # a file in /proc/loadavg's format instead of /proc/loadavg (tests plant load)
WINDOW = "steady"
GIB = 2**30


class Sample(TypedDict):
    """One sample of a node leader's thread: the host load (or why it could not be read) and the GPUs' state."""

    t_ns: int
    load: float | str
    devices: list[DeviceState]
    error: str | None
    facts: dict[int, ProcessFacts]  # the processes seen on the GPUs


class SeenProcess(TypedDict):
    """A process a node leader saw on the GPUs in the window: its facts, GPUs, peak memory and samples."""

    name: str | None  # None: its PID is not visible here (another PID namespace)
    ancestors: list[int]
    devices: list[str]
    used_memory_bytes: int | None
    samples: int


class RankPart(TypedDict, total=False):
    """What one rank brings to the judgement (Watch.part; plain JSON, since a gather may travel as JSON): its
    identity, and on a node leader what it sampled in the window; or why its view failed (`unjudged`)."""

    node: str
    host: str
    pid: int
    leader: bool
    samples: int
    cores: int | None
    loads: list[float]  # the 1-minute load of each sample that read it
    load_unavailable: str | None
    clocks: dict[str, dict[str, int]]  # per GPU: samples with a reason mask, and how many held each reason
    processes: dict[str, SeenProcess]  # by PID
    process_reads: int
    device_errors: list[str]
    probe_unavailable: str | None
    unjudged: str


class Watch:
    """This rank's side: its PID, and on a node leader a thread sampling the host load and the GPUs' state."""

    def __init__(self, leader: bool, every_s: float = SAMPLE_EVERY_S) -> None:
        self.leader = leader
        self.every_s = every_s
        self.loadavg = Path(os.environ.get(LOADAVG_ENV) or "/proc/loadavg")
        self.samples: list[Sample] = []
        self.probe: DeviceStateProbe | None = None
        self.probe_reason: str | None = None  # why the GPUs cannot be read (no NVML, no GPU selected)
        self.hung_reason: str | None = None  # set when the thread did not end at the stop
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> Watch:
        """On a node leader, start the sampling thread; it opens the GPUs' probe itself, so that a stuck NVML call
        never holds up the run."""
        if self.leader:
            self._thread = threading.Thread(target=self._loop, name="joulebench-disturbed", daemon=True)
            self._thread.start()
        return self

    def _loop(self) -> None:
        """Open the probe, sample until stopped and once more at the stop (a window shorter than a period still
        has a sample), then close the probe: only this thread calls NVML, so NVML is never closed under it."""
        try:
            self.probe = DeviceStateProbe.open()
            self.probe_reason = self.probe.unavailable_reason
        except Exception as exc:  # e.g. a device selection jpwr refuses: the meter reports it, the run goes on
            self.probe_reason = f"the GPUs' state could not be read: {type(exc).__name__}: {exc}"
        try:
            while True:
                self.samples.append(self._sample())
                if self._stop.wait(self.every_s):
                    self.samples.append(self._sample())
                    return
        finally:
            if self.probe is not None:
                self.probe.close()

    def _sample(self) -> Sample:
        try:
            load: float | str = float(self.loadavg.read_text().split()[0])
        except (OSError, ValueError, IndexError) as exc:
            load = f"{self.loadavg} unreadable: {exc}"
        devices: list[DeviceState] = []
        error = None
        try:
            devices = self.probe.sample() if self.probe else []
        except Exception as exc:  # a vendor call failing in an unforeseen way costs this sample its GPU state only
            error = f"the GPUs' state could not be read: {type(exc).__name__}: {exc}"
        pids = {pid for state in devices for pid in state.processes or {}}
        return {"t_ns": time.monotonic_ns(), "load": load, "devices": devices, "error": error,
                "facts": {pid: process_facts(pid) for pid in pids}}

    def stop(self) -> None:
        """End the thread, waiting at most two sampling periods (at least JOIN_MIN_S): a thread still inside an
        NVML call then is left to finish on its own, and the GPU checks are n/a."""
        if self._thread is None:
            return
        self._stop.set()
        timeout = 2 * max(self.every_s, JOIN_MIN_S)
        self._thread.join(timeout)
        if self._thread.is_alive():
            self.hung_reason = f"the GPUs' state call did not return within {timeout:g} s"
        self._thread = None

    def part(self, window: tuple[int, int] | None) -> RankPart:
        """What this rank brings to the judgement, reduced to the window (t_start_ns, t_end_ns on this node's
        clock)."""
        part: RankPart = {"node": node_name(), "host": host_id(), "pid": os.getpid(), "leader": self.leader}
        if not self.leader or window is None:
            return part
        samples = list(self.samples)  # a thread left inside a call may still append
        inside = [s for s in samples if window[0] <= s["t_ns"] <= window[1]]
        if not inside and samples:  # a window shorter than the sampling period: the first sample after it
            inside = [min(samples, key=lambda s: (s["t_ns"] < window[0], abs(s["t_ns"] - window[1])))]
        part.update({"samples": len(inside), "cores": os.cpu_count(), **_loads(inside),
                     **_devices([] if self.hung_reason else inside),  # a stuck call: no GPU check is judged
                     "probe_unavailable": self.hung_reason or self.probe_reason})
        return part


def _loads(samples: Sequence[Sample]) -> RankPart:
    loads = [s["load"] for s in samples if isinstance(s["load"], float)]
    errors = [s["load"] for s in samples if isinstance(s["load"], str)]
    return {"loads": loads, "load_unavailable": errors[0] if errors and not loads else None}


def _devices(samples: Sequence[Sample]) -> RankPart:
    """Per GPU: samples with a reason mask and how many held each reason; per PID seen: facts and memory."""
    clocks: dict[str, dict[str, int]] = {}
    processes: dict[str, SeenProcess] = {}
    errors: list[str] = []
    process_reads = 0
    for sample in samples:
        if sample["error"] and sample["error"] not in errors:
            errors.append(sample["error"])
        for state in sample["devices"]:
            error = f"{state.domain_id}: {state.unavailable}"
            if state.unavailable and error not in errors:
                errors.append(error)
            if state.reasons is not None:
                counts = clocks.setdefault(state.domain_id, {"samples": 0})
                counts["samples"] += 1
                for name in reason_names(state.reasons):
                    counts[name] = counts.get(name, 0) + 1
            process_reads += state.processes is not None
            for pid, used in (state.processes or {}).items():
                facts: ProcessFacts = sample["facts"][pid]
                seen = processes.setdefault(str(pid), {"name": facts.comm, "ancestors": list(facts.ancestors),
                                                       "devices": [], "used_memory_bytes": None, "samples": 0})
                seen["samples"] += 1
                seen["name"] = seen["name"] or facts.comm
                if state.domain_id not in seen["devices"]:
                    seen["devices"].append(state.domain_id)
                if used is not None:
                    seen["used_memory_bytes"] = max(used, seen["used_memory_bytes"] or 0)
    return {"clocks": clocks, "processes": processes, "process_reads": process_reads, "device_errors": errors}


def judge(parts: Sequence[RankPart], step_times: Sequence[float] | None, basis: str,
          processes_unjudged: str | None = None) -> DisturbedBlock:
    """The record's `disturbed` block from every rank's part and rank 0's step times in the window;
    `processes_unjudged`: why the GPUs' processes cannot be told apart (the check is n/a, e.g. an external server)."""
    failed = [str(p["unjudged"]) for p in parts if p.get("unjudged")]
    if failed:
        return unjudged("; ".join(failed))
    leaders = [p for p in parts if p.get("leader") and "samples" in p]
    checks: dict[str, DisturbanceCheck] = {"step_time_cv": _step_check(step_times, basis)}
    if not leaders:
        missing: DisturbanceCheck = {"disturbed": None, "unavailable_reason": f"no {WINDOW} window was sampled"}
        checks.update(other_processes=missing, host_load=missing, clock_events=missing)
    else:
        own: dict[str, set[int]] = {}  # by host: node identities of one host see each other's ranks on its GPUs
        for p in parts:
            own.setdefault(p["host"], set()).add(int(p["pid"]))
        processes: DisturbanceCheck = ({"disturbed": None, "unavailable_reason": processes_unjudged}
                                       if processes_unjudged else _process_check(leaders, own))
        checks.update(other_processes=processes, host_load=_load_check(leaders), clock_events=_clock_check(leaders))
    reasons = [c["reason"] for c in checks.values() if c.get("disturbed")]
    return {"disturbed": bool(reasons), "reasons": reasons, "window": WINDOW, "checks": checks}


def unjudged(reason: str) -> DisturbedBlock:
    """The block of a run whose disturbance could not be judged (a rank's part or the judgement failed): every
    check n/a with `reason`, never a failed run."""
    missing: DisturbanceCheck = {"disturbed": None, "unavailable_reason": reason}
    return {"disturbed": None, "reasons": [], "window": WINDOW,
            "checks": dict.fromkeys(("step_time_cv", "other_processes", "host_load", "clock_events"), missing)}


def _step_check(times: Sequence[float] | None, basis: str) -> DisturbanceCheck:
    if times is None:
        return {"disturbed": None, "unavailable_reason": basis}
    if len(times) < MIN_STEP_TIMES or statistics.fmean(times) <= 0:
        return {"disturbed": None, "samples": len(times), "basis": basis,
                "unavailable_reason": f"{len(times)} step times in the window, fewer than {MIN_STEP_TIMES}"}
    cv = statistics.pstdev(times) / statistics.fmean(times)
    check: DisturbanceCheck = {"value": cv, "threshold": STEP_CV_MAX, "samples": len(times), "basis": basis,
                               "disturbed": cv > STEP_CV_MAX}
    if check["disturbed"]:
        check["reason"] = (f"step-time spread: CV {cv:.0%} over {len(times)} {basis} (threshold "
                           f"{STEP_CV_MAX:.0%})")
    return check


def _process_check(leaders: Sequence[RankPart], own: Mapping[str, set[int]]) -> DisturbanceCheck:
    unavailable = [_unread(p) for p in leaders if not p["process_reads"]]
    if len(unavailable) == len(leaders):
        return {"disturbed": None, "unavailable_reason": "; ".join(unavailable)}
    others: list[OtherProcess] = []
    notes: list[str] = []
    for part in leaders:
        mine = own.get(part["host"], set())
        ours_seen, hidden = False, []
        for pid, seen in part["processes"].items():
            shown = OtherProcess(pid=int(pid), node=part["node"], name=seen["name"],
                                 used_memory_bytes=seen["used_memory_bytes"], devices=seen["devices"],
                                 samples=seen["samples"])
            if int(pid) in mine or mine.intersection(seen["ancestors"]):
                ours_seen = True
            elif seen["name"] is None:
                hidden.append(shown)
            else:
                others.append(shown)
        if hidden and not ours_seen:  # NVML's PIDs are another namespace's: only their number tells
            crowded = len(hidden) > len(mine)
            notes.append(f"{part['node']}: {len(hidden)} PIDs on the GPUs are not visible here (a container's PID "
                         f"namespace?) for this run's {len(mine)} processes" +
                         ("" if crowded else ": they cannot be told apart from this run's"))
            others += hidden if crowded else []
        else:
            others += hidden
    check: DisturbanceCheck = {"value": others, "threshold": "any process of another job", "disturbed": bool(others),
                             "samples": sum(p["samples"] for p in leaders)}
    if notes:
        check["note"] = "; ".join(notes)
    if others:
        check["reason"] = "other processes on the metered GPUs: " + ", ".join(map(_process_text, others))
    if unavailable:
        check["partly_unavailable"] = unavailable
    return check


def _unread(part: RankPart) -> str:
    """Why a node's GPUs told nothing: no probe (no NVML, no GPU selected), or the calls that failed."""
    return f"{part['node']}: {part.get('probe_unavailable') or '; '.join(part['device_errors']) or 'no GPU read'}"


def _process_text(process: OtherProcess) -> str:
    used = process["used_memory_bytes"]
    memory = "memory n/a" if used is None else f"{used / GIB:.1f} GiB"
    name = process["name"] or "not visible here"
    return f"pid {process['pid']} ({name}, {memory}) on {', '.join(process['devices'])} of {process['node']}"


def _load_check(leaders: Sequence[RankPart]) -> DisturbanceCheck:
    loads = [(load, p["cores"], p["node"]) for p in leaders for load in p["loads"]]
    if not loads:
        reasons = [str(p.get("load_unavailable") or f"{p['node']}: no sample") for p in leaders]
        return {"disturbed": None, "unavailable_reason": "; ".join(reasons)}
    above = [load for load, cores, _ in loads if cores and load > cores]
    fraction = len(above) / len(loads)
    peak = max(loads)
    check: DisturbanceCheck = {"value": fraction, "threshold": LOAD_FRACTION_MAX, "samples": len(loads),
                               "max_load_1min": peak[0], "cores": peak[1], "disturbed": fraction > LOAD_FRACTION_MAX}
    if check["disturbed"]:
        check["reason"] = (f"host load: 1-minute load (including this run's threads) above the {peak[1]} cores of "
                           f"{peak[2]} in {fraction:.0%} of {len(loads)} samples (max {peak[0]:.1f}; threshold: "
                           f"more than {LOAD_FRACTION_MAX:.0%})")
    return check


def _clock_check(leaders: Sequence[RankPart]) -> DisturbanceCheck:
    clocks = {device: counts for p in leaders for device, counts in p["clocks"].items()}
    if not clocks:
        return {"disturbed": None, "unavailable_reason": "; ".join(map(_unread, leaders))}
    fractions = {device: {name: n / counts["samples"] for name, n in counts.items() if name != "samples"}
                 for device, counts in clocks.items() if counts["samples"]}
    worst = [(f, name, device) for device, names in fractions.items() for name, f in names.items()
             if name in COUNTED_CLOCK_REASONS]
    top = max(worst, default=(0.0, None, None))
    check: DisturbanceCheck = {"value": fractions, "threshold": CLOCK_FRACTION_MAX,
                               "counted": list(COUNTED_CLOCK_REASONS),
                               "samples": sum(c["samples"] for c in clocks.values()),
                               "disturbed": top[0] > CLOCK_FRACTION_MAX}
    if check["disturbed"]:
        held = sorted({f"{name} on {device} ({f:.0%})" for f, name, device in worst if f > CLOCK_FRACTION_MAX})
        check["reason"] = (f"clocks held down in more than {CLOCK_FRACTION_MAX:.0%} of the window's samples: "
                           + ", ".join(held))
    return check


def summary(block: object) -> str | None:
    """One phrase for tables and notes: 'disturbed: <reasons>', or None for an undisturbed or unjudged run. Any
    block is read (jube/jbrecord.py passes what a record holds): a verdict other than true is no disturbance, and
    reasons that are not a list of texts are 'reason not recorded'."""
    if not isinstance(block, Mapping) or block.get("disturbed") is not True:
        return None
    reasons = block.get("reasons")
    texts = [r for r in reasons if isinstance(r, str)] if isinstance(reasons, list) else []
    return "disturbed: " + "; ".join(texts or ["reason not recorded"])
