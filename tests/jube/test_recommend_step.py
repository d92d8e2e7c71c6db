"""The workflows' recommend step (issue 46 item 4): over a finished sweep, the cheapest setting that meets a target,
then that setting and the default re-run as jobs of the same workflow on the default point's node, and the predicted
saving set against the measured one. Real JUBE 2.5.1, the local launcher, the tiny model on the CPU, fake GPUs at
pynvml replaying the H100 trace."""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.jube.conftest import JUBE_DIR, jube_run, requires_jube, with_fake_nvml

sys.path.insert(0, str(JUBE_DIR))
import jbrecommend
import jbsubmit
from jbsettings import read_settings

INFERENCE_XML = JUBE_DIR / "inference_benchmark.xml"
TARGET = "--default batch_size=1 --min-coverage 0"


def _records(rundir: Path) -> dict[str, dict]:
    return {p.parts[-4]: json.loads(p.read_text()) for p in sorted(rundir.glob("*_submit/work/run/run_record.json"))}


@requires_jube
def test_the_recommend_step_reruns_default_and_recommendation_alternately_on_the_default_s_node(
        jube_env: dict[str, str], tmp_path: Path) -> None:
    env = with_fake_nvml(jube_env)
    # one word, as a user may write it: the step passes the target as one --target=... argument
    env.update(JOULEBENCH_SWEEP_BATCH_SIZE="1,16", JOULEBENCH_SWEEP_STEADY_SECONDS="3",
               JOULEBENCH_RECOMMEND="--min-coverage=0")
    jube_run(INFERENCE_XML, ["tiny"], tmp_path / "runs", env)  # exit 0: a refusal does not fail the workflow
    (rundir,) = (tmp_path / "runs").glob("000000")
    said = (rundir / "recommend_all_points" / "stdout").read_text()  # the shared do's output
    # refused and said, the workflow not failed: batch_size has no driver default (no --default given), unless the
    # loaded machine's runs were left out first (disturbed, or figures rejected), which recommend says before that
    assert "joulebench recommend: error: " in said and ". Fix: " in said
    assert "the sweep varies batch_size" in said or "left out: run " in said
    assert "--min-coverage=0" in (rundir / "recommend" / "recommend.txt").read_text()

    # A 2-core machine running the test suite disturbs every run (host load), and recommend leaves disturbed runs
    # out; the points' records are made those of an undisturbed machine, so that the step has a recommendation.
    points = _records(rundir)
    for name, record in points.items():
        record["disturbed"] = {**record.get("disturbed", {}), "disturbed": False, "reasons": []}
        (rundir / name / "work" / "run" / "run_record.json").write_text(json.dumps(record))
    step = subprocess.run([sys.executable, str(JUBE_DIR / "jbprofile.py"), "recommend", "--rundir", str(rundir),
                           "--target", TARGET], env=env, capture_output=True, text=True, timeout=600, check=True)
    out = rundir / "recommend"
    if not (out / "predicted.json").is_file() or json.loads((out / "predicted.json").read_text())["is_default"]:
        # the CPU runs of a loaded machine (the suite's own workers) can leave a point out (figures rejected: a
        # negative decode split) or measure batch 16 within the bounds of batch 1: then there is nothing to re-run
        pytest.skip("this machine's sweep gave no recommendation to re-run: " + step.stdout.strip()[-300:])
    predicted = json.loads((out / "predicted.json").read_text())
    assert predicted["default"]["setting"]["batch_size"] == "1" and not predicted["is_default"]
    chosen = predicted["recommended"]["setting"]["batch_size"]
    assert chosen == "16"  # the only other setting; sixteen sequences a step cost the tiny model far less per token

    reruns = ["default-1", "recommended-1", "default-2", "recommended-2"]
    assert step.stdout.index("re-run 1 of the default") < step.stdout.index("re-run 1 of the recommended") \
        < step.stdout.index("re-run 2 of the default") < step.stdout.index("re-run 2 of the recommended")
    by_batch = {r["config"]["batch_size"]: r for r in points.values()}
    for name in reruns:
        settings = read_settings(out / name / "job.env")
        record = json.loads((out / name / "run" / "run_record.json").read_text())
        point = by_batch[1 if name.startswith("default") else 16]
        assert record["config"]["batch_size"] == point["config"]["batch_size"]
        assert record["run_id"] == settings["JB_RUN_ID"] == f"{point['run_id']}-{name}"  # its own, not the point's
        assert record["launch"]["node_name"] == by_batch[1]["launch"]["node_name"]
    text = (out / "recommend.txt").read_text()
    assert text.count("$ joulebench recommend") == 2 and "--remeasured" in text and "re-measured (" in text
    remeasured = json.loads((out / "remeasured.json").read_text())["remeasured"]
    # each re-run is counted on its side, or named with the reason it was left out (a loaded machine: disturbed)
    ids = {f"{by_batch[1 if name.startswith('default') else 16]['run_id']}-{name}" for name in reruns}
    counted = set(remeasured["default_runs"]) | set(remeasured["recommended_runs"])
    named = {i for i in ids for problem in remeasured["problems"] if problem.startswith(f"{i}: ")}
    assert counted | named == ids and not counted & named
    assert (remeasured["measured"] is None) == bool(remeasured["problems"])


def test_without_a_target_the_step_does_nothing(tmp_path: Path, capsys) -> None:
    assert jbrecommend.cmd_recommend(argparse.Namespace(target="", rundir=str(tmp_path), repeats="")) == 0
    assert "no target (JOULEBENCH_RECOMMEND was empty at `jube run` and is now): nothing" in capsys.readouterr().out
    assert not (tmp_path / "recommend").exists()


def test_a_slurm_rerun_is_pinned_to_the_default_point_s_node_with_its_own_run_id() -> None:
    point = {"JB_LAUNCHER": "slurm", "JB_RUN_ID": "inference-000001-000002", "JB_SBATCH_ARGS": "--qos=normal",
             "JB_TRAIN_ARGS": "--preset tiny --batch-size 4 --run-id inference-000001-000002"}
    again = jbrecommend.rerun_settings(point, "inference-000001-000002-recommended-1", "n2")
    assert again["JB_SBATCH_ARGS"] == "--qos=normal --nodelist=n2"
    assert shlex.split(again["JB_TRAIN_ARGS"])[-1] == again["JB_RUN_ID"] == "inference-000001-000002-recommended-1"
    settings = {**again, "JB_WORKDIR": "/w", "JB_MODEL": "tiny", "JB_NODES": "1", "JB_TASKS_PER_NODE": "1",
                "JB_TIME_LIMIT": "0:10:00", "JB_STOP_MARGIN_S": "60", "JB_GRES": "yes", "JB_CPUS_PER_TASK": "",
                "JB_PARTITION": "", "JB_ACCOUNT": ""}
    assert "--nodelist=n2" in jbsubmit.sbatch_command(settings, Path("/w/job.env"))
    local = jbrecommend.rerun_settings({**point, "JB_LAUNCHER": "local"}, "r-default-1", "vm")
    assert local["JB_SBATCH_ARGS"] == "--qos=normal"  # the local launcher runs on this machine anyway
