"""The commands of the README's and docs' code blocks, each with where it stands and its comment: one reading for the
CPU test that runs them (tests/test_documented_commands.py) and the GPU script that runs the `# GPU only` ones
(benchmarks/gpu_doc_lines.py). BENCHMARKS.md and perf-notes.md are records of GPU runs, not instructions."""

from __future__ import annotations

import shlex
import sys
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RECORDS = ("BENCHMARKS.md", "perf-notes.md")
PROGRAMS = ("jpwr", "joulebench", "python", "python3", "jube", "sh", "bash", ".", "pip", "torchrun")
GPU_ONLY = "GPU only"  # the doc's mark for a line that needs a GPU: `# GPU only` after the command


def code_lines(text: str) -> list[tuple[int, str]]:
    """Lines of fenced and of indented code blocks, backslash continuations joined."""
    found: list[tuple[int, str]] = []
    fenced, indented, previous_blank = False, False, True
    pending: tuple[int, str] | None = None
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        # an indented block starts after a blank line (else it is a list item's continuation)
        indented = line.startswith("    ") and (previous_blank or indented)
        previous_blank = not line.strip()
        if not (fenced or indented):
            continue
        start, content = (pending[0], f"{pending[1]} {line.strip()}") if pending else (number, line.strip())
        pending = (start, content[:-1].rstrip()) if content.endswith("\\") else None
        if pending is None:
            found.append((start, content))
    return found


def with_this_python(words: list[str], fill: Callable[[str], str] = str) -> list[str]:
    """The command with this interpreter for python, jpwr, joulebench and torchrun, also after jpwr's `--`; every
    other word through `fill` (a doc's placeholder or path made this machine's)."""
    argv: list[str] = []
    for i, word in enumerate(words):
        word = word.removeprefix(".venv/bin/")
        at_start = i == 0 or words[i - 1] == "--"
        if at_start and word in ("jpwr", "joulebench"):
            argv += [sys.executable, "-m", word]
        elif at_start and word == "torchrun":
            argv += [sys.executable, "-m", "torch.distributed.run"]
        elif at_start and word in ("python", "python3"):
            argv.append(sys.executable)
        else:
            argv.append(fill(word))
    return argv


def strip_comment(command: str) -> str:
    words = shlex.split(command, comments=True)
    return shlex.join(words)


def documented_commands(repo: Path = REPO) -> list[tuple[str, str, str]]:
    """(where, command, its comment) of every command in the README's and docs' code blocks."""
    commands = []
    for doc in [repo / "README.md", *sorted((repo / "docs").glob("*.md"))]:
        if doc.name in RECORDS:
            continue
        for number, line in code_lines(doc.read_text()):
            words = line.split()
            if not words or words[0].removeprefix(".venv/bin/") not in PROGRAMS or words[1:2] == ["="]:
                continue  # not a command (an ini line such as `python = python` is not one either)
            if words[1].endswith(":"):
                continue  # a program's output (`joulebench device-settings: error: ...`)
            try:
                commands.append((f"{doc.relative_to(repo)}:{number}", strip_comment(line),
                                 line.partition(" # ")[2].strip()))
            except ValueError:  # not shell (a Python line that happens to start with "python")
                continue
    return commands
