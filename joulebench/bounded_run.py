"""A child process with a time limit, ended the way Slurm ends a job: SIGTERM to its process group, a grace period,
then SIGKILL to the group.

Why: `subprocess.run(timeout=...)` kills the child at once with SIGKILL, so a driver stopped at a harness's limit left
no run record at all (issue 59, session 11: llama-1b batch 1 at perf33's 150 s), although every driver ends its point
as TIMEOUT and writes its record within seconds of a SIGTERM (the next call's llama-8b run, stopped by `timeout`'s
SIGTERM, did). The group, not the process: a driver under jpwr or torchrun is several processes, and one left behind
holds the GPU during the next measurement.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
from collections.abc import Iterator, Sequence
from typing import Any

GRACE_S = 60.0  # a driver's stop after SIGTERM: the point's next call boundary, then its record (seconds, not minutes)
NESTED_GRACE_S = 2 * GRACE_S  # a harness run by a harness: its own child's grace must end inside this one


def stop_group(process: subprocess.Popen[Any], grace_s: float) -> str:
    """SIGTERM to the group of `process` (started with start_new_session=True), `grace_s`, then SIGKILL to the group
    (also where the leader had exited: what it started may hold the devices); returns how it ended."""
    try:
        if process.poll() is not None:
            return f"had exited with code {process.returncode}"
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(grace_s)
            return f"stopped by SIGTERM (exit code {process.returncode})"
        except subprocess.TimeoutExpired:
            return f"killed (SIGKILL) after {grace_s:g} s without exiting on SIGTERM"
    finally:  # what the leader left in its group; also where a second SIGTERM or a Ctrl-C ends the grace early
        _kill_group(process)


def _kill_group(process: subprocess.Popen[Any]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def run_bounded(argv: Sequence[str], timeout_s: float, grace_s: float = GRACE_S, **popen: Any) -> int | str:
    """Run `argv` (Popen's keyword arguments in `popen`) for at most `timeout_s`: its exit code, or, where the limit
    stopped it, "timeout after N s (how it ended)"; what it wrote before and after the SIGTERM stays.

    The child has its own group, so a SIGTERM meant for the caller (`timeout`, Slurm, scancel) would not reach it: while
    it runs, a SIGTERM to the caller (in its main thread) stops the child's group the same way, then ends the caller
    with SystemExit(143)."""
    # The handler first: a SIGTERM inside Popen (milliseconds) ends the caller before the child has a limit; one after
    # it stops the child.
    with _sigterm_as_exit(), subprocess.Popen(list(argv), start_new_session=True, **popen) as process:
        try:
            return process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return f"timeout after {timeout_s:.0f} s ({stop_group(process, grace_s)})"
        except BaseException:  # SIGTERM, Ctrl-C or an error here: the child's group must not outlive the caller
            stop_group(process, grace_s)
            raise


@contextlib.contextmanager
def _sigterm_as_exit() -> Iterator[None]:
    """SIGTERM raises SystemExit(143) inside the block (only the main thread may set a handler; elsewhere: as it
    was)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def exit_on_sigterm(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, exit_on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)  # None: set outside Python
