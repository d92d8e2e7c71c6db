"""joulebench.bounded_run: a child stopped at its time limit gets SIGTERM first (a driver writes its record then), its
whole group goes, and one that ignores SIGTERM is killed after the grace period. Real processes (bash), no fakes."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from joulebench.bounded_run import run_bounded

REPO = Path(__file__).resolve().parents[1]

# Installs its handler first thing: bash starts in milliseconds, far inside the limits below.
STOPS_ON_TERM = ("trap 'echo stopped > stopped.txt; exit 3' TERM; sleep 1000 & echo $! > grandchild.pid; "
                 "while :; do sleep 0.05; done")
IGNORES_TERM = "trap '' TERM; while :; do sleep 0.05; done"


def _gone(pid: int, within_s: float = 10.0) -> bool:
    """The process has exited (gone, or a zombie waiting for its reaper)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        stat = Path(f"/proc/{pid}/stat")
        try:
            if stat.read_text().rsplit(")", 1)[1].split()[0] == "Z":
                return True
        except (FileNotFoundError, ProcessLookupError):
            return True
        time.sleep(0.05)
    return False


def test_a_finished_child_gives_its_exit_code(tmp_path):
    assert run_bounded(["bash", "-c", "exit 7"], 60, cwd=tmp_path) == 7


def test_the_limit_sends_sigterm_to_the_whole_group_before_any_kill(tmp_path):
    code = run_bounded(["bash", "-c", STOPS_ON_TERM], 2.0, grace_s=30, cwd=tmp_path)
    assert code == "timeout after 2 s (stopped by SIGTERM (exit code 3))"
    assert (tmp_path / "stopped.txt").read_text() == "stopped\n"  # what a driver writes on SIGTERM stays
    assert _gone(int((tmp_path / "grandchild.pid").read_text()))  # the group, not only the leader


def test_a_child_that_ignores_sigterm_is_killed_after_the_grace(tmp_path):
    started = time.monotonic()
    code = run_bounded(["bash", "-c", IGNORES_TERM], 1.0, grace_s=0.5, cwd=tmp_path)
    assert code == "timeout after 1 s (killed (SIGKILL) after 0.5 s without exiting on SIGTERM)"
    assert time.monotonic() - started < 30


def test_a_sigterm_to_the_caller_stops_the_child_s_group_the_same_way(tmp_path):
    """`timeout`, Slurm or scancel signal the harness; its child has its own group and would run on, orphaned."""
    harness = ("import sys; from joulebench.bounded_run import run_bounded; "
               f"run_bounded(['bash', '-c', {STOPS_ON_TERM!r}], 600, grace_s=30, cwd={str(tmp_path)!r})")
    caller = subprocess.Popen([sys.executable, "-c", harness], cwd=REPO)
    pid_file = tmp_path / "grandchild.pid"
    deadline = time.monotonic() + 60
    while not (pid_file.is_file() and pid_file.read_text().strip()) and time.monotonic() < deadline:
        time.sleep(0.05)
    caller.send_signal(signal.SIGTERM)
    assert caller.wait(60) == 143
    assert (tmp_path / "stopped.txt").read_text() == "stopped\n"
    assert _gone(int(pid_file.read_text()))
