"""The job's settings file (`job.env`): JB_* variables that jube/job.sh sources and the tools read back.

Standard library only (Python >= 3.10) plus jpwr's stdlib-only atomic writer: used on the login node (jbprofile.py,
jbsubmit.py) and in the job (jbrecord.py).
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from jpwr.output import write_atomic  # noqa: E402  (the repository root is put on sys.path just above)

SETTINGS_FILE = "job.env"  # in the point's work directory; jbsubmit.py writes it just before it submits the job


def write_settings(path: Path, settings: dict[str, str]) -> None:
    text = "# joulebench job settings (written by jube/jbprofile.py; sourced by jube/job.sh)\n"
    text += "".join(f"{key}={shlex.quote(val)}\n" for key, val in settings.items())
    write_atomic(path, text)


def read_settings(path: Path) -> dict[str, str]:
    """The inverse of write_settings (values may span lines: a profile's setup can)."""
    words = shlex.split(path.read_text(), comments=True)
    return dict(word.split("=", 1) for word in words)


SETUP_FAILED = 86  # exit code of in_profile_shell when the setup lines fail (non-zero status) or end the shell
RESULT_FILE = "result.txt"  # the JB lines JUBE's result step reads (jbrecord.py writes them)
JOB_ID_FILE = "job.id"  # the benchmark job's Slurm id (jbsubmit.py writes it once sbatch answered)


def in_profile_shell(setup: str, argv: list[str]) -> list[str]:
    """Run argv after the profile's setup lines (module loads, venv) as the job script runs them: bash's `eval` of
    the same text (jbshell.py checked it with `bash -n`) with no positional parameters. Setup lines that fail or end
    the shell (`exit`, `set -e` and a failing command) make it exit SETUP_FAILED, as they fail the job (job.sh)."""
    script = (f'trap "exit {SETUP_FAILED}" EXIT; _jb_setup=$1; set --; eval "$_jb_setup"; '
              f'[ $? -eq 0 ] || exit {SETUP_FAILED}; trap - EXIT; exec {shlex.join(argv)}')
    return ["bash", "-c", script, "jb-setup", setup]


def job_python(settings: dict[str, str], args: list[str]) -> list[str]:
    """The job's Python with `args`, where the job runs it: after the setup lines, inside the container prefix."""
    container = shlex.split(settings.get("JB_CONTAINER", ""))
    return in_profile_shell(settings["JB_SETUP"], [*container, settings["JB_PYTHON"], *args])


def bound_env(settings: dict[str, str], *paths: Path) -> dict[str, str]:
    """This environment, with `paths` added to the container image's bind variable where the profile names one: a
    login-node step that runs the job's Python in the image reads and writes there."""
    env = dict(os.environ)
    if bind_var := settings.get("JB_CONTAINER_BIND_VAR"):
        env[bind_var] = ",".join(filter(None, [env.get(bind_var), *map(str, paths)]))
    return env


def provisional_result(status: str, note: str, job_id: str) -> str:
    """result.txt for a point whose job is queued (PENDING, jbsubmit.py) or running (RUNNING, job.sh), so that
    `jube result -a` on a half-finished run names the points still to come; the job's recorder replaces it."""
    return f"JB status={status}\nJB job_id={job_id}\nJB note={note}\nJB short_note={note}\n"


def failed_result(reason: str) -> str:
    """result.txt's lines for a job whose recorder could not run (jbrecord.render's form: one line each, no commas)."""
    reason = " ".join(reason.split()).replace(",", ";")
    return f"JB status=FAILED\nJB note={reason}\nJB status_reason={reason}\n"
