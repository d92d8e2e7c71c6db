"""The job's settings file (`job.env`): JB_* variables that jube/job.sh sources and the tools read back.

Standard library only (Python >= 3.10) plus jpwr's stdlib-only atomic writer: used on the login node (jbprofile.py,
jbsubmit.py) and in the job (jbrecord.py).
"""

from __future__ import annotations

import os
import re
import shlex
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from jbsystems import ConfigError  # noqa: E402  (as below: after the path)

from jpwr.output import write_atomic  # noqa: E402  (the repository root is put on sys.path just above)

SETTINGS_FILE = "job.env"  # in the point's work directory; jbsubmit.py writes it just before it submits the job


HEADER = "# joulebench job settings"  # write_settings' first line, with the count of settings that follow
COUNTED = re.compile(re.escape(HEADER) + r" \((\d+) settings;")
KEY = re.compile(r"[A-Z_][A-Z0-9_]*")
SETTINGS_FIX = "rerun the workflow (`jube run ...`): its validate step writes job.env, which is not edited by hand"


class SettingsError(ConfigError):
    """A job settings file that cannot be read: the file, the line and what is wrong, and how to get a good one."""


def write_settings(path: Path, settings: dict[str, str]) -> None:
    """The settings as `KEY=value` lines job.sh sources, under a header that counts them: a file cut short at a line
    end still reads as shell, and only the count tells it is incomplete (read_settings)."""
    text = f"{HEADER} ({len(settings)} settings; written by jube/jbprofile.py; sourced by jube/job.sh)\n"
    text += "".join(f"{key}={shlex.quote(val)}\n" for key, val in settings.items())
    write_atomic(path, text)


def read_settings(path: Path) -> dict[str, str]:
    """The inverse of write_settings (values may span lines: a profile's setup can). A file that is missing,
    unreadable, empty, not UTF-8, not `KEY=value` words, with an unclosed quote or fewer settings than its header
    counts (truncated) is a SettingsError naming the file, the line and the fix, never a traceback."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise SettingsError(f"job settings {path} cannot be read ({exc.strerror or exc})",
                            "pass the job.env a validate step wrote (--settings <its work directory>/job.env), or "
                            "rerun the workflow (`jube run ...`)") from None
    try:
        text = data.decode()
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise SettingsError(f"job settings {path} line {line} is not UTF-8 text (byte {exc.start})",
                            SETTINGS_FIX) from None
    settings = _settings_words(path, text)
    if not settings:
        raise SettingsError(f"job settings {path} is empty (no KEY=value line)", SETTINGS_FIX)
    counted = COUNTED.match(text)
    if counted and len(settings) != int(counted[1]):
        last = text.rstrip("\n").count("\n") + 1
        raise SettingsError(f"job settings {path} holds {len(settings)} settings, its header counts {counted[1]} "
                            f"(truncated after line {last}?)", SETTINGS_FIX)
    return settings


def _settings_words(path: Path, text: str) -> dict[str, str]:
    """The KEY=value words of a settings text, as the shell reads them; a SettingsError naming the line of the first
    word that is not one, or of an unclosed quote."""
    lexer = shlex.shlex(text, posix=True)
    lexer.whitespace_split, lexer.commenters = True, "#"
    settings: dict[str, str] = {}
    while True:
        line = lexer.lineno
        try:
            word = lexer.get_token()
        except ValueError as exc:  # shlex: "No closing quotation", "No escaped character"
            raise SettingsError(f"job settings {path} line {line}: {str(exc).lower()} (a quote opened there is never "
                                "closed: truncated or edited)", SETTINGS_FIX) from None
        if word is None:
            return settings
        key, sep, value = word.partition("=")
        if not sep or not KEY.fullmatch(key):
            shown = word if len(word) <= 40 else f"{word[:40]}..."
            raise SettingsError(f"job settings {path} line {line}: {shown!r} is not KEY=value (a key of capitals, "
                                "digits and _)", SETTINGS_FIX)
        if key in settings and settings[key] != value:
            raise SettingsError(f"job settings {path} line {line}: {key} is set twice, to different values",
                                SETTINGS_FIX)
        settings[key] = value


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


def provisional_result(status: str, note: str, short: str, job_id: str) -> str:
    """result.txt for a point whose job is queued (PENDING, jbsubmit.py) or running (RUNNING, job.sh), so that
    `jube result -a` on a half-finished run names the points still to come; the job's recorder replaces it. `short`:
    the default table's Reason, within jbrecord.SHORT_NOTE_CHARS (the row's JobID names the job)."""
    return f"JB status={status}\nJB job_id={job_id}\nJB note={note}\nJB short_note={short}\n"


def failed_result(reason: str) -> str:
    """result.txt's lines for a job whose recorder could not run (jbrecord.render's form: one line each, no commas)."""
    reason = " ".join(reason.split()).replace(",", ";")
    return f"JB status=FAILED\nJB note={reason}\nJB status_reason={reason}\n"
