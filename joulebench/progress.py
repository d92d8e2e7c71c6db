"""A line at least every 10 s from a long command, also while one call (a model build, a long generate) runs.

Why: a command that is silent for 30 s looks hung, and a job log without a recent line cannot tell a slow point from
a stuck one. The command's own lines go through `say` (they restart the clock); where none came for `every_s`, a
background thread says what the command is doing and for how long.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from types import TracebackType

EVERY_S = 10.0


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
