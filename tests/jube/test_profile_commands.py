"""Profile settings that become command lines (jube/jbshell.py): refused at prepare when broken, the same words and
lines in job.sh as in the Python tools when valid, and a submission that fails after sbatch still ends as a row."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.jube.conftest import (
    JUBE_DIR,
    LLM_XML,
    REPO,
    continue_and_read,
    jube_run,
    requires_slurm,
    submit_workdirs,
)
from tests.jube.test_profile import CLEAN_ENV, jbprofile

jbsettings = sys.modules["jbsettings"]  # loaded by jbprofile from jube/
jbshell = sys.modules["jbshell"]
jbsubmit = sys.modules["jbsubmit"]

DOCS = (REPO / "docs" / "jube.md").read_text()
KIND_WORDS = {"shell lines": jbshell.LINES, "words": jbshell.WORDS, "program": jbshell.PROGRAM}
BASE = {"setup": "echo ready", "python": "/usr/bin/python3", "server_": "{python} -m server --port {port}"}
HOSTILE = {  # appended to a valid value of each key; each is valid bash unless LINES_REFUSED says otherwise
    "unbalanced quote": ' "unclosed', "semicolon": "; echo b", "command substitution": " $(hostname)",
    "backticks": " `hostname`", "pipe": " | tee b", "newline": "\n--second-line", "ampersand": " & wait",
    "redirect in": " < /dev/null", "redirect out": " > /dev/null", "parentheses": " (true)", "close paren": " )",
    "comment": " #x", "dollar in double quotes": ' "$HOME"', "backslash-dollar in double quotes": ' "\\$HOME"',
    "line-ending backslash": " \\\n--second-line", "tilde": " ~/x", "brace list": " {a,b}", "brace range": " n{1..3}",
}
LINES_REFUSED = ("unbalanced quote", "parentheses", "close paren")  # what `bash -n` cannot parse
QUOTED = {  # one word each, in the job and in the tools
    "--comment='a & b (c) #d $e `f` ~ {g,h}'": "--comment=a & b (c) #d $e `f` ~ {g,h}",
    '"--x=a;b|c<d>e"': "--x=a;b|c<d>e", "'~/x'": "~/x", "a#b": "a#b", "'{a,b}'": "{a,b}",
    'it\\\'s': "it's", '"say \\"hi\\""': 'say "hi"', "--exclude=n[1-2]": "--exclude=n[1-2]",
}
COMMAND_KEYS = jbshell.command_keys(jbprofile.load_profile("CI", CLEAN_ENV))


def _valid(key: str) -> str:
    return next((value for prefix, value in BASE.items() if key.startswith(prefix)), "--opt=a")


def _documented_command_keys() -> dict[str, str]:
    """docs/jube.md's list of the settings that become command lines: key pattern -> kind."""
    section = DOCS.split("The settings that become command lines", 1)[1].split("\n\n", 1)[0]
    documented = {}
    for bullet in section.split("\n- ")[1:]:
        names, _, text = bullet.partition(":")
        kind = next(k for word, k in KIND_WORDS.items() if word in text.split(".")[0])
        documented.update({name: kind for name in re.findall(r"`([^`]+)`", names)})
    return documented


def test_the_checked_keys_are_the_documented_command_line_forming_keys() -> None:
    """Every key of the CI profile (which has each server engine) that jbshell checks, by kind, is in docs/jube.md's
    list, and every documented pattern is checked."""
    patterns = {re.sub(r"^(server_(?:version_)?)\w+$", r"\1<ENGINE>", key): kind for key, kind in COMMAND_KEYS.items()}
    assert patterns == _documented_command_keys()
    assert sum(key.startswith("server_version_") for key in COMMAND_KEYS) >= 2


@pytest.mark.parametrize("case", HOSTILE)
@pytest.mark.parametrize("key", COMMAND_KEYS)
def test_hostile_values_are_refused_at_prepare_naming_key_value_source_and_fix(key: str, case: str) -> None:
    """Refused before anything runs (ConfigError: the validate step stops), except setup's shell syntax, which bash
    runs alike in the job and in the tools (test_setup_lines_do_the_same_in_the_job_and_in_the_tools)."""
    value = _valid(key) + HOSTILE[case]
    env = {**CLEAN_ENV, f"JOULEBENCH_LOCAL_{key.upper()}": value}
    if COMMAND_KEYS[key] == jbshell.LINES and case not in LINES_REFUSED:
        assert jbprofile.build_settings("llm", [], {}, "r", env)["JB_SETUP"] == value.strip()
        return
    with pytest.raises(jbprofile.ConfigError) as err:
        jbprofile.build_settings("llm", [], {}, "r", env)
    message = str(err.value)
    assert not isinstance(err.value, jbprofile.PointRefused)
    assert f"profile key {key} = {value.strip()!r}" in message, message
    assert "Fix: " in message and f"set in JOULEBENCH_LOCAL_{key.upper()}" in message.split("Fix: ")[1], message
    assert "bash: " not in message, message  # bash's own prefixes (`bash: -c: line 1:`) are left out
    if case == "dollar in double quotes" and COMMAND_KEYS[key] == jbshell.WORDS:
        assert "inside double quotes" in message and "unquoted" not in message, message
    if case == "line-ending backslash" and COMMAND_KEYS[key] == jbshell.WORDS:
        assert "write it on one line" in message, message


@pytest.mark.parametrize("value", QUOTED)
def test_properly_quoted_values_are_one_word(value: str) -> None:
    env = {**CLEAN_ENV, "JOULEBENCH_LOCAL_SRUN_ARGS": value, "JOULEBENCH_LOCAL_CONTAINER": f"env {value}"}
    settings = jbprofile.build_settings("llm", [], {}, "r", env)
    assert shlex.split(settings["JB_SRUN_ARGS"]) == [QUOTED[value]]
    assert shlex.split(settings["JB_CONTAINER"]) == ["env", QUOTED[value]]


def test_a_value_from_a_profile_file_of_a_system_without_a_variable_name_says_so(tmp_path: Path) -> None:
    """The source is the file; JOULEBENCH_MY-SITE_SRUN_ARGS cannot be exported, so the hint names the file way."""
    extra = tmp_path / "site.ini"
    extra.write_text("[my-site]\nlauncher = local\nvendor = cpu\nsrun_args = --x;y\n")
    env = {**CLEAN_ENV, "JOULEBENCH_PROFILE": str(extra)}
    with pytest.raises(jbprofile.ConfigError) as err:
        jbprofile.build_settings("llm", ["my-site"], {}, "r", env)
    fix = str(err.value).split("Fix: ")[1]
    assert f"set in the profile file (jube/systems.ini or {extra})" in fix, fix
    assert "srun_args in [my-site] of a file named by JOULEBENCH_PROFILE" in fix, fix


@pytest.mark.parametrize(("key", "value", "said"), [
    ("jpwr_methods", "nvml,bogus", "unknown measurement method 'bogus'"),
    ("partition", "gpu devel", "is not one Slurm name"), ("account", "proj x", "is not one Slurm name"),
])
def test_site_names_and_meter_methods_are_checked_at_prepare(key: str, value: str, said: str) -> None:
    with pytest.raises(jbprofile.ConfigError, match=said):
        jbprofile.build_settings("llm", [], {}, "r", {**CLEAN_ENV, f"JOULEBENCH_{key.upper()}": value})


@pytest.mark.parametrize(("key", "value", "said"), [
    ("SRUN_ARGS", "--x=a;b", "has shell syntax (';', unquoted)"),
    ("SETUP", "echo 'open", "is not valid shell"), ("PYTHON", "python3 -u", "is not a program name or path"),
    ("SETUP", "set -e; false", "profile key setup failed on the login node"),
    ("CONTAINER", "no-such-launcher exec", "the container prefix 'no-such-launcher exec'"),
])
def test_the_prepare_command_exits_64_and_writes_no_job_env(tmp_path: Path, key: str, value: str, said: str) -> None:
    out = tmp_path / "job.env"
    proc = subprocess.run([sys.executable, str(JUBE_DIR / "jbprofile.py"), "prepare", "--benchmark", "llm",
                           "--run-id", "r", "--out", str(out)], env={**CLEAN_ENV, f"JOULEBENCH_LOCAL_{key}": value},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == jbprofile.EX_USAGE and said in proc.stderr, proc.stderr
    assert not out.exists()


def _job_settings(tmp_path: Path, setup: str, extra: dict[str, str]) -> Path:
    """The job.env prepare and submit write for the local system, with this setup."""
    settings = jbprofile.build_settings("llm", [], {}, "r", {**CLEAN_ENV, "JOULEBENCH_SETUP": setup, **extra})
    settings.update(JB_WORKDIR=str(tmp_path), JB_OUT_DIR=str(tmp_path / "run"), JB_DONE_FILE=str(tmp_path / "done"))
    path = tmp_path / "job.env"
    jbsettings.write_settings(path, settings)
    return path


def _in_job_and_in_tools(tmp_path: Path, setup: str, extra: dict[str, str] | None = None) -> tuple[str, str]:
    """What `setup` writes to $JB_MARK in job.sh and in the tools' profile shell. It ends with `exit 0`, which stops
    both before anything else runs, the same way: a FAILED job with job.done, and the tools' SETUP_FAILED exit."""
    path = _job_settings(tmp_path, setup + "\nexit 0", extra or {})
    marks = (tmp_path / "job.mark", tmp_path / "tools.mark")
    env = {**os.environ, "JB_MARK": str(marks[0])}
    job = subprocess.run(["bash", str(JUBE_DIR / "job.sh"), str(path)], env=env, timeout=60)
    settings = jbsettings.read_settings(path)
    tools = subprocess.run(jbsettings.in_profile_shell(settings["JB_SETUP"], ["true"]),
                           env={**env, "JB_MARK": str(marks[1])}, timeout=60)
    assert (job.returncode, tools.returncode) == (1, jbsettings.SETUP_FAILED)
    assert (tmp_path / "done").exists() and "JB status=FAILED" in (tmp_path / "result.txt").read_text()
    return marks[0].read_text(), marks[1].read_text()


@pytest.mark.parametrize(("setup", "written"), [
    ('echo one > "$JB_MARK"; echo two >> "$JB_MARK"', "one\ntwo\n"),
    ('echo "sub $(echo shell)" > "$JB_MARK"', "sub shell\n"),
    ('echo "tick `echo shell`" > "$JB_MARK"', "tick shell\n"),
    ('echo pipe | tr a-z A-Z > "$JB_MARK"', "PIPE\n"),
    ('echo first > "$JB_MARK"\necho second >> "$JB_MARK"', "first\nsecond\n"),
    ('source /dev/null && echo "unset:${JB_NOT_SET_ANYWHERE}." > "$JB_MARK"', "unset:.\n"),  # bash; not `set -u`
])
def test_setup_lines_do_the_same_in_the_job_and_in_the_tools(tmp_path: Path, setup: str, written: str) -> None:
    assert _in_job_and_in_tools(tmp_path, setup) == (written, written)


def test_word_lists_are_the_same_words_in_the_job_and_in_the_tools(tmp_path: Path) -> None:
    """Quotes group words and are removed in both (job.sh used to split on spaces and keep the quotes)."""
    values = {"container": """env 'A=x y' B="z;w" it\\'s '$HOME'""", "srun_args": "--comment='a | b' --exclude=n[1-2]"}
    extra = {f"JOULEBENCH_LOCAL_{key.upper()}": value for key, value in values.items()}
    in_job, in_tools = _in_job_and_in_tools(
        tmp_path, 'printf "%s\\n" "${container[@]}" "${srun_args[@]}" > "$JB_MARK"', extra)
    settings = jbsettings.read_settings(tmp_path / "job.env")
    words = [*shlex.split(settings["JB_CONTAINER"]), *shlex.split(settings["JB_SRUN_ARGS"])]
    assert words == ["env", "A=x y", "B=z;w", "it's", "$HOME", "--comment=a | b", "--exclude=n[1-2]"]
    assert in_job == "".join(f"{word}\n" for word in words) and in_tools == "\n"  # the tools have no such arrays


@pytest.mark.parametrize(("setup", "reason"), [
    ("exit 0", "profile setup lines ended the job script"),
    ("set -e; false", "profile setup lines ended the job script"),
    ("false", "profile setup lines failed (exit 1)"),
])
def test_setup_that_fails_or_ends_the_job_script_leaves_a_failed_row_and_job_done(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, setup: str, reason: str
) -> None:
    """The local launcher's submit step runs the real job.sh: its EXIT trap is in place before setup runs."""
    path = _job_settings(tmp_path, setup, {})
    (tmp_path / "submit").mkdir()
    monkeypatch.chdir(tmp_path / "submit")
    assert jbprofile.main(["submit", "--settings", str(path)]) == 0
    result = dict(line[3:].split("=", 1) for line in (tmp_path / "submit" / "result.txt").read_text().splitlines())
    assert result["status"] == "FAILED" and result["status_reason"].startswith(reason), result
    assert (tmp_path / "submit" / "job.done").exists()


@requires_slurm
def test_a_refused_finalizer_cancels_the_held_job_and_leaves_a_failed_row(
    slurm_cluster: Path, jube_env: dict[str, str], tmp_path: Path
) -> None:
    """The job is queued held; sbatch refuses its finalizer (a site setting): the job never starts, the row is FAILED
    with sbatch's words and job.done exists, so `jube continue` does not wait for a job that runs unrecorded."""
    env = {**jube_env, "SLURM_CONF": str(slurm_cluster),
           "JOULEBENCH_FINALIZER_SBATCH_ARGS": "--constraint=no-such-feature"}
    out = tmp_path / "finalizer"
    jube_run(LLM_XML, ["CI", "tiny"], out, env)
    (workdir,) = submit_workdirs(out)
    assert (workdir / "job.done").exists() and (workdir / "job.id").exists()  # written at once: cancel by hand
    (row,) = continue_and_read(out, "llm", env)[1]
    assert row["Status"] == "FAILED" and "sbatch refused its finalizer job" in row["Note"], row
    assert "Invalid feature specification" in row["Note"] and "cancelled before it started" in row["Note"], row
    assert not (workdir / "job.out").exists()  # the benchmark job never ran


@pytest.mark.parametrize(("content", "said"), [
    (None, "cannot be read (No such file or directory)"),
    ('<jube><selection><tag>A100</tag></selec', "is not well-formed XML at line 1, column"),
    ("", "is not well-formed XML at line 1"),
])
def test_prepare_refuses_a_missing_or_truncated_run_configuration_naming_it(tmp_path: Path, capsys, content,
                                                                            said) -> None:
    config = tmp_path / "configuration.xml"
    if content is not None:
        config.write_text(content)
    code = jbprofile.main(["prepare", "--benchmark", "llm", "--config", str(config), "--run-id", "r",
                           "--out", str(tmp_path / "job.env")])
    err = capsys.readouterr().err
    assert code == jbprofile.EX_USAGE and f"the run's configuration {config} {said}" in err and "Fix: " in err, err
    assert not (tmp_path / "job.env").exists()
