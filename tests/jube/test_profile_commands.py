"""Profile settings that become command lines (jube/jbshell.py): refused at prepare when broken, the same words and
lines in job.sh as in the Python tools when valid, and a submission that fails after sbatch still ends as a row."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.jube.conftest import JUBE_DIR, LLM_XML, continue_and_read, jube_run, requires_slurm, submit_workdirs
from tests.jube.test_profile import CLEAN_ENV, jbprofile

jbsettings = sys.modules["jbsettings"]  # loaded by jbprofile from jube/
jbshell = sys.modules["jbshell"]

# Every profile key whose value reaches a shell, shlex.split or an argv, by kind (what jbshell.py must cover).
COMMAND_KEYS = {
    "setup": jbshell.LINES, "python": jbshell.PROGRAM,
    **{key: jbshell.WORDS for key in ("container", "sbatch_args", "finalizer_sbatch_args", "srun_args")},
    **{f"server_{kind}{engine}": jbshell.WORDS for kind in ("", "version_")
       for engine in ("transformers", "vllm", "sglang", "tgi")},
}
BASE = {"setup": "echo ready", "python": "/usr/bin/python3", "server_": "{python} -m server --port {port}"}
HOSTILE = {  # appended to a valid value of each key
    "unbalanced quote": ' "unclosed', "semicolon": "; echo b", "command substitution": " $(hostname)",
    "backticks": " `hostname`", "pipe": " | tee b", "newline": "\n--second-line",
}


def _valid(key: str) -> str:
    return next((value for prefix, value in BASE.items() if key.startswith(prefix)), "--opt=a")


def test_the_checked_keys_are_every_command_line_forming_key() -> None:
    assert jbshell.command_keys(jbprofile.load_profile("CI", CLEAN_ENV)) == COMMAND_KEYS


@pytest.mark.parametrize("case", HOSTILE)
@pytest.mark.parametrize("key", COMMAND_KEYS)
def test_hostile_values_are_refused_at_prepare_naming_key_value_and_fix(key: str, case: str) -> None:
    """Refused before anything runs (ConfigError: the validate step stops), except setup's shell syntax, which bash
    runs alike in the job and in the tools (next test)."""
    value = _valid(key) + HOSTILE[case]
    env = {**CLEAN_ENV, f"JOULEBENCH_LOCAL_{key.upper()}": value}
    if COMMAND_KEYS[key] == jbshell.LINES and case != "unbalanced quote":
        assert jbprofile.build_settings("llm", [], {}, "r", env)["JB_SETUP"] == value.strip()
        return
    with pytest.raises(jbprofile.ConfigError) as err:
        jbprofile.build_settings("llm", [], {}, "r", env)
    message = str(err.value)
    assert not isinstance(err.value, jbprofile.PointRefused)
    assert f"profile key {key} = {value.strip()!r}" in message, message
    assert "Fix: " in message and f"JOULEBENCH_LOCAL_{key.upper()}" in message.split("Fix: ")[1], message


def _job_settings(tmp_path: Path, setup: str, extra: dict[str, str]) -> Path:
    """The job.env prepare and submit write for the local system, with this setup."""
    settings = jbprofile.build_settings("llm", [], {}, "r", {**CLEAN_ENV, "JOULEBENCH_SETUP": setup, **extra})
    settings.update(JB_WORKDIR=str(tmp_path), JB_OUT_DIR=str(tmp_path / "run"), JB_DONE_FILE=str(tmp_path / "done"))
    path = tmp_path / "job.env"
    jbsettings.write_settings(path, settings)
    return path


def _in_job_and_in_tools(tmp_path: Path, setup: str, extra: dict[str, str] | None = None) -> tuple[str, str]:
    """What `setup` writes to $JB_MARK in job.sh (it exits there, before launching anything) and in the tools'
    profile shell."""
    path = _job_settings(tmp_path, setup + "\nexit 0", extra or {})
    marks = (tmp_path / "job.mark", tmp_path / "tools.mark")
    env = {**os.environ, "JB_MARK": str(marks[0])}
    subprocess.run(["bash", str(JUBE_DIR / "job.sh"), str(path)], env=env, check=True, timeout=60)
    settings = jbsettings.read_settings(path)
    subprocess.run(jbsettings.in_profile_shell(settings, ["true"]), env={**env, "JB_MARK": str(marks[1])},
                   check=True, timeout=60)
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
    assert (workdir / "job.done").exists() and not (workdir / "job.id").exists()
    (row,) = continue_and_read(out, "llm_csv", env)[1]
    assert row["Status"] == "FAILED" and "sbatch refused its finalizer job" in row["Note"], row
    assert "Invalid feature specification" in row["Note"] and "cancelled before it started" in row["Note"], row
    assert not (workdir / "job.out").exists()  # the benchmark job never ran
