"""End to end: real JUBE 2.5.1 submits real jobs to the local Slurm cluster; the drivers really train.

Each test: `jube run` (validate + sbatch; returns at once) -> the jobs finish -> one `jube continue -a -r`
-> the CSV table JUBE wrote. Tiny models, few iterations, 2 CPU ranks on 2 nodes.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.jube.conftest import (
    LLM_XML,
    RESNET_XML,
    continue_and_read,
    is_number,
    jube,
    jube_run,
    read_table,
    requires_slurm,
    submit_workdirs,
    wait_for_jobs,
    with_fake_nvml,
)
from tests.jube.test_static import assert_patterns_match

pytestmark = requires_slurm
ENERGY_COLUMNS = ("Energy(Wh)", "Power/device(W)", "Energy method", "Coverage", "Error bound(J)")


def _cluster_env(jube_env: dict[str, str], slurm_conf: Path) -> dict[str, str]:
    return {**jube_env, "SLURM_CONF": str(slurm_conf)}


def test_llm_tiny_sweep_on_two_nodes_with_fake_nvml_energy(
    slurm_cluster: Path, jube_env: dict[str, str], tmp_path: Path
) -> None:
    """A global-batch sweep (two jobs side by side, each on its own fake GPU of both nodes); the sampler and
    the ranks import the fake pynvml replaying the H100 trace, so Wh and tokens/Wh reach the JUBE table."""
    env = {**with_fake_nvml(_cluster_env(jube_env, slurm_cluster)), "JOULEBENCH_SWEEP_GLOBAL_BATCH_SIZE": "4,8"}
    out = tmp_path / "llm"
    run = jube_run(LLM_XML, ["CI", "tiny"], out, env)
    jobs = submit_workdirs(out)
    assert len(jobs) == 2 and all("Submitted batch job" in (j / "stdout").read_text() for j in jobs), run.stdout
    wait_for_jobs(out)
    printed, rows = continue_and_read(out, "llm_csv", env)
    assert sorted(row["GBS"] for row in rows) == ["4", "8"]
    for row in rows:
        assert row["JobID"] in printed and row["Status"] == "OK", row
        layout = (row["System"], row["Nodes"], row["Devices"], row["Model"], row["TP/PP/DP"])
        assert layout == ("CI", "2", "2", "tiny", "1/1/2")
        assert float(row["Tokens/s"]) > 0 and is_number(row["Tokens/s/device"]) and is_number(row["Time/iteration(s)"])
        assert float(row["Energy(Wh)"]) > 0 and float(row["Tokens/Wh"]) > 0 and float(row["Power/device(W)"]) > 0
        assert row["Energy method"] in ("counter", "counter+power", "power")
        assert 0 < float(row["Coverage"]) <= 1 and is_number(row["Error bound(J)"])
        assert row["Note"] == "-"
    for job in jobs:
        assert (job / "run" / "run_record.json").exists()
        assert {p.name for p in (job / "run" / "energy").iterdir()} >= {"n1", "n2", "summary.json"}
        assert_patterns_match(LLM_XML, (job / "result.txt").read_text())


def test_resnet50_both_frameworks_on_two_nodes_without_sensors(
    slurm_cluster: Path, jube_env: dict[str, str], tmp_path: Path
) -> None:
    env = _cluster_env(jube_env, slurm_cluster)
    out = tmp_path / "resnet"
    jube_run(RESNET_XML, ["CI"], out, env)
    assert len(submit_workdirs(out)) == 2  # no framework tag: pytorch and tensorflow, one job each
    wait_for_jobs(out)
    _, rows = continue_and_read(out, "resnet50_csv", env)
    by_model = {row["Model"]: row for row in rows}
    assert set(by_model) == {"resnet50-pytorch", "resnet50-tensorflow"}
    for model, row in by_model.items():
        assert row["Status"] == "OK", (model, row)
        assert (row["Nodes"], row["Devices"]) == ("2", "2")
        assert float(row["Images/s"]) > 0 and float(row["Images/s/device"]) > 0
        # No power sensor on this machine: every energy column says n/a (never 0), the note says why.
        assert all(row[c] == "n/a" for c in (*ENERGY_COLUMNS, "Images/Wh")), row
        assert row["Note"].startswith("energy n/a: no accelerator sensors on node n1"), row
    for workdir in submit_workdirs(out):
        assert_patterns_match(RESNET_XML, (workdir / "result.txt").read_text())


def test_failed_and_timed_out_jobs_get_rows_and_keep_their_traces(
    slurm_cluster: Path, jube_env: dict[str, str], tmp_path: Path
) -> None:
    env = _cluster_env(jube_env, slurm_cluster)
    # Passes validate (no device touched there), fails in the ranks: CUDA asked for on CPU-only nodes.
    # The samplers ran and must keep their traces.
    failing = {**env, "JOULEBENCH_DRIVER_DEVICE": "cuda"}
    # A 1-minute limit with endless iterations: Slurm's USR1 (60 s before the limit) makes it a TIMEOUT.
    timing_out = {**env, "JOULEBENCH_TIME_LIMIT": "0:01:00", "JOULEBENCH_LLM_ITERATIONS": "1000000"}
    fail_out, timeout_out = tmp_path / "fail", tmp_path / "timeout"
    jube_run(LLM_XML, ["CI", "tiny"], fail_out, failing)
    jube_run(LLM_XML, ["CI", "tiny"], timeout_out, timing_out)
    wait_for_jobs(fail_out)
    wait_for_jobs(timeout_out, timeout_s=200)
    (failed,) = continue_and_read(fail_out, "llm_csv", env)[1]
    (timed_out,) = continue_and_read(timeout_out, "llm_csv", env)[1]
    assert failed["Status"] == "FAILED" and "ranks exited with code" in failed["Note"], failed
    assert timed_out["Status"] == "TIMEOUT" and "time limit" in timed_out["Note"], timed_out
    for row in (failed, timed_out):
        assert row["Energy(Wh)"] == "n/a" and row["Tokens/Wh"] == "n/a"
    for out in (fail_out, timeout_out):
        energy = submit_workdirs(out)[0] / "run" / "energy"
        assert (energy / "n1" / "trace.h5").exists() and (energy / "n2" / "trace.h5").exists()


def test_bad_configurations_stop_before_anything_is_submitted(
    slurm_cluster: Path, jube_env: dict[str, str], tmp_path: Path
) -> None:
    env = _cluster_env(jube_env, slurm_cluster)
    queue_before = _job_count(env)
    cases = {
        "two_systems": (["CI", "A100", "tiny"], {}, "2 system tags given"),
        "unknown_system": (["A1000"], {}, "unknown tag 'A1000'"),
        "gc200": (["GC200"], {}, "Poplar SDK"),
        "gbs_not_divisible": (["CI", "tiny"], {"JOULEBENCH_GBS_TINY": "3"}, "3"),
    }
    for name, (tags, extra, message) in cases.items():
        out = tmp_path / name
        jube_run(LLM_XML, tags, out, {**env, **extra})
        assert "ERROR" in jube("status", str(out), env=env).stdout, name
        assert not submit_workdirs(out), name
        stderr = next(out.glob("000000/*_validate/work/stderr")).read_text()
        assert message in stderr and "Fix:" in stderr, (name, stderr)
    assert _job_count(env) == queue_before


def test_four_node_shape_with_other_partition_names_through_the_environment(
    slurm_cluster_4: Path, jube_env: dict[str, str], tmp_path: Path
) -> None:
    """Same XML and profile; only SLURM_CONF, the partition and the node count come from the environment."""
    env = {**_cluster_env(jube_env, slurm_cluster_4), "JOULEBENCH_PARTITION": "booster", "JOULEBENCH_NODES": "4"}
    out = tmp_path / "four"
    jube_run(LLM_XML, ["CI", "tiny", "wait"], out, env)
    assert (submit_workdirs(out)[0] / "job.done").exists()  # `wait`: no jube continue needed
    jube("result", "-a", str(out), env=env)
    (row,) = read_table(out, "llm_csv")
    assert (row["Status"], row["Nodes"], row["Devices"], row["TP/PP/DP"]) == ("OK", "4", "4", "1/1/4"), row
    assert float(row["Tokens/s"]) > 0
    assert {p.name for p in (submit_workdirs(out)[0] / "run" / "energy").iterdir()} >= {"c1", "c2", "c3", "c4"}


def _job_count(env: dict[str, str]) -> int:
    """Jobs the controller knows (it keeps finished ones for MinJobAge, 300 s): a submission adds one."""
    shown = subprocess.run(["scontrol", "show", "jobs", "-o"], env=env, capture_output=True, text=True).stdout
    return len([line for line in shown.splitlines() if line.startswith("JobId=")])


def test_a_refused_submission_still_gets_a_failed_row(
    slurm_cluster: Path, jube_env: dict[str, str], tmp_path: Path
) -> None:
    """sbatch rejects an unknown partition: the submit step does not fail, the row says why."""
    env = {**_cluster_env(jube_env, slurm_cluster), "JOULEBENCH_PARTITION": "no-such-partition"}
    out = tmp_path / "refused"
    jube_run(LLM_XML, ["CI", "tiny"], out, env)
    _, rows = continue_and_read(out, "llm_csv", env)
    (row,) = rows
    assert row["Status"] == "FAILED" and "sbatch refused the job" in row["Note"], row
    assert "no-such-partition" in row["Note"], row
    assert row["JobID"] == "n/a" and row["Tokens/s"] == "n/a"
