"""Every command in the README and docs works as written, as far as a CPU machine can tell.

Commands are taken from the code blocks of README.md and docs/*.md (BENCHMARKS.md and
perf-notes.md are records of GPU runs, each with its device and date). Each is checked the way
that needs no GPU, cluster or Apptainer:
- a driver's `train`/`run` command: its `validate` twin with the same options passes (validate
  accepts exactly what train accepts and touches no device); `validate` and `make-data` run as written;
- `jpwr`/`joulebench`/`jbcontainer.py` verbs exist and every option used is one the verb accepts;
- `jube run FILE --tag ...`: the workflow file exists and jbprofile accepts the tags;
- set-up commands (venv, pip, jube/setup.sh, the test command) are what `.ci/run` itself runs.
What this does not do: run GPU-sized trainings, submit to a cluster, build images. The README and
docs say where a command needs a GPU, a cluster or Apptainer; the GPU figures are in BENCHMARKS.md.
The README's main job (`.venv/bin/jube run jube/llm_benchmark.xml -e -a -r`) runs for real in
tests/jube/test_local.py.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
RECORDS = ("BENCHMARKS.md", "perf-notes.md")
DRIVERS = ("llm_training", "resnet50", "llm_inference")
SETUP_PREFIXES = ("python3 -m venv", "python -m venv", "pip install", "sh jube/setup.sh", ". .venv/bin/activate",
                  "bash .ci/run", "sh tests/", "bash tests/")
PROGRAMS = ("jpwr", "joulebench", "python", "python3", "jube", "sh", "bash", ".", "pip", "torchrun")
PLACEHOLDER = re.compile(r"\[|\.\.\.|\||<|\$|\b[A-Z][A-Z_]{2,}\b")  # synopses: [--opt], CMD ..., RUN_DIR, $OUT


def _code_lines(text: str) -> list[tuple[int, str]]:
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


def _strip_comment(command: str) -> str:
    words = shlex.split(command, comments=True)
    return shlex.join(words)


def documented_commands() -> list[tuple[str, str]]:
    commands = []
    for doc in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        if doc.name in RECORDS:
            continue
        for number, line in _code_lines(doc.read_text()):
            words = line.split()
            if not words or words[0].removeprefix(".venv/bin/") not in PROGRAMS or words[1:2] == ["="]:
                continue  # not a command (an ini line such as `python = python` is not one either)
            try:
                commands.append((f"{doc.relative_to(REPO)}:{number}", _strip_comment(line)))
            except ValueError:  # not shell (a Python line that happens to start with "python")
                continue
    return commands


def _run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=300)


def _options(words: list[str]) -> list[str]:
    return [w.split("=", 1)[0] for w in words if w.startswith("--") and w != "--"]


def _check_verb(prefix: list[str], words: list[str], cwd: Path) -> None:
    """The verb exists and accepts every option the command uses (its --help lists them)."""
    verb = words[0] if words and re.fullmatch(r"[a-z][a-z-]*", words[0]) else None
    argv = [*prefix, *([verb] if verb else []), "--help"]
    result = _run(argv, cwd)
    assert result.returncode == 0, f"{shlex.join(argv)} failed: {result.stderr}"
    for option in _options(words[1:] if verb else words):
        if option == "--help":
            continue
        assert option in result.stdout, f"{option} is not an option of {shlex.join(argv[:-1])}:\n{result.stdout}"


def _wrapped_command(words: list[str]) -> tuple[list[str], list[str]]:
    """Split `jpwr [options] -- CMD` into the jpwr part and the wrapped command."""
    if "--" in words:
        i = words.index("--")
        return words[:i], words[i + 1:]
    return words, []


def check(command: str, tmp_path: Path) -> None:
    words = shlex.split(command)
    words[0] = words[0].removeprefix(".venv/bin/")
    if any(command.startswith(prefix) for prefix in SETUP_PREFIXES):
        return  # .ci/run installs exactly this way and then runs the test command
    if words[0] in ("python", "python3") and words[1:2] == ["-m"]:
        module, rest = words[2], words[3:]
        if module in DRIVERS:
            return _check_driver(module, rest, tmp_path)
        if module in ("jpwr", "joulebench"):
            return check(shlex.join([module, *rest]), tmp_path)
        if module == "joulebench.device_settings":  # changes GPU settings where allowed: its options only
            return _check_verb([sys.executable, "-m", module], rest, tmp_path)
        if module == "torch.distributed.run":
            return _check_torchrun(rest, tmp_path)
        pytest.fail(f"no check for python -m {module}: add one")
    if words[0] in ("jpwr", "joulebench"):
        meter, wrapped = _wrapped_command(words[1:]) if words[0] == "jpwr" else (words[1:], [])
        if PLACEHOLDER.search(command):
            verb = meter[0] if meter and re.fullmatch(r"[a-z][a-z-]*", meter[0]) else None
            return _check_verb([sys.executable, "-m", words[0]], [verb] if verb else [], tmp_path)
        _check_verb([sys.executable, "-m", words[0]], meter, tmp_path)
        if wrapped and wrapped[0] not in ("python", "python3", "torchrun"):
            pytest.fail(f"no check for a wrapped {wrapped[0]}")
        if wrapped:
            check(shlex.join(wrapped), tmp_path)
        return None
    if words[0] == "torchrun":
        return _check_torchrun(words[1:], tmp_path)
    if words[0] in ("python", "python3") and words[1].startswith(("container/", "jube/")):
        return _check_verb([sys.executable, str(REPO / words[1])], words[2:], tmp_path)
    if words[0] in ("python", "python3") and words[1].startswith("benchmarks/"):
        assert (REPO / words[1]).is_file(), f"{words[1]} does not exist"
        return _check_verb([sys.executable, str(REPO / words[1])], words[2:], tmp_path)
    if words[0] == "jube":
        return _check_jube(words[1:])
    pytest.fail(f"no check for this kind of command: {command}")


def _check_torchrun(words: list[str], tmp_path: Path) -> None:
    module_at = words.index("-m")
    check(shlex.join(["python", "-m", *words[module_at + 1:]]), tmp_path)


def _check_driver(module: str, words: list[str], tmp_path: Path) -> None:
    sub, rest = words[0], words[1:]
    if PLACEHOLDER.search(shlex.join(rest)):  # a site path such as $IMAGENET_TFRECORDS: the options at least exist
        return _check_verb([sys.executable, "-m", module], [sub, *rest], tmp_path)
    if sub in ("train", "run"):
        sub = "validate"  # same options, no device (JUBE's validate step relies on that too)
    elif sub == "make-data":
        rest = [w.replace("/tmp/", f"{tmp_path}/") for w in rest]
    elif sub == "preprocess":
        return _check_verb([sys.executable, "-m", module], [sub, *rest], tmp_path)
    elif sub != "validate":
        pytest.fail(f"no check for python -m {module} {sub}")
    result = _run([sys.executable, "-m", module, sub, *rest], tmp_path)
    assert result.returncode == 0, f"python -m {module} {sub} {shlex.join(rest)}: {result.stderr[-2000:]}"


def _check_jube(words: list[str]) -> None:
    sys.path.insert(0, str(REPO / "jube"))
    try:
        import jbprofile
    finally:
        sys.path.pop(0)
    verb, rest = words[0], words[1:]
    if verb in ("continue", "result", "status"):
        assert rest and rest[0].startswith("jube/runs/"), f"jube {verb} should name a run directory: {words}"
        return
    assert verb == "run", f"no check for jube {verb}"
    xml = REPO / rest[0]
    assert xml.is_file(), f"{rest[0]} does not exist"
    benchmark = xml.stem.removesuffix("_benchmark")
    tags = rest[rest.index("--tag") + 1:] if "--tag" in rest else []
    tags = [t for t in tags if not t.startswith("-")]
    jbprofile.classify_tags(benchmark, tags, jbprofile.system_names())  # raises on an unknown tag


COMMANDS = documented_commands()


def test_the_docs_have_commands_to_check():
    assert len(COMMANDS) > 40  # the extraction itself works (a broken parser would check nothing)


@pytest.mark.parametrize(("where", "command"), COMMANDS, ids=[where for where, _ in COMMANDS])
def test_documented_command(where: str, command: str, tmp_path: Path) -> None:
    check(command, tmp_path)
