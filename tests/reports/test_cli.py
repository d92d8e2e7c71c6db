"""`joulebench VERB`: the analysis command line, as users run it (a real process)."""

from __future__ import annotations

import subprocess
import sys

from jpwr.errors import ExitCode

JOULEBENCH = [sys.executable, "-m", "joulebench"]


def test_usage_lists_the_verbs():
    result = subprocess.run([*JOULEBENCH, "--help"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0
    assert "report" in result.stdout and "plot" in result.stdout


def test_unknown_verb_names_the_known_ones():
    result = subprocess.run([*JOULEBENCH, "reprot"], capture_output=True, text=True, timeout=60)
    assert result.returncode == ExitCode.USAGE
    assert "unknown verb 'reprot'" in result.stderr and "Fix: use one of report, plot" in result.stderr


def test_no_verb_is_a_usage_error():
    result = subprocess.run(JOULEBENCH, capture_output=True, text=True, timeout=60)
    assert result.returncode == ExitCode.USAGE
    assert "usage: joulebench VERB" in result.stdout
