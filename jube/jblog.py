"""The job log (`job.err`): which rank ended a run, in its own words, and the log's last line.

Why: srun's --kill-on-bad-exit ends the healthy ranks once one rank fails, so the step's exit code is often that of
a rank killed afterwards (143) and says nothing about the cause. srun --label (Slurm) and job.sh (local ranks) tag
every line a rank writes to stderr with its rank ("1: ..."), and both log each task that ends badly in the order
they end ("<node>: task <rank>: Exited with exit code <code>"), so the first such line names the rank that failed
first, and its tagged lines hold its own last error. Standard library only (Python >= 3.10).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from pathlib import Path

JOB_LOG = "job.err"
JOB_PREFIX = "joulebench-job:"  # job.sh's own lines (its log())
FINISHED = "finished: status "  # the job log's last line: "joulebench-job: [52 s] finished: status OK ..."
# srun's line for a task that ended badly, and job.sh's copy of it for local ranks:
#   srun: error: n2: task 1: Exited with exit code 64     srun: error: n1: tasks 0-1: Killed
#   joulebench-job: [12 s] host-n1: task 1: Exited with exit code 64
TASK_END = re.compile(r"^(?:srun|joulebench-job):.*?(?:(?P<node>[^\s:]+): )?tasks? (?P<rank>\d+)[-,\d]*: (?P<what>.+)$")
EXITED = re.compile(r"^Exited with exit code (\d+)$")
RANK_LINE = re.compile(r"^\s*(\d+): (.*)$")  # srun --label (padded to the widest rank) and job.sh's local copy
OWN_ERROR = ": error: "  # joulebench's "<prog>: error: <problem>. Fix: <fix>"
# SIGKILL is the kernel's out-of-memory killer's signal, and a killed rank cannot say so itself; worded as jpwr's
# signal_death words it (this module is standard library only, so not imported from there)
KILLED = "killed by signal 9 (out of memory?)"
ERRORISH = re.compile(r"error|exception|fatal|abort|killed|terminate", re.IGNORECASE)  # tracebacks, runtimes


@dataclasses.dataclass
class RankEnd:
    """A rank that ended badly, as srun or job.sh logged it, with the last error line it wrote itself."""

    rank: int
    node: str | None
    what: str  # srun's words: "Exited with exit code 64", "Killed", "Segmentation fault", ...
    line: str | None

    @property
    def killed(self) -> bool:
        """SIGKILL, as srun ("Killed") or job.sh ("Killed by SIGKILL") words it: the out-of-memory killer's signal."""
        return self.what in ("Killed", "Killed by SIGKILL")

    @property
    def code(self) -> int | None:
        """Its exit code; None when a signal ended it."""
        match = EXITED.match(self.what)
        return int(match.group(1)) if match else None

    def describe(self, with_line: bool = True) -> str:
        how = f"exited with code {self.code}" if self.code is not None else f"ended: {self.what}"
        if self.killed:
            how = f"was {KILLED}"
        where = f" on {self.node}" if self.node else ""
        said = f": {self.line}" if with_line and self.line else "" if self.line else " (nothing on its stderr)"
        return f"rank {self.rank}{where} {how}{said}"


class _LastError:
    """The last line of a stream that reads as an error: joulebench's own error line first, else a traceback's or
    runtime's error line, else simply the last line."""

    def __init__(self) -> None:
        self.own: str | None = None
        self.errorish: str | None = None
        self.last: str | None = None

    def add(self, text: str) -> None:
        text = text.strip()
        if not text or text.startswith("slurmstepd"):  # Slurm's own notices reach the ranks' stream too
            return
        self.last = text
        if OWN_ERROR in text:
            self.own = text
        elif ERRORISH.search(text):
            self.errorish = text

    @property
    def line(self) -> str | None:
        return self.own or self.errorish or self.last


def _lines(log: Path) -> Iterator[str]:
    if log.is_file():
        with log.open(errors="replace") as handle:
            yield from (line.rstrip("\n") for line in handle)


def first_rank_end(log: Path) -> RankEnd | None:
    """The first rank the log says ended badly, with its own last error line; None when the log names none."""
    first: re.Match[str] | None = None
    ranks: dict[int, _LastError] = {}
    for text in _lines(log):
        tagged = RANK_LINE.match(text)
        if tagged:
            ranks.setdefault(int(tagged.group(1)), _LastError()).add(tagged.group(2))
        elif first is None:
            first = TASK_END.match(text)
    if first is None:
        return None
    rank = int(first.group("rank"))
    return RankEnd(rank, first.group("node"), first.group("what").strip(), ranks.get(rank, _LastError()).line)


def last_error_line(log: Path) -> str | None:
    """The log's last error line outside job.sh's own lines (e.g. srun's own error when it could not start a step)."""
    picked = _LastError()
    for text in _lines(log):
        if not text.startswith(JOB_PREFIX):
            picked.add(text)
    return picked.line


def has_finished_line(log: Path) -> bool:
    return any(text.startswith(JOB_PREFIX) and FINISHED in text for text in _lines(log))


def write_finished_line(log: Path, status: str, reason: str | None, writer: str) -> None:
    """The job log's last line for a job whose script ended before it could write it (killed after Slurm's KillWait,
    never started); `writer` says who wrote it instead."""
    if has_finished_line(log):
        return
    with log.open("a") as handle:
        handle.write(f"{JOB_PREFIX} {FINISHED}{status}{f' ({reason})' if reason else ''}; written by {writer}\n")
