"""Every command in the README and docs works as written, as far as a CPU machine can tell.

Commands are taken from the code blocks of README.md and docs/*.md (BENCHMARKS.md and
perf-notes.md are records of GPU runs, each with its device and date). Each is checked the way
that needs no GPU, cluster or Apptainer:
- a driver's `train`/`run` command: its `validate` twin with the same options passes (validate
  accepts exactly what train accepts and touches no device); `validate` and `make-data` run as written;
- `jpwr`/`joulebench`/`jbcontainer.py` verbs exist and every option used is one the verb accepts;
- `jube run FILE --tag ...`: the workflow file exists and jbprofile accepts the tags;
- set-up commands (venv, pip, jube/setup.sh, the test command) are what `.ci/run` itself runs.
Then every CPU example in the README and docs/ runs as written (test_documented_example_runs), in a
directory that sees the repository's files, as on a CPU machine, and leaves nothing there that .gitignore does not
ignore (so `git status` stays clean in a clone): no fake sensor and no variable the doc
line does not show (this checkout on PYTHONPATH stands for the install); only the interpreter is
substituted (and /tmp/ by a directory beside it). Not run, each skipped
with its reason: lines marked `# GPU only` in the doc, set-up, JUBE and Apptainer commands, commands
reading a JUBE run, and templates (uppercase, bracketed or $ parts to fill in). The README's quick
start (and its commands that read the quick start's run) runs in tests/test_quick_start.py; the
README's main job (`.venv/bin/jube run jube/llm_benchmark.xml -e -a -r`) in tests/jube/test_local.py.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.doc_lines import GPU_ONLY, documented_commands, with_this_python

REPO = Path(__file__).resolve().parent.parent
FAKES_DIR = REPO / "tests" / "fakes"
DRIVERS = ("llm_training", "resnet50", "llm_inference")
SETUP_PREFIXES = ("python3 -m venv", "python -m venv", "pip install", "sh jube/setup.sh", ". .venv/bin/activate",
                  "bash .ci/run", "sh tests/", "bash tests/")
PLACEHOLDER = re.compile(r"\[|\.\.\.|\||<|\$|\b[A-Z][A-Z_]{2,}\b")  # synopses: [--opt], CMD ..., RUN_DIR, $OUT


def _run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=300)


_HELP: dict[tuple[str, ...], subprocess.CompletedProcess[str]] = {}


def _help(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """`argv` (ending in --help) run once per test process: many documented lines use the same verb."""
    if tuple(argv) not in _HELP:
        _HELP[tuple(argv)] = _run(argv, cwd)
    return _HELP[tuple(argv)]


def _options(words: list[str]) -> list[str]:
    return [w.split("=", 1)[0] for w in words if w.startswith("--") and w != "--"]


def _check_verb(prefix: list[str], words: list[str], cwd: Path) -> None:
    """The verb exists and accepts every option the command uses (its --help lists them)."""
    verb = words[0] if words and re.fullmatch(r"[a-z][a-z-]*", words[0]) else None
    argv = [*prefix, *([verb] if verb else []), "--help"]
    result = _help(argv, cwd)
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
    if sub in ("train", "run", "load"):
        sub = "validate" if sub != "load" else "validate-load"  # same options, no device (as JUBE's validate step)
        if "--device" not in rest:  # `auto` validates for this host (no GPU here); the docs' commands are the GPU's
            rest = [*rest, "--device", "cuda"]
    elif sub in ("make-data", "save-checkpoint"):
        rest = [w.replace("/tmp/", f"{tmp_path}/") for w in rest]
    elif sub == "preprocess":
        return _check_verb([sys.executable, "-m", module], [sub, *rest], tmp_path)
    elif sub not in ("validate", "validate-load", "save-checkpoint"):
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


NOT_LINKED = {"runs", "report", "jpwr_out", "out"}  # what the commands write: in the sandbox, not the clone


def not_run_reason(where: str, command: str, comment: str) -> str | None:
    """Why test_documented_example_runs does not run a documented command; None: it runs."""
    words = shlex.split(command)
    program = words[0].removeprefix(".venv/bin/")
    if GPU_ONLY in comment:
        return f"marked `# {GPU_ONLY}` in the doc"
    if words[:2] == ["joulebench", "demo"]:
        return "the demo: tests/test_energy_domain.py runs it (with a shorter phase replay)"
    if where.startswith("README.md") and "runs/" in command:
        return "the quick start or its run: tests/test_quick_start.py runs the sequence"
    if any(command.startswith(prefix) for prefix in SETUP_PREFIXES):
        return "set-up: .ci/run runs it"
    if program == "jube":
        return "JUBE: tests/jube runs the workflows (on a local Slurm cluster)"
    if "jube/runs/" in command:
        return "reads a JUBE run: a workflow must have run first (tests/jube)"
    if "container/jbcontainer.py" in command:
        return "Apptainer: not on CI machines"
    if PLACEHOLDER.search(command):
        return "a template: its uppercase, bracketed or $ parts are yours to fill in"
    if program in ("python", "python3") and words[1] == "-m" and words[2] in DRIVERS \
            and words[3] in ("validate", "validate-load", "make-data"):
        return "run as written by test_documented_command"
    return None


def as_run(words: list[str], sandbox: Path) -> list[str]:
    """The command with this interpreter for Python programs, /tmp/ in the sandbox."""
    return with_this_python(words, lambda word: word.replace("/tmp/", f"{sandbox}/"))


def as_installed() -> dict[str, str]:
    """This process's environment as a user's shell after the README's install: this checkout importable, none of
    the tests' fakes (the hardware-boundary fakes, their trace and faults)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("JPWR_FAKE_")}
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and Path(p).resolve() != FAKES_DIR]
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *paths])
    return env


COMMANDS = documented_commands()


def test_the_docs_have_commands_to_check():
    assert len(COMMANDS) > 40  # the extraction itself works (a broken parser would check nothing)
    assert sum(not_run_reason(*c) is None for c in COMMANDS) >= 5  # and some CPU examples run


@pytest.mark.parametrize(("where", "command", "comment"), COMMANDS, ids=[where for where, _, _ in COMMANDS])
def test_documented_command(where: str, command: str, comment: str, tmp_path: Path) -> None:
    check(command, tmp_path)


@pytest.mark.parametrize(("where", "command", "comment"), COMMANDS, ids=[where for where, _, _ in COMMANDS])
def test_documented_example_runs(where: str, command: str, comment: str, tmp_path: Path) -> None:
    reason = not_run_reason(where, command, comment)
    if reason:
        pytest.skip(reason)
    sandbox = tmp_path / "clone"  # the clone's files, read through links; what the command writes stays here
    sandbox.mkdir()
    for entry in REPO.iterdir():
        if not entry.name.startswith(".") and entry.name not in NOT_LINKED:
            (sandbox / entry.name).symlink_to(entry)
    (tmp_path / "tmp").mkdir()  # a doc line's /tmp/: outside the clone, as on the machine it documents
    argv = as_run(shlex.split(command), tmp_path / "tmp")
    result = subprocess.run(argv, cwd=sandbox, env=as_installed(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"{command}:\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}"
    assert "FAILED" not in result.stdout, f"{command} printed a FAILED row:\n{result.stdout[-3000:]}"
    # run from a clone's root, it leaves `git status` clean: it wrote only where .gitignore already ignores (runs/,
    # report/, out/, jpwr's default jpwr_out/)
    created = [f"{entry.name}/" if entry.is_dir() else entry.name for entry in sandbox.iterdir()
               if not entry.is_symlink()]
    ignored = subprocess.run(["git", "check-ignore", "--no-index", "--stdin"], cwd=REPO, text=True,
                             input="\n".join(created), capture_output=True).stdout.split()
    assert sorted(ignored) == sorted(created), f"{command} wrote {sorted(set(created) - set(ignored))} into the clone"
