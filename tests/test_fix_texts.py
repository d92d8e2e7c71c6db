"""Every option a fix text or error message names exists in the parser of the command it names (issue 34 item 4).

Why: "Fix: pass --steady-s 60" for an option called --steady-seconds sends the reader to a second error. The texts are
read from the source (every string of an error's construction, every string with "Fix:" given to a call), the parsers
are captured as in tests/test_numeric_options.py, and each `--option` must be one of the command the text names
before it (`jpwr serve`, `python -m llm_inference`, ...), else of the commands of the package the text is in, or a
driver's (texts say how to run a driver again). Options of other programs (pip, torchrun, srun, nvidia-smi, ...) are
not ours to check.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.test_numeric_options import _capture, _commands, _options

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("jpwr", "joulebench", "llm_training", "resnet50", "llm_inference")
FOREIGN = ("pip", "torchrun", "srun", "sbatch", "scontrol", "sinfo", "nvidia-smi", "rocm-smi", "apptainer", "jube",
           "transformers serve", "python3 -c", "vllm", "git", "kernel_profile.py")
OPTION = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*[a-z0-9]")
COMMAND = re.compile(r"\b(jpwr \w+|jpwr|joulebench [a-z-]+|python -m (?:llm_training|resnet50|llm_inference)|"
                     r"llm_training|resnet50|llm_inference|" + "|".join(map(re.escape, FOREIGN)) + r")\b")


def _text(node: ast.AST) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
    return None


def _messages(path: Path) -> Iterator[tuple[int, str]]:
    """(line, text): the strings given to an exception, and every string given to a call that says `Fix:`."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            error = getattr(node.func, "id", getattr(node.func, "attr", "")).endswith("Error")
            for arg in (*node.args, *(k.value for k in node.keywords)):
                if (text := _text(arg)) is not None and (error or "Fix:" in text):
                    yield node.lineno, text


def _parsers(monkeypatch: pytest.MonkeyPatch) -> dict[str, set[str]]:
    """Options per command (the captured ones and the two the numeric test needs not), per package (the union of
    its commands: a text in jpwr may name an option of `jpwr --` beside `jpwr combine`), and `*`, all of them (the
    shared core's texts are for every driver)."""
    from joulebench.analysis import report
    from joulebench.device_settings import __main__ as device_settings

    commands = {**_commands(), "joulebench report": lambda: report.main([]),
                "joulebench.device_settings": device_settings._parser}
    found = {name: {o for _, a in _options(_capture(build, monkeypatch)) for o in a.option_strings} | {"--debug"}
             for name, build in commands.items()}  # --debug: every command's, taken before its parser
    for package in PACKAGES:
        found[package] = set().union(*(opts for name, opts in found.items() if package in name))
    found["drivers"] = found["llm_training"] | found["resnet50"] | found["llm_inference"]
    found["*"] = set().union(*found.values())
    return found


def _allowed(parsers: dict[str, set[str]], text_before: str, path: Path) -> set[str] | None:
    """The options the command a text names last before an option has (with its package's), else those of the
    file's package; a driver's options everywhere (the meter's and the analysis's texts say how to run a driver
    again); None for another program's."""
    named = COMMAND.findall(text_before)
    owner = named[-1].removeprefix("python -m ") if named else None
    if owner in FOREIGN:
        return None
    relative = path.relative_to(REPO)
    package = relative.parts[0] if relative.parts[:2] not in (("joulebench", "analysis"),) else "joulebench"
    shared_core = relative.parts[0] == "joulebench" and relative.parts[1] not in ("analysis", "device_settings")
    if owner is None:
        return parsers["*"] if shared_core else parsers["drivers"] | parsers[
            "joulebench.device_settings" if "device_settings" in relative.parts else package]
    return parsers["drivers"] | parsers.get(owner, set()) | parsers[owner.split()[0]]


def test_every_option_named_in_a_fix_text_exists(monkeypatch: pytest.MonkeyPatch) -> None:
    parsers = _parsers(monkeypatch)
    checked, wrong = 0, []
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            for line, text in _messages(path):
                for match in OPTION.finditer(text):
                    allowed = _allowed(parsers, text[: match.start()], path)
                    if allowed is None:
                        continue
                    checked += 1
                    if match.group() not in allowed:
                        wrong.append(f"{path.relative_to(REPO)}:{line}: {match.group()}: {text[:140]}")
    assert checked > 20, checked
    assert not wrong, "\n".join(wrong)
