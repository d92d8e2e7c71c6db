"""joulebench.bounded_run: a child stopped at its time limit gets SIGTERM first (a driver writes its record then), its
whole group goes, and one that ignores SIGTERM is killed after the grace period. Real processes, no fakes.

No race with the machine's pace: each child starts with SIGTERM blocked or ignored (set before exec), so a limit that
passes before the child is ready leaves the signal pending until its handler is in place."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from joulebench.bounded_run import run_bounded

REPO = Path(__file__).resolve().parents[1]
# A driver's shape: a handler that writes what was measured and exits 3, a grandchild in its group, then SIGTERM
# unblocked (a TERM that came early is handled now).
STOPS_ON_TERM = """
import pathlib, signal, subprocess, sys, time
def stop(signum, frame):
    pathlib.Path("stopped.txt").write_text("stopped\\n")
    sys.exit(3)
signal.signal(signal.SIGTERM, stop)
grandchild = subprocess.Popen(["sleep", "1000"])
pathlib.Path("grandchild.pid").write_text(str(grandchild.pid))
signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
while True:
    time.sleep(0.05)
"""
IGNORES_TERM = "while :; do sleep 0.05; done"
# Keeps running on SIGTERM (saying so): only the SIGKILL after the grace ends it.
OUTLIVES_TERM = """
import os, pathlib, signal, time
signal.signal(signal.SIGTERM, lambda signum, frame: pathlib.Path("got-term").write_text("1"))
pathlib.Path("ready").write_text(str(os.getpid()))
signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
while True:
    time.sleep(0.05)
"""


def _block_sigterm() -> None:
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})


def _ignore_sigterm() -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def _gone(pid: int, within_s: float = 10.0) -> bool:
    """The process has exited (gone, or a zombie waiting for its reaper)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                return True
        except (FileNotFoundError, ProcessLookupError):
            return True
        time.sleep(0.05)
    return False


def _wait_for(path: Path, within_s: float = 120) -> str:
    deadline = time.monotonic() + within_s
    while not (path.is_file() and path.read_text().strip()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return path.read_text()


@contextlib.contextmanager
def _harness(child_source: str, grace_s: float, cwd: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A harness process bounding `child_source` (a Python child started with SIGTERM blocked) at 600 s with
    `grace_s`; killed at the end, whatever the test's outcome."""
    source = ("import signal, sys; from joulebench.bounded_run import run_bounded; "
              f"run_bounded([sys.executable, '-c', {child_source!r}], 600, grace_s={grace_s!r}, cwd={str(cwd)!r}, "
              "preexec_fn=lambda: signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM}))")
    caller = subprocess.Popen([sys.executable, "-c", source], cwd=REPO)
    try:
        yield caller
    finally:
        caller.kill()
        caller.wait()


def test_a_finished_child_gives_its_exit_code(tmp_path):
    assert run_bounded(["bash", "-c", "exit 7"], 60, cwd=tmp_path) == 7


def test_the_limit_sends_sigterm_to_the_whole_group_before_any_kill(tmp_path):
    code = run_bounded([sys.executable, "-c", STOPS_ON_TERM], 1.0, grace_s=60, cwd=tmp_path,
                       preexec_fn=_block_sigterm)
    assert code == "timeout after 1 s (stopped by SIGTERM (exit code 3))"
    assert (tmp_path / "stopped.txt").read_text() == "stopped\n"  # what a driver writes on SIGTERM stays
    assert _gone(int((tmp_path / "grandchild.pid").read_text()))  # the group, not only the leader


def test_a_child_that_ignores_sigterm_is_killed_after_the_grace(tmp_path):
    started = time.monotonic()
    code = run_bounded(["bash", "-c", IGNORES_TERM], 1.0, grace_s=0.5, cwd=tmp_path, preexec_fn=_ignore_sigterm)
    assert code == "timeout after 1 s (killed (SIGKILL) after 0.5 s without exiting on SIGTERM)"
    assert time.monotonic() - started < 30


def test_a_sigterm_to_the_caller_stops_the_child_s_group_the_same_way(tmp_path):
    """`timeout`, Slurm or scancel signal the harness; its child has its own group and would run on, orphaned."""
    with _harness(STOPS_ON_TERM, 60, tmp_path) as caller:
        grandchild = int(_wait_for(tmp_path / "grandchild.pid"))
        caller.send_signal(signal.SIGTERM)
        assert caller.wait(120) == 143
        assert (tmp_path / "stopped.txt").read_text() == "stopped\n"
        assert _gone(grandchild)


def test_a_second_sigterm_during_the_grace_kills_the_group_at_once(tmp_path):
    """Slurm or a nested harness may signal again: the caller must not wait out the grace, nor leave the child."""
    with _harness(OUTLIVES_TERM, 600, tmp_path) as caller:
        child = int(_wait_for(tmp_path / "ready"))
        caller.send_signal(signal.SIGTERM)
        _wait_for(tmp_path / "got-term")  # the grace has begun
        caller.send_signal(signal.SIGTERM)
        assert caller.wait(60) == 143
        assert _gone(child)
