"""`joulebench VERB`: the analysis command line, as users run it (a real process)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from jpwr.errors import ExitCode

JOULEBENCH = [sys.executable, "-m", "joulebench"]
REPO = Path(__file__).resolve().parents[2]


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


def test_damaged_inputs_get_one_line_naming_the_file(tmp_path):
    """A truncated trace, a record field of the wrong type: a message and a sysexits code, no traceback."""
    trace = tmp_path / "trace.h5"
    committed = next((REPO / "benchmarks" / "results").rglob("trace.h5"))
    trace.write_bytes(committed.read_bytes()[:4000])  # truncated mid-file
    plot = subprocess.run([*JOULEBENCH, "plot", str(trace), "-o", str(tmp_path / "t.png")],
                          capture_output=True, text=True, timeout=120)
    assert plot.returncode == ExitCode.DATA, plot.stderr
    assert f"{trace} is not a readable jpwr trace" in plot.stderr and "Traceback" not in plot.stderr

    record = json.loads(next((REPO / "benchmarks" / "results").rglob("run_record.json")).read_text())
    record["windows"] = [{"name": "steady", "first_step": "five"}]
    (tmp_path / "run" / "run_record.json").parent.mkdir()
    (tmp_path / "run" / "run_record.json").write_text(json.dumps(record))
    report = subprocess.run([*JOULEBENCH, "report", str(tmp_path / "run"), "-o", str(tmp_path / "out")],
                            capture_output=True, text=True, timeout=120)
    assert report.returncode in (ExitCode.USAGE, ExitCode.DATA), report.stderr
    assert "run_record.json" in report.stderr and "Traceback" not in report.stderr
    debug = subprocess.run([*JOULEBENCH, "report", str(tmp_path / "run"), "-o", str(tmp_path / "out"), "--debug"],
                           capture_output=True, text=True, timeout=120)
    assert "Traceback" in debug.stderr  # --debug shows where it failed
