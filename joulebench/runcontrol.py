"""Ending a run early and cleanly: one definition for every driver.

Slurm sends SIGTERM before its time limit (and on scancel); `--exit-duration-mins` asks a run to
stop itself before the limit. The handler only sets a flag; the training loop checks it at its
own log points and the ranks agree there, so no rank is left waiting in a collective that the
others skipped, and the steady window still covers whole iterations.
"""

from __future__ import annotations

import signal
import time


class StopRequest:
    """Why this rank wants to stop early, if it does."""

    def __init__(self, deadline: float | None) -> None:
        self.deadline = deadline  # a time.monotonic() value, or None
        self.signal_name: str | None = None

    @classmethod
    def after(cls, exit_duration_mins: float | None, started: float) -> StopRequest:
        """Stop `exit_duration_mins` after `started` (time.monotonic()), or only on a signal when None."""
        return cls(None if exit_duration_mins is None else started + 60.0 * exit_duration_mins)

    def on_signal(self, signum: int, _frame: object) -> None:
        self.signal_name = signal.Signals(signum).name

    def local_reason(self) -> str | None:
        if self.signal_name:
            return f"{self.signal_name} received (Slurm time limit or job cancelled)"
        if self.deadline is not None and time.monotonic() >= self.deadline:
            return "--exit-duration-mins reached"
        return None
