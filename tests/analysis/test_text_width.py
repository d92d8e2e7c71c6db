"""Every default line a person reads is at most 160 columns (joulebench.analysis.text_width): the helpers, and the
verbs' outputs on the shipped records (the goldens test_verbs_unchanged.py checks this tree against)."""

from __future__ import annotations

from pathlib import Path

import pytest

from joulebench.analysis.text_width import WIDTH, fitted, table, wrapped

GOLDEN = Path(__file__).resolve().parent / "golden"
# Golden cases (name prefixes) still wider than WIDTH, each with why: every other case must keep to it.
NOT_YET = {"pareto_": "--pareto's default table has too many columns (issue 48 item 6, open)",
           "plan_fit": "a one-line error message (the error boundary does not wrap yet; issue 48 item 6, open)"}
CASES = sorted(p.name for p in GOLDEN.iterdir() if p.is_dir() and not p.name.startswith(tuple(NOT_YET)))


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


@pytest.mark.parametrize("case", CASES)
def test_the_verbs_default_output_is_at_most_160_columns(case: str) -> None:
    printed = (GOLDEN / case / "stdout.txt").read_text().splitlines()
    wide = [f"{len(line)}: {line[:80]}..." for line in printed if len(line) > WIDTH]
    assert not wide, "\n".join(wide)


def test_the_verbs_outputs_are_checked() -> None:
    verbs = {case.split("_")[0] for case in CASES}
    assert {"attribute", "report", "compare", "plan", "plot", "usage"} <= verbs  # a renamed folder would check nothing
