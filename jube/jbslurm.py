"""Slurm facts the JUBE workflows act on: will a job fit its partition, will a pending job ever start, how did it end.

Used on the login node by jbprofile.py (validate and submit) and in the finalizer job by jbrecord.py. Standard
library only (Python >= 3.10); Slurm is driven through its commands (`scontrol`, `sinfo`, `squeue`), which work
with and without accounting. Why: JUBE's `continue` only looks for a done file, so a job that Slurm will never
start, or that ends without running its own traps, must be recognised and recorded by us.
"""

from __future__ import annotations

import dataclasses
import re
import subprocess
import time

QUERY_TIMEOUT_S = 30  # a controller that does not answer in this time is treated as unreachable
# Pending reasons that no amount of waiting clears: limits of the job itself, not of the queue's current load.
NEVER_CLEARING = {
    "PartitionNodeLimit": "the partition allows fewer nodes than requested",
    "PartitionTimeLimit": "the time limit is above the partition's maximum",
    "PartitionConfig": "the request does not match the partition's configuration",
    "AccountNotAllowed": "the account may not use this partition",
    "QOSNotAllowed": "the QOS may not use this partition",
    "InvalidAccount": "the account is not valid",
    "InvalidQOS": "the QOS is not valid",
    "BadConstraints": "no node satisfies the constraints",
    "DependencyNeverSatisfied": "a dependency can never be satisfied",
}
# Slurm's final job states and the run record status each one means, when the job could not record it itself.
STATUS_OF_STATE = {
    "CANCELLED": "CANCELLED", "PREEMPTED": "CANCELLED", "DEADLINE": "CANCELLED", "TIMEOUT": "TIMEOUT",
    "FAILED": "FAILED", "NODE_FAIL": "FAILED", "BOOT_FAIL": "FAILED", "OUT_OF_MEMORY": "FAILED",
    "COMPLETED": "FAILED",  # the script ended without writing its record: something killed it before its traps
}
# Node states that keep a node out of service until someone acts (unknown, not responding (*), maintenance and
# power-saving states clear by themselves).
UNUSABLE_NODE_STATES = ("down", "drain", "fail", "inval", "future")


@dataclasses.dataclass
class Node:
    name: str
    state: str
    gpus: int
    cpus: int

    @property
    def usable(self) -> bool:
        return not self.state.lower().startswith(UNUSABLE_NODE_STATES)


@dataclasses.dataclass
class Partition:
    name: str
    total_nodes: int
    max_nodes: int | None  # None: unlimited
    max_time_s: int | None
    nodes: list[Node]


def query(argv: list[str]) -> str | None:
    """stdout of a Slurm command, or None when it fails or the controller does not answer."""
    proc = _run(argv)
    return proc.stdout if proc is not None and proc.returncode == 0 else None


def _run(argv: list[str]) -> subprocess.CompletedProcess[str] | None:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=QUERY_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return None


def duration_s(text: str) -> int | None:
    """Slurm's [D-]HH:MM:SS, MM:SS and MM forms as seconds; None for UNLIMITED, INVALID or anything else."""
    match = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", text.strip())
    if not match:
        return None
    days_text, a_text, b_text, c_text = match.groups()
    a = int(a_text)  # the one number every form has
    days, b, c = (int(g) if g else None for g in (days_text, b_text, c_text))
    if b is not None and c is not None:  # a third number comes only after a second
        seconds = a * 3600 + b * 60 + c
    elif b is not None:
        seconds = a * 3600 + b * 60 if days is not None else a * 60 + b
    else:
        seconds = a * 3600 if days is not None else a * 60
    return seconds + (days or 0) * 86400


def hms(seconds: int) -> str:
    """Seconds as Slurm's H:MM:SS."""
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def _fields(line: str) -> dict[str, str]:
    """`Key=Value Key=Value` as printed by `scontrol show ... -o` (values without spaces)."""
    return dict(item.split("=", 1) for item in line.split() if "=" in item)


def _gpus(gres: str) -> int:
    """GPUs in a node's GRES string: gpu:2, gpu:a100:4(S:0-1), gpu:4,nvme:1; 0 when none."""
    return sum(int(n) for n in re.findall(r"\bgpu(?::[^:,(]+)?:(\d+)", gres))


def partition(name: str) -> Partition | str:
    """The partition `name` (empty: the cluster's default) with its nodes, or why it cannot be read."""
    proc = _run(["scontrol", "show", "partition", "-o", *([name] if name else [])])
    if proc is None or proc.returncode != 0:
        if proc is not None and "not found" in proc.stderr:
            known = ", ".join(sorted(set((query(["sinfo", "-h", "-o", "%R"]) or "").split())))
            return f"partition {name!r} does not exist on this cluster (partitions: {known or 'unknown'})"
        return f"scontrol does not answer ({proc.stderr.strip() if proc else 'not runnable'})"
    shown = proc.stdout
    parts = [_fields(line) for line in shown.splitlines() if line.strip()]
    chosen = parts[0] if name else next((p for p in parts if p.get("Default") == "YES"), None)
    if chosen is None:
        return "the cluster has no default partition"
    listing = query(["sinfo", "-h", "-N", "-p", chosen["PartitionName"], "-o", "%N|%T|%G|%c"])
    if listing is None:
        return "sinfo does not answer"
    nodes = []
    for line in listing.splitlines():
        node, state, gres, cpus = [*line.split("|"), "", "", ""][:4]
        nodes.append(Node(node, state, _gpus(gres), int(cpus) if cpus.isdigit() else 0))
    max_nodes = chosen.get("MaxNodes", "UNLIMITED")
    return Partition(chosen["PartitionName"], int(chosen.get("TotalNodes", len(nodes))),
                     int(max_nodes) if max_nodes.isdigit() else None, duration_s(chosen.get("MaxTime", "")), nodes)


def fit_problem(part: Partition, nodes: int, tasks_per_node: int, gpus_per_node: int, cpus_per_task: int,
                time_limit_s: int) -> str | None:
    """Why Slurm would never start this job on `part` (checked before sbatch), or None when it can."""
    name = part.name
    if part.max_time_s is not None and time_limit_s > part.max_time_s:
        return f"time limit {time_limit_s} s is above partition {name}'s maximum of {part.max_time_s} s"
    limit = min(part.total_nodes, part.max_nodes or part.total_nodes)
    if nodes > limit:
        return f"partition {name} allows at most {limit} nodes per job, {nodes} requested"
    cpus = tasks_per_node * max(cpus_per_task, 1)
    fitting = [n for n in part.nodes if n.gpus >= gpus_per_node and n.cpus >= cpus]
    if len(fitting) < nodes:
        need = f"{gpus_per_node} GPUs and {cpus} CPUs" if gpus_per_node else f"{cpus} CPUs"
        return f"only {len(fitting)} node(s) of partition {name} have {need}, {nodes} requested"
    usable = [n for n in fitting if n.usable]
    if len(usable) < nodes:
        down = ", ".join(f"{n.name} ({n.state})" for n in fitting if not n.usable)
        return f"only {len(usable)} node(s) of partition {name} are up, {nodes} requested; down or drained: {down}"
    return None


def job_fit(settings: dict[str, str]) -> tuple[str | None, str | None]:
    """(why Slurm would never start the job of these JB_* settings, why that could not be checked)."""
    part = partition(settings["JB_PARTITION"])
    if isinstance(part, str):
        return (part, None) if part.startswith("partition ") else (None, part)  # a wrong name, or no answer
    per_node = int(settings["JB_TASKS_PER_NODE"])
    gpus = per_node if settings["JB_GRES"].lower() in ("yes", "true", "1") else 0
    problem = fit_problem(part, int(settings["JB_NODES"]), per_node, gpus, int(settings["JB_CPUS_PER_TASK"] or 1),
                          int(settings["JB_TIME_LIMIT_S"]))
    return problem, None


def job_state(job_id: str) -> tuple[str, str] | None:
    """(state, reason) while the controller knows the job (it forgets it MinJobAge after its end), else None."""
    shown = query(["scontrol", "show", "job", "-o", job_id])
    if not shown:
        return None
    fields = _fields(shown.splitlines()[0])
    return fields.get("JobState", "UNKNOWN"), fields.get("Reason", "None")


def pending_blocker(job_id: str, wait_s: float, fit_problem_now: str | None = None) -> str | None:
    """A pending reason that will never clear, looked for during `wait_s` after submission; None otherwise.

    `fit_problem_now`: the partition check's verdict now (ReqNodeNotAvail clears when nodes return, unless the
    partition lacks them for good)."""
    deadline = time.monotonic() + wait_s
    while True:
        state = job_state(job_id)
        if state is None or state[0] != "PENDING":
            return None
        reason = state[1]
        if reason in NEVER_CLEARING:
            return f"{reason}: {NEVER_CLEARING[reason]}"
        if "PerJob" in reason:  # Assoc/QOS per-job limits (nodes, CPUs, GRES, wall time); group limits do clear
            return f"{reason}: the request exceeds a per-job limit of the account or QOS"
        if reason.startswith("ReqNodeNotAvail") and fit_problem_now:
            return f"{reason}: {fit_problem_now}"
        if reason != "None" or time.monotonic() >= deadline:
            return None
        time.sleep(0.25)


def release(job_id: str) -> str | None:
    """`scontrol release` of a held job: None once it is no longer held (also where scontrol failed or did not
    answer but the release took effect), else why not, in scontrol's own words."""
    proc = _run(["scontrol", "release", job_id])
    if proc is not None and proc.returncode == 0:
        return None
    state = job_state(job_id)
    if state is not None and not _over(state[0]) and not (state[0] == "PENDING" and state[1].startswith("JobHeld")):
        return None
    said = (proc.stderr.strip() or f"exit {proc.returncode}") if proc else f"no answer within {QUERY_TIMEOUT_S} s"
    return f"scontrol release {job_id} failed ({said})"


def cancel(*job_ids: str) -> list[str]:
    """scancel the jobs; those still queued or running afterwards (someone has to cancel them by hand)."""
    ids = [j for j in job_ids if j]
    if not ids:
        return []
    cancelled = query(["scancel", *ids]) is not None
    return [j for j in ids if not _ended(job_id=j, cancelled=cancelled)]


def _ended(job_id: str, cancelled: bool) -> bool:
    """Whether the job is over (a final state or being torn down); one the controller forgot is over if scancel
    said so."""
    state = job_state(job_id)
    return cancelled if state is None else _over(state[0])


def _over(state: str) -> bool:
    """A final state, or one on the way there."""
    return state in STATUS_OF_STATE or state == "COMPLETING"
