"""The held-then-released submission's failure branches and the finalizer's fallback (jube/jbsubmit.py).

The Slurm commands here are fakes on PATH (FAKE_SLURM below): a release that fails,
a scancel the controller does not confirm, sbatch printing a site plugin's line before the id and an interruption
between the two sbatch calls cannot be produced on demand by the real Slurm of the CI cluster. The paths that real
Slurm produces (a finalizer sbatch refuses) are tested against it in test_profile_commands.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.jube.test_profile import CLEAN_ENV, jbprofile

jbsettings = sys.modules["jbsettings"]
jbsubmit = sys.modules["jbsubmit"]

FAKE_SLURM = {  # each appends its arguments to $FAKE_LOG; the FAKE_* variables choose the branch
    "sbatch": """echo "sbatch $*" >> "$FAKE_LOG"
for a in "$@"; do [ "$a" = --hold ] && { printf 'sbatch: note: site plugin says hello\\n101;cluster\\n'; exit 0; }; done
[ "$FAKE_FINALIZER" = interrupt ] && { kill -INT "$PPID"; sleep 5; }
echo 102""",
    "scontrol": """echo "scontrol $*" >> "$FAKE_LOG"
[ "$1" = release ] && { echo "scontrol: error: Socket timed out on send/recv operation" >&2; exit 1; }
[ "$FAKE_STATE" ] && { echo "JobId=$4 JobState=$FAKE_STATE Reason=$FAKE_REASON"; exit 0; }
exit 1""",
    "scancel": """echo "scancel $*" >> "$FAKE_LOG"
[ "$FAKE_SCANCEL" = ok ] && exit 0
echo "scancel: error: Socket timed out on send/recv operation" >&2; exit 1""",
}


@pytest.fixture
def fake_slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The fake commands first on PATH; returns the log of their calls."""
    bin_dir = tmp_path / "fakebin"
    bin_dir.mkdir()
    for name, body in FAKE_SLURM.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    log = tmp_path / "calls.log"
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_LOG", str(log))
    return log


def _settings(tmp_path: Path, setup: str = "") -> tuple[dict[str, str], Path]:
    """A Slurm point's job.env as prepare and submit write it (the CI system), in tmp_path/work."""
    work = tmp_path / "work"
    work.mkdir()
    env = {**CLEAN_ENV, "PATH": os.environ["PATH"], "JOULEBENCH_SETUP": setup}
    settings = jbprofile.build_settings("llm", ["CI"], {}, "r", env)
    settings.update(JB_WORKDIR=str(work), JB_OUT_DIR=str(work / "run"), JB_DONE_FILE=str(work / "job.done"))
    jbsettings.write_settings(work / "job.env", settings)
    return settings, work / "job.env"


@pytest.mark.parametrize(("state", "scancel", "said"), [
    ("", "fails", "could not cancel job 102: run `scancel 102`; could not cancel job 101: run `scancel 101`"),
    ("CANCELLED", "ok", "job 101 was cancelled before it started"),
])
def test_a_failed_release_cancels_both_and_says_whether_the_cancel_took(
    fake_slurm: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, state: str, scancel: str, said: str
) -> None:
    """The job id is the last line of sbatch's answer and is in job.id at once; scontrol's words are in the reason;
    a cancel nobody confirms names the jobs to cancel by hand."""
    monkeypatch.setenv("FAKE_STATE", state)
    monkeypatch.setenv("FAKE_REASON", "None")
    monkeypatch.setenv("FAKE_SCANCEL", scancel)
    settings, path = _settings(tmp_path)
    with pytest.raises(jbsubmit.SubmitFailed) as err:
        jbsubmit.submit_with_finalizer(settings, path, dict(os.environ))
    assert "scontrol release 101 failed (scontrol: error: Socket timed out" in str(err.value), err.value
    assert said in str(err.value), err.value
    assert (path.parent / "job.id").read_text() == "101\n"
    assert "scancel 102 101" in fake_slurm.read_text()


def test_a_release_that_took_effect_despite_scontrols_error_goes_on(
    fake_slurm: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_STATE", "PENDING")
    monkeypatch.setenv("FAKE_REASON", "Priority")  # no longer JobHeldUser: the release happened
    settings, path = _settings(tmp_path)
    assert jbsubmit.submit_with_finalizer(settings, path, dict(os.environ)) == ("101", "102")
    assert "scancel" not in fake_slurm.read_text()


def test_an_interruption_between_the_two_sbatch_calls_cancels_the_held_job(
    fake_slurm: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("FAKE_FINALIZER", "interrupt")  # SIGINT to submit while it waits for the finalizer's sbatch
    monkeypatch.setenv("FAKE_SCANCEL", "ok")
    settings, path = _settings(tmp_path)
    # Ctrl-C as an interactive `jube run` gets it: Python's own handler (a test worker may have been started with
    # another, and the suite's order decides which runs before this test)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            jbsubmit.submit_with_finalizer(settings, path, dict(os.environ))
    finally:
        signal.signal(signal.SIGINT, previous)
    assert "JB status=FAILED" in (tmp_path / "work" / "result.txt").read_text()  # not the PENDING row it had
    assert "scancel 101" in fake_slurm.read_text().splitlines()
    assert "job 101 was cancelled before it started" in capsys.readouterr().err


@pytest.mark.parametrize("setup", ["exit 0", "set -e; false"])
def test_the_finalizer_records_a_failed_row_where_its_recorder_cannot_run(tmp_path: Path, setup: str) -> None:
    """The finalizer job's own script (sbatch --wrap runs it with /bin/sh), run here: setup lines that end the shell
    on the finalizer's node leave a FAILED result.txt and job.done, not a JUBE waiting forever."""
    settings, path = _settings(tmp_path, setup)
    argv = jbsubmit.finalizer_command(settings, path, "101")
    proc = subprocess.run(["sh", "-c", argv[argv.index("--wrap") + 1]], cwd=path.parent, timeout=60)
    assert proc.returncode == jbsettings.SETUP_FAILED
    result = (path.parent / "result.txt").read_text()
    assert result.startswith("JB status=FAILED\n") and (path.parent / "job.done").exists()
    assert "could not record job 101: its recorder exited with code 86 (86: profile key setup failed" in result


def test_a_point_recorded_on_the_login_node_gets_a_failed_row_where_setup_fails(tmp_path: Path) -> None:
    """An INVALID point is recorded by submit with the job's Python after setup; setup fails there too."""
    settings, path = _settings(tmp_path, "set -e; false")
    settings.update(JB_STATUS="INVALID", JB_REASON="gbs=3 is not divisible")
    jbsettings.write_settings(path, settings)
    jbsubmit._finalize_here(path, "finalize", "--status", "INVALID", "--reason", settings["JB_REASON"])
    result = (path.parent / "result.txt").read_text()
    assert "JB status=FAILED\n" in result and (path.parent / "job.done").exists()
    assert "could not record this point on the login node (profile key setup failed there); gbs=3" in result
