"""End to end: real JUBE 2.5.1 submits real jobs to the local Slurm cluster; the drivers really train.

Each test: `jube run` (validate + sbatch; returns at once) -> the jobs finish -> one `jube continue -a -r`
-> the full table the compare step wrote. Tiny models, few iterations, CPU ranks. The jobs of one test run side by side
where the cluster has room (2 nodes x 2 fake GPUs), since a 1-minute limit makes a job last over a minute.
"""

from __future__ import annotations

import getpass
import json
import re
import subprocess
import time
from pathlib import Path

from tests.jube.conftest import (
    LLM_XML,
    RESNET_XML,
    continue_and_read,
    default_table,
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
SLURM_STATE = {"OK": "COMPLETED", "FAILED": "FAILED", "TIMEOUT": "TIMEOUT", "CANCELLED": "CANCELLED"}  # docs/jube.md
ENERGY_COLUMNS = ("Energy(Wh)", "Power/device(W)", "Energy method", "Coverage %", "Error bound(J)")


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
    printed, rows = continue_and_read(out, "llm", env)
    assert [row["GBS"] for row in rows] == ["4", "8"]  # the sweep's order
    records = {(job / "job.id").read_text().strip(): json.loads((job / "run" / "run_record.json").read_text())
               for job in jobs}
    for row in rows:
        assert row["JobID"] in printed and row["Status"] == "OK", row
        layout = (row["System"], row["Nodes"], row["Devices"], row["Model"], row["TP/PP/DP"], row["Precision"])
        assert layout == ("CI", "2", "2", "tiny", "1/1/2", "fp32")
        assert row["MBS"] == "2" and row["Seq length"] == "64"  # the driver's defaults, from its record
        assert float(row["Tokens/s"]) > 0 and is_number(row["Tokens/s/device"]) and is_number(row["Time/iteration(s)"])
        assert float(row["Energy(Wh)"]) > 0 and float(row["Tokens/Wh"]) > 0 and float(row["Power/device(W)"]) > 0
        assert row["Energy method"] in ("counter", "counter+power", "power")
        assert 0 < float(row["Coverage %"]) <= 100 and is_number(row["Error bound(J)"])
        assert row["Note"] == _as_note(records[row["JobID"]]["warnings"]), row  # every warning of the run
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
    wait_for_jobs(out, timeout_s=400)  # TensorFlow's start-up is slow on two busy cores
    _, rows = continue_and_read(out, "resnet50", env)
    by_model = {row["Model"]: row for row in rows}
    assert set(by_model) == {"resnet50-pytorch", "resnet50-tensorflow"}
    for model, row in by_model.items():
        assert row["Status"] == "OK", (model, row)
        assert (row["Nodes"], row["Devices"], row["Image px"], row["Framework"]) == ("2", "2", "64", model[9:])
        assert float(row["Images/s"]) > 0 and float(row["Images/s/device"]) > 0
        # No power sensor on this machine: every energy column says n/a (never 0), the note says why.
        assert all(row[c] == "n/a" for c in (*ENERGY_COLUMNS, "Images/Wh")), row
        assert "energy n/a: no energy sensor readable on node n1" in row["Note"], row  # after "disturbed: ..." if busy
    for workdir in submit_workdirs(out):
        assert_patterns_match(RESNET_XML, (workdir / "result.txt").read_text())


def _slurm_state(job_id: str, env: dict[str, str], timeout_s: float = 150.0) -> str:
    """Slurm's final state of a job (scontrol: the controller keeps ended jobs for MinJobAge, 300 s)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        shown = subprocess.run(["scontrol", "show", "job", "-o", job_id], env=env, capture_output=True, text=True)
        state = dict(f.split("=", 1) for f in shown.stdout.split() if "=" in f).get("JobState", "")
        if state not in ("", "PENDING", "RUNNING", "COMPLETING", "CONFIGURING"):
            return state
        time.sleep(1.0)
    raise AssertionError(f"job {job_id} still in the queue after {timeout_s} s")


def _wait_for_text(path: Path, text: str, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not (path.exists() and text in path.read_text()):
        assert time.monotonic() < deadline, f"{text!r} did not appear in {path} within {timeout_s} s"
        time.sleep(0.5)


def _as_note(texts: list[str]) -> str:
    """Texts as the table's Note holds them: joined by `; `, one line, no commas (jbrecord.render's lines)."""
    return " ".join("; ".join(texts).split()).replace(",", ";") or "-"


def _finished_line(workdir: Path) -> str:
    """The status in the job log's last joulebench line, "finished: status X": the job script's, or the finalizer
    job's where Slurm killed the script before it could write it (or the job never started)."""
    err = workdir / "job.err"
    _wait_for_text(err, "finished: status ")
    lines = [line for line in err.read_text().splitlines() if line.startswith("joulebench-job:")]
    assert "finished: status " in lines[-1], lines[-3:]
    return lines[-1].split("finished: status ")[1].split()[0]


def test_slurm_the_job_log_the_record_and_the_table_agree_in_every_state(
    slurm_cluster: Path, jube_env: dict[str, str], tmp_path: Path
) -> None:
    """Five one-node jobs at once. OK: a short job ends under a 5-minute limit (its set-up beside four others on a
    loaded 2-core machine). FAILED: a GPU profile's job on CPU
    nodes (its `auto` device is the profile's GPU: passes validate, fails in the ranks). TIMEOUT: endless iterations
    under a 1-minute limit, stopped by the job's own timer after at least 40 s and held until Slurm's limit. CANCELLED
    twice: scancel while it trains (the job records itself) and while it waits to start (its finalizer job records
    it)."""
    env = {**_cluster_env(jube_env, slurm_cluster), "JOULEBENCH_NODES": "1"}
    endless = {"JOULEBENCH_LLM_ITERATIONS": "1000000"}
    cases = {
        "OK": {"JOULEBENCH_TIME_LIMIT": "0:05:00"},
        # a GPU system's profile (device auto) whose job lands on CPU nodes: FAILED naming it, never OK on the CPUs
        "FAILED": {"JOULEBENCH_VENDOR": "nvidia", "JOULEBENCH_DRIVER_DEVICE": "auto",
                   "JOULEBENCH_SWEEP_GLOBAL_BATCH_SIZE": "4"},
        "TIMEOUT": {"JOULEBENCH_TIME_LIMIT": "0:01:00", **endless},
        "CANCELLED": endless,
        "CANCELLED_PENDING": {"JOULEBENCH_SBATCH_ARGS": "--begin=now+3600"},
    }
    outs = {name: tmp_path / name.lower() for name in cases}
    for name, extra in cases.items():
        jube_run(LLM_XML, ["CI", "tiny"], outs[name], {**env, **extra})
    work = {name: submit_workdirs(out)[0] for name, out in outs.items()}
    job_ids = {name: (w / "job.id").read_text().strip() for name, w in work.items()}
    # A half-finished run's table names the points still to come: queued (PENDING) and running (RUNNING) rows (the
    # full table comes once every point has its row).
    shown = jube("result", "-a", str(outs["CANCELLED_PENDING"]), env=env).stdout
    (queued,) = default_table(shown, "llm")
    assert (queued["Status"], queued["JobID"]) == ("PENDING", job_ids["CANCELLED_PENDING"]), queued
    assert "jube continue once it ended" in queued["Reason"]
    assert not (outs["CANCELLED_PENDING"] / "000000" / "result" / "llm.csv").exists()
    subprocess.run(["scancel", job_ids["CANCELLED_PENDING"]], env=env, check=True)
    _wait_for_text(work["CANCELLED"] / "job.out", "[llm_training] step ")  # cancel it while it trains
    (running,) = default_table(jube("result", "-a", str(outs["CANCELLED"]), env=env).stdout, "llm")
    assert (running["Status"], running["JobID"]) == ("RUNNING", job_ids["CANCELLED"]), running
    subprocess.run(["scancel", job_ids["CANCELLED"]], env=env, check=True)
    for out in outs.values():
        wait_for_jobs(out, timeout_s=200)
    for name, out in outs.items():
        expected = name.split("_")[0]
        (row,) = continue_and_read(out, "llm", env)[1]
        record = json.loads((work[name] / "run" / "run_record.json").read_text())
        state = _slurm_state(job_ids[name], env)
        assert (state, record["status"], row["Status"]) == (SLURM_STATE[expected], expected, expected), (name, row)
        assert row["JobID"] == job_ids[name] == record["job"]["job_id"], name
        assert _finished_line(work[name]) == expected, name
        assert_patterns_match(LLM_XML, (work[name] / "result.txt").read_text())
    ok, timeout = (json.loads((work[n] / "run" / "run_record.json").read_text()) for n in ("OK", "TIMEOUT"))
    assert ok["job"]["time_limit_s"] == 300
    assert timeout["job"]["elapsed_s"] >= 40 and timeout["job"]["stop_budget_s"] == 50
    # the job's own timer and Slurm's warning (USR1 at the same margin; Slurm may send it early) both stop the run at
    # its deadline: whichever the job heard first is named, and either way the driver stopped cleanly
    reason = timeout["status_reason"]
    assert ("stop budget reached" in reason or reason.startswith("Slurm's time-limit warning after")), reason
    assert "stopped cleanly" in reason, reason
    assert any(w["name"] == "steady" and w["steps"] > 0 for w in timeout["windows"])  # a readable measurement
    assert (work["TIMEOUT"] / "run" / "energy" / "n1" / "trace.h5").exists() or \
        (work["TIMEOUT"] / "run" / "energy" / "n2" / "trace.h5").exists()
    (failed,) = read_table(outs["FAILED"], "llm")  # the driver's own words, not only an exit code
    assert failed["GBS"] == "4" and re.match(r"rank 0 on n[12] exited with code 64: llm_training: error: --device "
                                             "cuda but no CUDA/ROCm device is visible. Fix: ", failed["Note"]), failed
    pending = json.loads((work["CANCELLED_PENDING"] / "run" / "run_record.json").read_text())
    assert "recorded by its finalizer job" in pending["status_reason"]


def test_bad_configurations_stop_before_anything_is_submitted(
    slurm_cluster: Path, jube_env: dict[str, str], tmp_path: Path
) -> None:
    """Mistakes of the whole workflow stop the validate step; a point that cannot run gets an INVALID row.
    Either way no job reaches Slurm and `jube status` says ERROR."""
    env = _cluster_env(jube_env, slurm_cluster)
    cases = {
        "two_systems": (["CI", "A100", "tiny"], {}, "2 system tags given", None),
        "unknown_system": (["A1000"], {}, "unknown tag 'A1000'", None),
        "gc200": (["GC200"], {}, "Poplar SDK", None),
        "gbs_not_divisible": (["CI", "tiny"], {"JOULEBENCH_GBS_TINY": "3"}, "--global-batch-size 3", "INVALID"),
        "limit_too_short": (["CI", "tiny"], {"JOULEBENCH_TIME_LIMIT": "0:00:30"}, "time limit 0:00:30 leaves 20 s",
                            "INVALID"),
    }
    for name, (tags, extra, message, status) in cases.items():
        out = tmp_path / name
        jube_run(LLM_XML, tags, out, {**env, **extra})
        assert "ERROR" in jube("status", str(out), env=env).stdout, name
        stderr = next(out.glob("000000/*_validate/work/stderr")).read_text()
        assert message in stderr and "Fix:" in stderr, (name, stderr)
        assert not list(out.glob("000000/*_submit/work/job.id")), name  # nothing reached sbatch
        if status:
            jube("result", "-a", str(out), env=env)
            (row,) = read_table(out, "llm")
            assert (row["Status"], row["JobID"], row["GBS"]) == (status, "n/a", "3" if "gbs" in name else "8"), row
            assert message in row["Note"] and "Fix:" in row["Note"], row


def test_four_node_shape_sweeps_nodes_and_refuses_what_the_partition_cannot_start(
    slurm_cluster_4: Path, jube_env: dict[str, str], tmp_path: Path
) -> None:
    """Same XML and profile; only SLURM_CONF and the partition come from the environment. 6 nodes on the 4-node
    partition and a duplicate point are INVALID rows, refused before sbatch; `jube run -e` says so (exit 1)
    only after the 4-node job ran (`wait`)."""
    env = {**_cluster_env(jube_env, slurm_cluster_4), "JOULEBENCH_PARTITION": "booster",
           "JOULEBENCH_SWEEP_NODES": "4,6,4"}
    out = tmp_path / "four"
    proc = jube("run", str(LLM_XML), "-o", str(out), "--hide-animation", "-e", "--tag", "CI", "tiny", "wait",
                env=env, check=False)
    assert proc.returncode == 1 and "sweep point refused (nodes=" in proc.stdout + proc.stderr, proc.stdout
    jube("continue", str(out), "--hide-animation", env=env)
    assert "ERROR" in jube("status", str(out), env=env).stdout
    jube("result", "-a", str(out), env=env)
    rows = {(row["Nodes"], row["Status"]): row for row in read_table(out, "llm")}
    assert list(rows) == [("4", "OK"), ("6", "INVALID"), ("4", "INVALID")], rows  # the sweep's order
    ran = rows[("4", "OK")]
    assert (ran["Devices"], ran["TP/PP/DP"]) == ("4", "1/1/4") and float(ran["Tokens/s"]) > 0
    too_many = rows[("6", "INVALID")]["Note"]
    assert "partition booster allows at most 4 nodes per job; 6 requested" in too_many
    assert "another partition (JOULEBENCH_CI_PARTITION; which wins over JOULEBENCH_PARTITION" in too_many
    assert "duplicate sweep point: the same configuration as llm-000000-000000" in rows[("4", "INVALID")]["Note"]
    assert [len(list(out.glob("000000/*_submit/work/job.id")))] == [1]
    (workdir,) = [w for w in submit_workdirs(out) if (w / "job.id").exists()]
    assert {p.name for p in (workdir / "run" / "energy").iterdir()} >= {"c1", "c2", "c3", "c4"}


RANK_1_FAILS = """#!/bin/sh
# The profile's launcher prefix (`container`): rank 1 of the training asks for CUDA on a CPU node (its --device cpu
# becomes cuda: an option is given once), rank 0 is fine.
case " $* " in *" -m llm_training train "*) if [ "$SLURM_PROCID" = 1 ]; then
    prev=""
    for word do shift; [ "$prev" = --device ] && word=cuda; set -- "$@" "$word"; prev=$word; done
fi ;; esac
exec "$@"
"""


def test_failed_rows_say_why_sbatch_refused_or_the_rank_that_failed_first(
    slurm_cluster: Path, jube_env: dict[str, str], tmp_path: Path
) -> None:
    """sbatch rejects a constraint no node has: the submit step does not fail, the row says why. A two-node job whose
    rank 1 refuses its device (exit 64, no record) while rank 0 waits for it: srun's --kill-on-bad-exit ends rank 0,
    and the step's exit code is that of the killed rank, yet the row and the job log's last line give rank 1's words."""
    env = _cluster_env(jube_env, slurm_cluster)
    prefix = tmp_path / "rank-1-fails"
    prefix.write_text(RANK_1_FAILS)
    prefix.chmod(0o755)
    outs = {"refused": tmp_path / "refused", "rank": tmp_path / "rank"}
    refused = {**env, "JOULEBENCH_SBATCH_ARGS": "--constraint=no-such-feature"}
    jube_run(LLM_XML, ["CI", "tiny"], outs["refused"], refused)
    jube_run(LLM_XML, ["CI", "tiny"], outs["rank"], {**env, "JOULEBENCH_CONTAINER": str(prefix)})
    (row,) = continue_and_read(outs["refused"], "llm", env)[1]
    assert row["Status"] == "FAILED" and "sbatch refused the job" in row["Note"], row
    assert "Invalid feature specification" in row["Note"], row
    assert row["JobID"] == "n/a" and row["Tokens/s"] == "n/a" and row["GBS"] == "8"
    wait_for_jobs(outs["rank"])
    (row,) = continue_and_read(outs["rank"], "llm", env)[1]
    said = ("rank 1 on n2 exited with code 64: llm_training: error: --device cuda but no CUDA/ROCm device is visible. "
            "Fix: ")
    assert (row["Status"], row["Nodes"]) == ("FAILED", "2") and row["Note"].startswith(said), row
    (workdir,) = submit_workdirs(outs["rank"])
    assert _finished_line(workdir) == "FAILED" and said in (workdir / "job.err").read_text().splitlines()[-1]


def test_a_reservation_in_sbatch_args_reaches_the_finalizer(
    slurm_cluster: Path, jube_env: dict[str, str], tmp_path: Path
) -> None:
    """A site whose benchmark nodes are reserved (every node here): a job cancelled while it waited is recorded by its
    finalizer job, which must run in the job's reservation too; outside it the finalizer would pend behind the
    reservation and the row would never come (issue 62 item 7)."""
    env = {**_cluster_env(jube_env, slurm_cluster), "JOULEBENCH_NODES": "1"}
    name = f"jb-{tmp_path.name}"[:40]
    subprocess.run(["scontrol", "create", "reservation", f"ReservationName={name}", "StartTime=now",
                    "Duration=180", "Nodes=ALL", f"Users={getpass.getuser()}"], env=env, check=True,
                   capture_output=True)
    try:
        out = tmp_path / "reserved"
        jube_run(LLM_XML, ["CI", "tiny"], out,
                 {**env, "JOULEBENCH_SBATCH_ARGS": f"--begin=now+3600 --reservation={name}"})
        (workdir,) = submit_workdirs(out)
        subprocess.run(["scancel", (workdir / "job.id").read_text().strip()], env=env, check=True)
        wait_for_jobs(out, timeout_s=120)
        (row,) = continue_and_read(out, "llm", env)[1]
        record = json.loads((workdir / "run" / "run_record.json").read_text())
    finally:
        subprocess.run(["scontrol", "delete", f"ReservationName={name}"], env=env, check=False, capture_output=True)
    assert row["Status"] == record["status"] == "CANCELLED", row
    assert "recorded by its finalizer job" in record["status_reason"]
    finalizer = [line for line in (workdir / "stdout").read_text().splitlines()
                 if line.startswith("submit:") and "jb-finalize" in line]
    assert len(finalizer) == 1 and f"--reservation={name}" in finalizer[0].split(" --wrap ")[0], finalizer
