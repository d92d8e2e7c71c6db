"""The workflows' recommend step (issue 46 item 4, issue 62 item 7): over a finished sweep, the cheapest setting that
meets a target, then that setting and the default re-run as jobs of the same workflow on the default point's node, and
the predicted saving set against the measured one; its apply line run as printed. Real JUBE 2.5.1, the local Slurm
cluster, the tiny model on the CPU, fake GPUs at pynvml replaying the H100 trace."""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import FAKES_DIR
from tests.jube.conftest import (
    JUBE_DIR,
    REPO,
    continue_and_read,
    jube,
    jube_run,
    requires_slurm,
    submit_workdirs,
    wait_for_jobs,
    with_fake_nvml,
)

sys.path.insert(0, str(JUBE_DIR))
import jbrecommend
import jbsubmit
from jbsettings import read_settings

INFERENCE_XML = JUBE_DIR / "inference_benchmark.xml"
# as a user may write it: one word for --min-coverage (the step passes the target as one --target=... argument);
# batch_size has no driver default, so the site's current value is named
TARGET = "--default batch_size=1 --min-coverage=0"
# on the fake only: the snippet stops before any set call unless the pynvml it imported is tests/fakes' (a machine
# with a real GPU and its NVML first on the path would otherwise have its power limit changed)
LOWEST_LIMIT = (f"import pynvml, sys; pynvml.__file__.startswith({str(FAKES_DIR)!r}) or sys.exit('not the fake NVML'); "
                "pynvml.nvmlInit(); [pynvml.nvmlDeviceSetPowerManagementLimit("
                "pynvml.nvmlDeviceGetHandleByIndex(i), 200_000) for i in range(pynvml.nvmlDeviceGetCount())]")


def _capped_gpus(env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    """The nodes' fake GPUs held at their lowest power limit (200 W), set before the sweep as a site sets it: the
    replayed H100 trace swings between 110 and 700 W by its own phases, whatever a job does, so that a job's prefill
    window could fall in its full-power phase and its steady window in an idle one (a negative decode split: batch 16
    left out); capped, the power stays within a factor of two and a window's energy follows its length."""
    env = {**env, "JPWR_FAKE_NVML_STATE": str(tmp_path / "gpus-{node}.json")}
    for node in ("n1", "n2"):
        subprocess.run([sys.executable, "-c", LOWEST_LIMIT], check=True, timeout=60,
                       env={**env, "JPWR_FAKE_NVML_PRIVILEGED": "1", "SLURMD_NODENAME": node})
    return env


def _records(rundir: Path) -> dict[str, dict]:
    return {p.parts[-4]: json.loads(p.read_text()) for p in sorted(rundir.glob("*_submit/work/run/run_record.json"))}


def _as_printed(line: str, root: Path, env: dict[str, str]) -> Path:
    """Run a printed command line as a user would, with bash from the repository root, except that the root is a
    folder whose jube/ links to the repository's files, so that JUBE's outpath (beside the XML file) lands in it;
    the run's outpath."""
    (root / "jube").mkdir(parents=True)
    for path in JUBE_DIR.iterdir():
        if path.is_file():
            (root / "jube" / path.name).symlink_to(path)
    subprocess.run(["bash", "-c", line], cwd=root, env=env, check=True, capture_output=True, text=True, timeout=600)
    return root / "jube" / "runs" / "inference"


def _apply_line(said: Path, step: subprocess.Popen[str]) -> str | None:
    """The step's `apply (JUBE)` line, as soon as it printed it (before its re-runs start); None where the step
    ended without one."""
    prefix = "apply (JUBE): "
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        ended = step.poll() is not None
        lines = said.read_text().splitlines() if said.is_file() else []
        found = [line.removeprefix(prefix) for line in lines if line.startswith(prefix)]
        if found or ended:
            return found[0] if found else None
        time.sleep(0.5)
    raise AssertionError(f"no apply line in {said} within 300 s")


@requires_slurm
def test_on_slurm_the_step_runs_at_jube_continue_with_the_target_jube_run_had_and_its_apply_line_runs_as_printed(
        slurm_cluster: Path, jube_env: dict[str, str], tmp_path: Path) -> None:
    env = _capped_gpus(with_fake_nvml({**jube_env, "SLURM_CONF": str(slurm_cluster)}), tmp_path)
    sweep = {"JOULEBENCH_SWEEP_BATCH_SIZE": "1,16", "JOULEBENCH_SWEEP_STEADY_SECONDS": "1"}
    # the target and the re-runs are set at `jube run` only, as docs/jube.md shows it: the step runs at `jube continue`
    at_run = {"JOULEBENCH_RECOMMEND": TARGET, "JOULEBENCH_RECOMMEND_REPEATS": " 2"}  # spaces as a user may type them
    jube_run(INFERENCE_XML, ["CI", "tiny"], tmp_path / "runs", {**env, **sweep, **at_run})
    wait_for_jobs(tmp_path / "runs")
    (rundir,) = (tmp_path / "runs").glob("000000")
    # A 2-core machine running the test suite disturbs the runs (their step times spread), and recommend leaves
    # disturbed runs out; the points' records are made those of an undisturbed machine, so that the step has a
    # recommendation to re-measure.
    points = _records(rundir)
    for name, record in points.items():
        record["disturbed"] = {**record.get("disturbed", {}), "disturbed": False, "reasons": []}
        (rundir / name / "work" / "run" / "run_record.json").write_text(json.dumps(record))
    assert not at_run.keys() & env.keys()
    recorded = [read_settings(w / "job.env") for w in submit_workdirs(tmp_path / "runs")]
    assert recorded and all((r["JB_RECOMMEND"], r["JB_RECOMMEND_REPEATS"]) == (TARGET, "2") for r in recorded)
    with open(tmp_path / "continue.out", "w") as log:
        step = subprocess.Popen(["jube", "continue", str(rundir.parent), "-a", "-r", "--hide-animation"], env=env,
                                cwd=REPO, stdout=log, stderr=subprocess.STDOUT, text=True)
    try:
        said_path = rundir / "recommend_all_points" / "stdout"  # the shared do's output
        line = _apply_line(said_path, step)
        # the apply line, exactly as the step printed it, run while the step re-measures (the suite's time)
        applied = _as_printed(line, tmp_path / "root", env) if line else None
        step.wait(timeout=600)
    finally:
        step.kill()
    continued = (tmp_path / "continue.out").read_text()
    assert step.returncode == 0 and "FINISHED" in jube("status", str(rundir.parent), env=env).stdout, continued

    said = said_path.read_text()
    out = rundir / "recommend"
    text = (out / "recommend.txt").read_text()
    assert "no target" not in said and f"{TARGET} --json " in text.splitlines()[0], said  # the one `jube run` had
    if not (out / "predicted.json").is_file() or json.loads((out / "predicted.json").read_text())["is_default"]:
        # the CPU runs of a loaded machine (the suite's own workers) can still leave a point out or measure batch 16
        # within the bounds of batch 1: then there is nothing to re-run
        pytest.skip("this machine's sweep gave no recommendation to re-run: " + said.strip()[-300:])
    predicted = json.loads((out / "predicted.json").read_text())
    assert predicted["default"]["setting"]["batch_size"] == "1" and not predicted["is_default"]
    chosen = predicted["recommended"]["setting"]["batch_size"]
    assert chosen == "16"  # the only other setting; sixteen sequences a step cost the tiny model far less per token
    assert line == "JOULEBENCH_SWEEP_BATCH_SIZE=16 jube run jube/inference_benchmark.xml --tag CI tiny"

    reruns = ["default-1", "recommended-1", "default-2", "recommended-2"]
    assert said.index("re-run 1 of the default") < said.index("re-run 1 of the recommended") \
        < said.index("re-run 2 of the default") < said.index("re-run 2 of the recommended")
    by_batch = {r["config"]["batch_size"]: r for r in points.values()}
    for name in reruns:
        settings = read_settings(out / name / "job.env")
        record = json.loads((out / name / "run" / "run_record.json").read_text())
        point = by_batch[1 if name.startswith("default") else 16]
        assert record["config"]["batch_size"] == point["config"]["batch_size"]
        assert record["run_id"] == settings["JB_RUN_ID"] == f"{point['run_id']}-{name}"  # its own, not the point's
        assert record["launch"]["node_name"] == by_batch[1]["launch"]["node_name"]  # sbatch --nodelist
        assert record["job"]["job_id"] == (out / name / "job.id").read_text().strip()  # a Slurm job of its own
    assert text.count("$ joulebench recommend") == 2 and "--remeasured" in text and "re-measured (" in text
    remeasured = json.loads((out / "remeasured.json").read_text())["remeasured"]
    # each re-run is counted on its side, or named with the reason it was left out (a loaded machine: disturbed)
    ids = {f"{by_batch[1 if name.startswith('default') else 16]['run_id']}-{name}" for name in reruns}
    counted = set(remeasured["default_runs"]) | set(remeasured["recommended_runs"])
    named = {i for i in ids for problem in remeasured["problems"] if problem.startswith(f"{i}: ")}
    assert counted | named == ids and not counted & named
    assert (remeasured["measured"] is None) == bool(remeasured["problems"])

    # The applied run: the recommended setting, the sweep's tags, OK.
    assert applied is not None
    wait_for_jobs(applied)
    (row,) = continue_and_read(applied, "inference", env)[1]
    (workdir,) = submit_workdirs(applied)
    record = json.loads((workdir / "run" / "run_record.json").read_text())
    assert (record["status"], record["config"]["batch_size"], row["Status"]) == ("OK", 16, "OK"), row
    assert record["job"]["tags"] == ["CI", "tiny"] and (workdir / "job.id").is_file()


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
