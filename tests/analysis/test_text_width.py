"""Every default line a person reads is at most 160 columns (joulebench.analysis.text_width): the helpers, and the
verbs' outputs on the shipped records (the goldens test_verbs_unchanged.py checks this tree against)."""

from __future__ import annotations

from pathlib import Path

import pytest

from joulebench.analysis.text_width import WIDTH, fitted, table, wrapped
from jpwr.errors import ValidationError, exit_code_of

GOLDEN = Path(__file__).resolve().parent / "golden"
CASES = sorted(p.name for p in GOLDEN.iterdir() if p.is_dir())  # every case, its errors (stderr) included


def test_a_long_line_wraps_at_spaces_under_its_own_indent() -> None:
    words = [f"word{i}" for i in range(60)]
    lines = wrapped("  note: " + " ".join(words), 80)
    assert len(lines) > 1 and all(len(line) <= 80 for line in lines)
    assert all(line.startswith("      word") for line in lines[1:])  # the line's indent and four more
    assert " ".join(line.strip() for line in lines) == "note: " + " ".join(words)  # no word lost or cut
    assert wrapped("x" * 200, 80) == ["x" * 200]  # a word longer than the width stays whole
    assert fitted(["short", "a " * 50], 40).count("\n") >= 2


def test_a_tables_long_last_cell_goes_on_under_its_column() -> None:
    reason = " ".join(["below resolution: its mean power is known only to ±38%"] * 4)
    lines = table(["phase", "J", "status"], [["forward", "21.6", "resolved"], ["backward", "n/a", reason]],
                  width=80, indent="  ")
    assert all(len(line) <= 80 for line in lines) and len(lines) > 4
    column = lines[0].index("status")
    continued = lines[4:]
    assert all(line[:column].strip() == "" and line[column] != " " for line in continued)
    assert " ".join([lines[3][column:], *(line[column:] for line in continued)]) == reason
    assert lines[2] == "  " + "forward  | 21.6 | resolved"  # the last column is not padded
    assert lines[1].strip("-") == "  "


def test_an_errors_details_go_above_it_one_a_line_each_within_the_width(capsys) -> None:
    """A refusal that names many inputs (every run left out, every workload) keeps its error line short: the list is
    printed above it, one item a line, a long item wrapped under a deeper indent, no word lost."""
    items = [f"run r{i}: " + " ".join(["phase forward has no energy or duration (below resolution)"] * (i + 1))
             for i in range(3)]

    def refuse() -> int:
        raise ValidationError("3 runs left out (above)", "attribute them", items)

    assert exit_code_of("joulebench plan", refuse) == 64
    lines = capsys.readouterr().err.splitlines()
    assert lines[-1] == "joulebench plan: error: 3 runs left out (above). Fix: attribute them"
    assert all(len(line) <= WIDTH for line in lines) and len(lines) > len(items) + 1  # the third item wraps
    items_printed = " ".join(line.strip() for line in lines[:-1])
    assert items_printed == " ".join(f"joulebench plan: {item}" for item in items)
    assert all(line.startswith(("joulebench plan: run r", "    ")) for line in lines[:-1])


LONG_PROBLEM = "--energy-methods nvml,rapl,amdsmi asks for sensors this machine lacks: " + ", ".join(
    f"/sys/class/powercap/intel-rapl:{i}/energy_uj is not readable" for i in range(4))
LONG_FIX = "run as a user who may read the counters (sudo chmod o+r ...), or leave them out of --energy-methods"
REFUSE = ("import sys; from jpwr.errors import ValidationError, exit_code_of\n"
          "def refuse(): raise ValidationError(sys.argv[1], sys.argv[2])\n"
          "sys.exit(exit_code_of('jpwr', refuse))")


def test_a_long_error_wraps_on_a_terminal_and_keeps_every_word() -> None:
    """An error without a list can still be long (a fix naming several options): on a terminal (a pty here) it
    wraps at spaces, its further lines indented; joined again it is the message, word for word."""
    code, lines = _stderr_on_a_terminal(["-c", REFUSE, LONG_PROBLEM, LONG_FIX])
    assert code == 64 and len(lines) > 1 and all(len(line) <= WIDTH for line in lines)
    assert all(line.startswith("    ") and not line.startswith("     ") for line in lines[1:])
    assert " ".join(line.strip() for line in lines) == f"jpwr: error: {LONG_PROBLEM}. Fix: {LONG_FIX}"


UNKNOWN = [f"--not-an-option-{i}" for i in range(30)]  # argparse's error line lists each: 610 columns


def _stderr_on_a_terminal(argv: list[str]) -> tuple[int, list[str]]:
    """(exit code, stderr's lines) of `python ARGV` with stderr on a pseudo-terminal."""
    import os
    import pty
    import subprocess
    import sys

    try:
        primary, secondary = pty.openpty()
    except OSError as exc:  # a container without /dev/pts
        pytest.skip(f"no pseudo-terminal here: {exc}")
    proc = subprocess.run([sys.executable, *argv], stderr=secondary, check=False,
                          cwd=Path(__file__).resolve().parents[2])
    os.close(secondary)
    printed = os.read(primary, 65536).decode()
    os.close(primary)
    return proc.returncode, printed.replace("\r\n", "\n").strip("\n").splitlines()


@pytest.mark.parametrize("argv", [["-m", "joulebench", "report", *UNKNOWN], ["-m", "llm_inference", "run", *UNKNOWN],
                                  ["-m", "jpwr", "info", *UNKNOWN]], ids=["joulebench", "driver", "jpwr"])
def test_a_usage_error_of_argparse_wraps_on_a_terminal_too(argv: list[str]) -> None:
    """argparse wraps its usage lines but not its error line: the shared parser (jpwr.errors.ArgumentParser) does,
    on a terminal, like the boundary's errors; joined again it is argparse's line, word for word."""
    code, lines = _stderr_on_a_terminal(argv)
    assert code == 2  # argparse's own
    error = next(i for i, line in enumerate(lines) if ": error: unrecognized arguments: " in line)
    assert all(len(line) <= WIDTH for line in lines) and len(lines) > error + 1, lines
    assert " ".join(line.strip() for line in lines[error:]).endswith("unrecognized arguments: " + " ".join(UNKNOWN))


def test_in_a_log_or_a_pipe_the_error_stays_one_line(capsys) -> None:
    """The JUBE recorder takes a row's note from the job's stderr log, and users grep logs: one line each."""
    def refuse() -> int:
        raise ValidationError(LONG_PROBLEM, LONG_FIX)

    assert exit_code_of("jpwr", refuse) == 64
    assert capsys.readouterr().err == f"jpwr: error: {LONG_PROBLEM}. Fix: {LONG_FIX}\n"


@pytest.mark.parametrize("case", CASES)
def test_the_verbs_default_output_is_at_most_160_columns(case: str) -> None:
    printed = (GOLDEN / case / "stdout.txt").read_text().splitlines()
    wide = [f"{len(line)}: {line[:80]}..." for line in printed if len(line) > WIDTH]
    assert not wide, "\n".join(wide)


def test_the_verbs_outputs_are_checked() -> None:
    verbs = {case.split("_")[0] for case in CASES}
    # a renamed folder would check nothing
    assert {"attribute", "report", "compare", "pareto", "plan", "plot", "usage"} <= verbs
