"""A site's first day (issue 62 item 7), the parts a CPU shows: the finalizer takes the job's reservation, QOS and
account; recommend's target and the apply line's tags are recorded at `jube run`; the apply line names its tags;
a GPU profile's job runs on the GPU or fails naming it. The Slurm end of each (a reservation reaching the finalizer,
the step at `jube continue`, the apply line run as printed) is the local Slurm cluster's test."""

from __future__ import annotations

import argparse
import json
import re
import shlex
import sys
from pathlib import Path

import pytest

from joulebench.analysis.knobs import apply_lines, knobs_of
from joulebench.record import RunRecord, write_run_record
from jpwr import Window
from tests.jube.test_profile import _fake_tool, jbprofile

jbsettings = sys.modules["jbsettings"]
jbsubmit = sys.modules["jbsubmit"]
import jbrecommend  # noqa: E402 (jube/ is on sys.path once jbprofile is loaded)

from tests.jube.test_record_fields import jbrecord  # noqa: E402


def _slurm_point(tmp_path: Path, tags: list[str], **profile: str) -> dict[str, str]:
    """A point of the CI system as prepare writes it, with the profile keys given (their override variables)."""
    env = {**_fake_tool(tmp_path, "sbatch", ""), **{f"JOULEBENCH_CI_{k.upper()}": v for k, v in profile.items()}}
    env.update(JOULEBENCH_RECOMMEND="--max-slowdown 5%", JOULEBENCH_RECOMMEND_REPEATS="3")
    settings = jbprofile.build_settings("llm", ["CI", *tags], {}, "r", env)
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    settings.update(JB_WORKDIR=str(work), JB_OUT_DIR=str(work / "run"), JB_DONE_FILE=str(work / "job.done"))
    return settings


def test_the_finalizer_takes_the_job_s_reservation_qos_and_account(tmp_path):
    settings = _slurm_point(tmp_path, [], sbatch_args="--reservation=maint --qos normal -A proj --constraint=gpu -qlow")
    argv = jbsubmit.finalizer_command(settings, Path(settings["JB_WORKDIR"]) / "job.env", "101")
    options = argv[:argv.index("--wrap")]
    assert "--reservation=maint" in options and "-A" in options and options[options.index("-A") + 1] == "proj"
    assert options[options.index("--qos") + 1] == "normal" and "-qlow" in options
    assert "--constraint=gpu" not in options  # the job's node choice is not the finalizer's
    own = _slurm_point(tmp_path, [], sbatch_args="--qos=normal", finalizer_sbatch_args="--qos=cheap")
    argv = jbsubmit.finalizer_command(own, Path(own["JB_WORKDIR"]) / "job.env", "101")
    assert argv.index("--qos=normal") < argv.index("--qos=cheap")  # the finalizer's own last: sbatch takes it


def test_the_recommend_target_and_the_tags_are_recorded_at_jube_run(tmp_path, capsys):
    settings = _slurm_point(tmp_path, ["tiny"])
    assert settings["JB_RECOMMEND"] == "--max-slowdown 5%" and settings["JB_TAGS"].split() == ["CI", "tiny"]
    assert settings["JB_RECOMMEND_REPEATS"] == "3"
    rundir = tmp_path / "rundir"
    (rundir / "000001_submit" / "work").mkdir(parents=True)
    jbsettings.write_settings(rundir / "000001_submit" / "work" / "job.env", settings)
    target = ("JB_RECOMMEND", "JOULEBENCH_RECOMMEND")
    assert jbrecommend.step_value("", rundir, *target) == "--max-slowdown 5%"  # `jube continue` without it
    assert jbrecommend.step_value("--max-slowdown 9%", rundir, *target) == "--max-slowdown 9%"
    assert "RECOMMEND='--max-slowdown 9%' now, '--max-slowdown 5%' at `jube run`: the one now counts" \
        in capsys.readouterr().out
    repeats = ("JB_RECOMMEND_REPEATS", "JOULEBENCH_RECOMMEND_REPEATS")
    assert jbrecommend.repeats_count(jbrecommend.step_value("", rundir, *repeats)) == 3  # as for the target
    assert jbrecommend.repeats_count(jbrecommend.step_value("4", rundir, *repeats)) == 4
    assert "JOULEBENCH_RECOMMEND_REPEATS='4' now, '3' at `jube run`" in capsys.readouterr().out
    assert jbrecommend.repeats_count(" 3 ") == 3  # spaces around the number, at the step as at `jube run`
    facts = jbrecord.job_facts(settings, "OK", 1.0)
    assert facts["tags"] == ["CI", "tiny"]  # the record carries them to recommend's apply line


def test_the_apply_line_names_the_jube_run_s_tags(tmp_path):
    base = tuple((knob.key, knob.default or "1") for knob in knobs_of("llm_training"))
    chosen = tuple((key, "4" if key == "micro_batch_size" else value) for key, value in base)
    lines = apply_lines("llm_training", base, chosen, "tiny", ("CI", "tiny"))
    jube = next(line for line in lines if line.startswith("apply (JUBE): "))
    words = shlex.split(jube.removeprefix("apply (JUBE): "))
    assert words[0].startswith("JOULEBENCH_SWEEP_") and words[1:4] == ["jube", "run", "jube/llm_benchmark.xml"]
    assert words[4:] == ["--tag", "CI", "tiny"]  # JUBE read a bare word after the file as another file
    assert "--tag tiny" in next(line for line in apply_lines("llm_training", base, chosen, "tiny")
                                if line.startswith("apply (JUBE)"))  # a record from elsewhere: the model's tag
    path = write_run_record(tmp_path / "r" / "run_record.json", RunRecord(benchmark="llm_training", run_id="r",
                                                                          job={"tags": ["CI", "tiny"]}))
    assert json.loads(path.read_text())["job"]["tags"] == ["CI", "tiny"]


def test_a_gpu_profile_s_job_runs_on_the_gpu_not_silently_on_the_cpus(tmp_path):
    """`driver_device = auto` on a Slurm GPU system: validate and run both get --device cuda, so a job on nodes
    without a visible GPU fails naming it (it ran on the CPUs and read OK); a CPU profile's stays the CPU."""
    env = {**_fake_tool(tmp_path, "sbatch", ""), "JOULEBENCH_CI_VENDOR": "nvidia",
           "JOULEBENCH_CI_DRIVER_DEVICE": "auto"}
    gpu = jbprofile.build_settings("inference", ["CI"], {}, "r", env)
    for key in ("JB_TRAIN_ARGS", "JB_VALIDATE_ARGS"):
        words = shlex.split(gpu[key])
        assert words[words.index("--device") + 1] == "cuda", key
    cpu = jbprofile.build_settings("inference", ["CI"], {}, "r", _fake_tool(tmp_path, "sbatch", ""))
    words = shlex.split(cpu["JB_TRAIN_ARGS"])
    assert words[words.index("--device") + 1] == "cpu"


@pytest.mark.parametrize(("variable", "value", "said"), [
    ("JOULEBENCH_RECOMMEND_REPEATS", "1", "JOULEBENCH_RECOMMEND_REPEATS='1' is not a whole number from 2 to 100."),
    ("JOULEBENCH_RECOMMEND_REPEATS", "two", "JOULEBENCH_RECOMMEND_REPEATS='two' is not a whole number from 2 to 100"),
    ("JOULEBENCH_RECOMMEND", "--default 'batch_size=1", "(JOULEBENCH_RECOMMEND) cannot be split into options"),
])
def test_a_recommend_setting_the_step_could_not_use_stops_jube_run_before_submission(tmp_path, capsys, variable, value,
                                                                                    said):
    """Checked where it is recorded, at `jube run` (the validate step), not found at `jube continue` once the sweep
    ran; the same value given only at the step is said there in one line and the workflow is not failed."""
    env = {**_fake_tool(tmp_path, "sbatch", ""), variable: value}
    with pytest.raises(jbsettings.ConfigError, match=re.escape(said)) as refused:
        jbprofile.build_settings("inference", ["CI"], {}, "r", env)
    assert "Fix: " in str(refused.value)
    given = {"target": "--max-slowdown 5%", "repeats": "", "rundir": str(tmp_path)}
    given["target" if variable == "JOULEBENCH_RECOMMEND" else "repeats"] = value
    assert jbrecommend.cmd_recommend(argparse.Namespace(**given)) == 0
    (line,) = capsys.readouterr().out.splitlines()
    assert line.startswith("jbprofile: recommend: ") and said in line and ". Fix: " in line


def test_a_recorded_target_runs_the_step_without_the_variable(tmp_path, capsys):
    """The step with an empty target at `jube continue` reads the one `jube run` recorded (here a point without a
    record: it says that no point left one, not that there is no target)."""
    settings = _slurm_point(tmp_path, [])
    rundir = tmp_path / "rundir"
    (rundir / "000001_submit" / "work").mkdir(parents=True)
    jbsettings.write_settings(rundir / "000001_submit" / "work" / "job.env", settings)
    assert jbrecommend.cmd_recommend(argparse.Namespace(target="", rundir=str(rundir), repeats="")) == 0
    out = capsys.readouterr().out
    assert "no point left a run record" in out and "no target" not in out


def test_a_serving_row_s_n_a_requests_per_s_says_why():
    """A load whose steady window was measured but in which no counted request finished (a server slower than its
    window): the row's note names why requests/s is n/a, as it does for J/request."""
    from tests.jube.test_shipped_tables import point_settings

    metrics = {"work_unit": "output_tokens", "duration_s": 2.5, "rate": 4.0, "requests_per_s": None,
               "requests_served_in_window": 0, "requests_counted": 8}
    window = Window("steady", 0, 3, 10**9, 10**9 + 2_500_000_000, {"output_tokens": 40.0})
    record = RunRecord(benchmark="llm_inference", run_id="r", status="OK", metrics=metrics,  # type: ignore[arg-type]
                       requests={"count": 8}, windows=[window])  # type: ignore[arg-type]
    note = jbrecord.table_fields(record, point_settings("llm_inference"))["note"]
    assert "requests/s n/a: none of the 8 counted requests finished inside the 2.5 s steady window" in note
    metrics.update(requests_served_in_window=None)
    note = jbrecord.table_fields(record, point_settings("llm_inference"))["note"]
    assert "requests/s n/a: the load kept no request table" in note
    metrics.update(requests_per_s=3.2)
    assert "requests/s n/a" not in jbrecord.table_fields(record, point_settings("llm_inference"))["note"]
