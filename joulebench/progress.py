"""A line at least every 10 s from a long command, also while one call (a model build, a long generate) runs, and
the command to run after a driver's runs.

Why: a command that is silent for 30 s looks hung, and a job log without a recent line cannot tell a slow point from
a stuck one. The command's own lines go through `say` (they restart the clock); where none came for `every_s`, a
background thread says what the command is doing and for how long. A newcomer who has just trained reads next what
to do with the result (README's quick start: plot, report, attribute).
"""

from __future__ import annotations

import os
import shlex
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType

EVERY_S = 10.0


def next_command(runs: Sequence[tuple[Path, float | None]]) -> str:
    """The line after a driver's runs, each (its output directory, its steady window's energy in Wh or None): one
    run with energy is plotted first; without energy only the report can show it (plot and attribute stop)."""
    dirs = [Path(out) for out, _ in runs]
    parent = Path(os.path.commonpath([str(d.parent) for d in dirs])) if dirs else Path("runs")
    report = f"joulebench report {shlex.quote(str(parent))} -o report/"
    if len(runs) > 1:
        return f"next: {report} ({len(runs)} runs: tables, charts, diagnosis)"
    run = shlex.quote(str(dirs[0]))
    if runs[0][1] is None:
        return (f"next: {report} (throughput; energy n/a: with no sensor plot and attribute stop, `joulebench doctor` "
                "names the sensors found)")
    return f"next: joulebench plot {run} -o {run}/trace.png, then {report} and joulebench attribute {run}"


class Heartbeat:
    """`with Heartbeat(log) as beat:` ... `beat.begin("chat bs=16 (point 2 of 4)")` ... `beat.say(result_line)`."""

    def __init__(self, log: Callable[[str], None], every_s: float = EVERY_S) -> None:
        self.log, self.every_s = log, every_s
        self.doing = "starting"
        self._since = self._last = time.monotonic()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="heartbeat", daemon=True)

    def say(self, text: str) -> None:
        """One of the command's own lines; the next heartbeat comes `every_s` after it."""
        with self._lock:
            self.log(text)
            self._last = time.monotonic()

    def begin(self, doing: str) -> None:
        """A new stage (shown in the heartbeat lines with the time since it began)."""
        self.doing, self._since = doing, time.monotonic()

    def _run(self) -> None:
        while not self._stop.wait(max(0.0, self._last + self.every_s - time.monotonic())):
            with self._lock:
                now = time.monotonic()
                if now - self._last >= self.every_s:
                    self.log(f"{self.doing}: {now - self._since:.0f} s so far")
                    self._last = now

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._stop.set()
        self._thread.join()
