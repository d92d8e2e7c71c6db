"""joulebench.progress.Heartbeat's contract: a line at least every `every_s` while the command says nothing, none
while it speaks often enough itself (llm_inference run and load use it with 10 s); and the command named after a
driver's runs."""

from __future__ import annotations

import itertools
import time
from pathlib import Path

from joulebench.progress import EVERY_S, Heartbeat, next_command

EVERY = 0.2  # seconds: the contract at a test's scale
SLACK = 0.15  # a thread's wake-up on a loaded 2-core machine


def test_a_silent_stage_gets_a_line_every_period_and_a_talking_one_none() -> None:
    lines: list[tuple[float, str]] = []
    started = time.monotonic()
    with Heartbeat(lambda text: lines.append((time.monotonic(), text)), every_s=EVERY) as beat:
        beat.begin("chat bs=16 (point 1 of 2)")
        time.sleep(1.1)  # one long call: nothing of the command's own
        silent = len(lines)
        for _ in range(12):  # the command's own lines, more often than the period
            beat.say("own line")
            time.sleep(EVERY / 4)
    stamps = [started] + [t for t, _ in lines[:silent]]
    assert silent >= 4 and max(b - a for a, b in itertools.pairwise(stamps)) <= EVERY + SLACK, stamps
    assert lines[0][1] == "chat bs=16 (point 1 of 2): 0 s so far" and lines[silent - 1][1].endswith(" 1 s so far")
    assert [text for _, text in lines[silent:]] == ["own line"] * 12  # no heartbeat while the command talks
    assert EVERY_S == 10.0  # the drivers' period: the issue's "at least every 10 s"


def test_the_next_command_after_a_drivers_runs() -> None:
    """One run with energy: plot it first (README's quick start); without energy only the report can show it (plot
    and attribute would stop for want of a sensor); a sweep's runs: the report over their common directory."""
    assert next_command([(Path("runs/gpt"), 0.3)]) == ("next: joulebench plot runs/gpt -o runs/gpt/trace.png, then "
                                                       "joulebench report runs -o report/ and joulebench attribute "
                                                       "runs/gpt")
    assert next_command([(Path("runs/gpt"), None)]).startswith("next: joulebench report runs -o report/ (throughput; "
                                                               "energy n/a: with no sensor plot and attribute stop")
    assert next_command([(Path("runs/inf/chat_bs1"), 1.0), (Path("runs/inf/chat_bs8"), None)]) == (
        "next: joulebench report runs/inf -o report/ (2 runs: tables, charts, diagnosis)")
