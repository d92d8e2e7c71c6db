"""Time sources. The sampler and backends take a clock so replay tests run without sleeping."""

from __future__ import annotations

import threading
import time
from typing import Protocol


class Clock(Protocol):
    """Monotonic time for sample stamps plus wall time for aligning hosts."""

    def monotonic_ns(self) -> int: ...

    def wall_ns(self) -> int: ...

    def sleep_until_ns(self, deadline_ns: int, stop: threading.Event | None = None) -> bool:
        """Sleep until `deadline_ns` (monotonic); return False early if `stop` is set."""
        ...


class SystemClock:
    """CLOCK_MONOTONIC for stamps (immune to NTP steps), CLOCK_REALTIME only for host alignment."""

    def monotonic_ns(self) -> int:
        return time.monotonic_ns()

    def wall_ns(self) -> int:
        return time.time_ns()

    def sleep_until_ns(self, deadline_ns: int, stop: threading.Event | None = None) -> bool:
        remaining = (deadline_ns - time.monotonic_ns()) / 1e9
        if remaining <= 0:
            return not (stop and stop.is_set())
        if stop is None:
            time.sleep(remaining)
            return True
        return not stop.wait(remaining)


class VirtualClock:
    """A clock that only moves when told to; `sleep_until_ns` jumps straight to the deadline.

    Used by replay tests and by the fake vendor modules, which answer reads from a recorded
    trace at the clock's current time.
    """

    def __init__(self, start_ns: int = 0, wall_offset_ns: int = 1_700_000_000 * 10**9) -> None:
        self._now = start_ns
        self._wall_offset = wall_offset_ns
        self._lock = threading.Lock()

    def monotonic_ns(self) -> int:
        with self._lock:
            return self._now

    def wall_ns(self) -> int:
        return self.monotonic_ns() + self._wall_offset

    def advance_ns(self, delta_ns: int) -> None:
        with self._lock:
            self._now += max(0, delta_ns)

    def set_ns(self, t_ns: int) -> None:
        with self._lock:
            self._now = max(self._now, t_ns)

    def sleep_until_ns(self, deadline_ns: int, stop: threading.Event | None = None) -> bool:
        if stop is not None and stop.is_set():
            return False
        self.set_ns(deadline_ns)
        return True


SYSTEM_CLOCK = SystemClock()
