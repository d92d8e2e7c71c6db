"""The job's settings file (`job.env`): JB_* variables that jube/job.sh sources and the tools read back.

Standard library only (Python >= 3.8) plus jpwr's stdlib-only atomic writer: used on the login node (jbprofile.py,
jbsubmit.py) and in the job (jbrecord.py).
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from jpwr import write_atomic  # noqa: E402  (the repository root is put on sys.path just above)

SETTINGS_FILE = "job.env"  # in the point's work directory; jbsubmit.py writes it just before it submits the job


def write_settings(path: Path, settings: dict[str, str]) -> None:
    text = "# joulebench job settings (written by jube/jbprofile.py; sourced by jube/job.sh)\n"
    text += "".join(f"{key}={shlex.quote(val)}\n" for key, val in settings.items())
    write_atomic(path, text)


def read_settings(path: Path) -> dict[str, str]:
    """The inverse of write_settings (values may span lines: a profile's setup can)."""
    words = shlex.split(path.read_text(), comments=True)
    return dict(word.split("=", 1) for word in words)


def in_profile_shell(settings: dict[str, str], argv: list[str]) -> list[str]:
    """Run argv after the profile's setup lines (module loads, venv) as the job script runs them: bash's `eval` of
    the same text (jbprofile.py checked it with `bash -n`), so that both read every line alike."""
    return ["bash", "-c", 'eval "$1"; shift; exec "$@"', "jb-setup", settings["JB_SETUP"], *argv]
