"""jube/jbrecord.py on real files: whose status wins, the job facts, a row for every point, the exit code."""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
from pathlib import Path

import pytest

from joulebench.record import RunRecord, read_run_record, write_run_record
from jpwr import Window, WindowEnergy
from jpwr.output import utc_now
from tests.jube.conftest import JUBE_DIR
from tests.jube.test_profile import jbprofile  # noqa: F401  (loads jbprofile and its jbsettings, jbslurm)

jbsettings = sys.modules["jbsettings"]  # loaded by jbprofile from the same directory
_spec = importlib.util.spec_from_file_location("jbrecord", JUBE_DIR / "jbrecord.py")
jbrecord = importlib.util.module_from_spec(_spec)
sys.modules["jbrecord"] = jbrecord
_spec.loader.exec_module(jbrecord)

SWEEP = "nodes,global_batch_size,precision"


def job_dir(tmp_path: Path, driver_status: str | None, **settings: str) -> Path:
    """A submit work directory: job.env as jbprofile writes it, and the driver's record when it left one."""
    work = tmp_path / "work"
    (work / "run").mkdir(parents=True)
    values = {
        "JB_STATUS": "OK", "JB_BENCHMARK": "llm", "JB_DRIVER": "llm_training", "JB_SYSTEM": "CI", "JB_MODEL": "tiny",
        "JB_LAUNCHER": "slurm", "JB_RUN_ID": "llm-000000-000003", "JB_NODES": "2", "JB_WORLD_SIZE": "2",
        "JB_TIME_LIMIT_S": "60", "JB_STOP_MARGIN_S": "10", "JB_STOP_BUDGET_S": "50", "JB_SWEEP": SWEEP,
        "JB_COORD_NODES": "2", "JB_COORD_GLOBAL_BATCH_SIZE": "8", "JB_COORD_PRECISION": "", "JB_NOTE": "",
        "JB_WORKDIR": str(work), "JB_OUT_DIR": str(work / "run"), "JB_DONE_FILE": str(work / "job.done"),
        **settings,
    }
    jbsettings.write_settings(work / "job.env", values)
    (work / "job.id").write_text("4711\n")
    if driver_status:
        write_run_record(work / "run" / "run_record.json", RunRecord(
            benchmark="llm_training", run_id=values["JB_RUN_ID"], status=driver_status,
            status_reason=None if driver_status == "OK" else "stopped cleanly after 9 of 100 iterations",
            config={"global_batch_size": 8, "precision": "bf16"}))
    return work


def steady_window(tokens: float, seconds: float, energy_j: float | None = None) -> Window:
    """The window a record's headline figures come from: figures without it are not believed (joulebench.figures)."""
    energy = None if energy_j is None else WindowEnergy(energy_j=energy_j, mean_power_w=energy_j / seconds, devices=1,
                                                      method="counter", coverage=1.0, error_bound_j=1.0,
                                                      unavailable_reason=None)
    return Window("steady", 5, 15, 10**9, 10**9 + round(seconds * 1e9), {"tokens": tokens}, energy)


def fields(work: Path) -> dict[str, str]:
    lines = (work / "result.txt").read_text().splitlines()
    return dict(line[3:].split("=", 1) for line in lines)


@pytest.mark.parametrize(("driver", "job", "final", "code"), [
    ("OK", "OK", "OK", 0),
    ("TIMEOUT", "OK", "TIMEOUT", 124),  # the driver's own clock stopped it; the job ended normally
    ("OK", "CANCELLED", "CANCELLED", 143),  # scancel during clean-up: the measurement is whole, the job was not
    ("TIMEOUT", "TIMEOUT", "TIMEOUT", 124),
    (None, "OK", "FAILED", 1),  # exited 0 without a record
    (None, "FAILED", "FAILED", 1),
])
def test_the_final_status_and_the_exit_code_the_job_script_passes_on(tmp_path: Path, driver: str | None, job: str,
                                                                     final: str, code: int) -> None:
    work = job_dir(tmp_path, driver)
    rc = jbrecord.main(["finalize", "--settings", str(work / "job.env"), "--status", job, "--reason",
                        "why the job says so", "--elapsed-s", "52"])
    record = read_run_record(work / "run" / "run_record.json")
    assert (rc, record.status, fields(work)["status"]) == (code, final, final)
    assert record.job == {"scheduler": "slurm", "job_id": "4711", "time_limit_s": 60, "stop_margin_s": 10,
                          "stop_budget_s": 50, "elapsed_s": 52.0, "exit_code": code, "devices": [],  # no sampler ran
                          "tags": []}  # the JUBE run's tags (JB_TAGS): none in this job.env
    assert (work / "job.done").exists() and fields(work)["job_id"] == "4711"
    if driver and job not in ("OK", driver):
        assert record.status_reason == f"why the job says so (the driver had reported {driver})"
    if driver == job == "TIMEOUT":  # both clocks: the job's budget and the driver's completed iterations
        assert record.status_reason == "why the job says so; the driver: stopped cleanly after 9 of 100 iterations"


def test_every_row_carries_its_point_whatever_its_status(tmp_path: Path) -> None:
    failed = job_dir(tmp_path / "failed", None)
    jbrecord.main(["finalize", "--settings", str(failed / "job.env"), "--status", "FAILED", "--reason", "boom"])
    row = fields(failed)
    assert (row["coord_nodes"], row["coord_global_batch_size"], row["coord_precision"]) == ("2", "8", "default")
    assert (row["job_id"], row["note"], row["tokens_per_s"]) == ("4711", "boom", "n/a")
    ran = job_dir(tmp_path / "ran", "OK")  # precision left to the driver: its record says which it used
    jbrecord.main(["finalize", "--settings", str(ran / "job.env"), "--status", "OK"])
    assert fields(ran)["coord_precision"] == "bf16"


@pytest.mark.parametrize(("allow", "per_wh", "watts"), [("no", "n/a", "n/a"),
                                                        ("yes", "412800 (partial)", "650 (partial)")])
def test_a_partial_run_shows_its_covered_figures_only_when_the_profile_allows(tmp_path: Path, allow: str,
                                                                             per_wh: str, watts: str) -> None:
    work = job_dir(tmp_path, None, JB_ALLOW_PARTIAL=allow)
    window = steady_window(tokens=760_000.0, seconds=10.0)
    window.energy = dataclasses.replace(  # untrusted: no total, the covered time's figures beside it (as the meter)
        WindowEnergy.unavailable("untrusted: GPU-0: coverage 60.0% < 99%", devices=1), method="counter",
        coverage=0.6, trusted=False, untrusted_reason="GPU-0: coverage 60.0% < 99%", partial_energy_j=6500.0,
        partial_mean_power_w=650.0)
    write_run_record(work / "run" / "run_record.json", RunRecord(
        benchmark="llm_training", run_id="llm-000000-000003", status="PARTIAL",
        status_reason="energy of the steady window untrusted: GPU-0: coverage 60.0% < 99% (NVML_ERROR_GPU_IS_LOST)",
        windows=[window],
        metrics={"work_unit": "tokens", "tokens_per_s": 76_000.0, "tokens_per_wh": None,
                 "mean_power_w_per_device": None, "partial_tokens_per_wh": 412_800.0,
                 "partial_mean_power_w_per_device": 650.0}))
    assert jbrecord.main(["finalize", "--settings", str(work / "job.env"), "--status", "OK"]) == 0
    row = fields(work)
    assert (row["status"], row["tokens_per_wh"], row["mean_power_w_per_device"]) == ("PARTIAL", per_wh, watts)
    assert row["tokens_per_s"] != "n/a" and "GPU_IS_LOST" in row["note"]


def test_an_invalid_point_becomes_a_record_and_a_row_without_a_job(tmp_path: Path) -> None:
    work = job_dir(tmp_path, None, JB_STATUS="INVALID", JB_NOTE="local: no GPU found")
    (work / "job.id").unlink()
    reason = "Slurm would never start this job: partition booster allows at most 4 nodes per job, 6 requested"
    rc = jbrecord.main(["finalize", "--settings", str(work / "job.env"), "--status", "INVALID", "--reason", reason])
    record = read_run_record(work / "run" / "run_record.json")
    assert (rc, record.status, record.job["job_id"], record.job["exit_code"]) == (64, "INVALID", None, 64)
    row = fields(work)
    assert (row["status"], row["job_id"], row["coord_nodes"]) == ("INVALID", "n/a", "2")
    assert row["note"] == f"local: no GPU found; {reason.replace(',', ';')}"  # jbrecord.render writes no commas
    assert record.status_reason == reason  # the default table: each reason's head, the row's own first
    assert row["short_note"] == "Slurm would never start this job +1"  # +1: the profile's note did not fit


def test_the_finalizer_records_a_job_slurm_no_longer_knows_and_leaves_recorded_jobs_alone(tmp_path: Path) -> None:
    work = job_dir(tmp_path, "TIMEOUT")
    assert jbrecord.main(["finalize-job", "--settings", str(work / "job.env"), "--job-id", "999999999"]) == 0
    record = read_run_record(work / "run" / "run_record.json")
    assert record.status == "FAILED" and "Slurm no longer knows job 999999999" in record.status_reason
    assert "the driver had reported TIMEOUT" in record.status_reason and (work / "job.done").exists()
    before = (work / "result.txt").read_text()
    assert jbrecord.main(["finalize-job", "--settings", str(work / "job.env"), "--job-id", "999999999"]) == 0
    assert (work / "result.txt").read_text() == before  # done already: the finalizer changes nothing
    (last,) = (work / "job.err").read_text().splitlines()  # the job script never wrote it: the finalizer did, once
    assert last.startswith("joulebench-job: finished: status FAILED (Slurm no longer knows job 999999999") and \
        last.endswith("; written by jbrecord.py finalize-job after job 999999999 ended"), last


def test_the_submit_step_writes_the_last_line_of_a_local_job_script_that_was_killed(tmp_path: Path) -> None:
    work = job_dir(tmp_path, None, JB_LAUNCHER="local")
    (work / "job.err").write_text("joulebench-job: [0 s] launching 1 rank(s) of llm_training on 1 node(s)\n")
    jbrecord.main(["finalize", "--settings", str(work / "job.env"), "--status", "FAILED", "--reason", "killed (-9)",
                   "--finished-by", "the submit step"])
    last = (work / "job.err").read_text().splitlines()[-1]
    assert last == "joulebench-job: finished: status FAILED (killed (-9)); written by the submit step"


def test_every_status_has_an_exit_code_and_job_states_map_to_statuses() -> None:
    assert set(jbrecord.EXIT_CODES) == set(jbrecord.STATUSES)
    assert set(sys.modules["jbslurm"].STATUS_OF_STATE.values()) <= set(jbrecord.STATUSES)


# job.err of a two-node job whose rank 1 refused its configuration, as Slurm 22.05's srun --label wrote it (srun's own
# line comes before the rank's, and the healthy rank 0 writes after it is killed).
SRUN_LOG = """joulebench-job: [0 s] time limit 0:10:00: the run stops at 540 s, 60 s are kept for the record
joulebench-job: [2 s] launching 2 rank(s) of llm_training on 2 node(s)
1: jpwr: warning: no accelerator sensors on node n2
srun: error: n2: task 1: Exited with exit code 64
srun: launch/slurm: _step_signal: Terminating StepId=7.0
1: python -m llm_training: error: --device cuda but torch sees no GPU. Fix: run on a GPU node, or use --device cpu
0: slurmstepd-n1: error: *** STEP 7.0 ON n1 CANCELLED AT 2026-11-25T12:41:25 ***
0: [rank0]: RuntimeError: Connection closed by peer [127.0.0.12]:29500
srun: error: n1: task 0: Terminated
"""
RANK1 = "rank 1 on n2 exited with code 64: python -m llm_training: error: --device cuda but torch sees no GPU. " \
        "Fix: run on a GPU node; or use --device cpu"  # as result.txt holds it: jbrecord.render writes no commas


def finalize_ranks(work: Path, log: str, code: int) -> tuple[int, dict[str, str]]:
    """jbrecord finalize as job.sh calls it after ranks that ended on their own with `code`."""
    (work / "job.err").write_text(log)
    rc = jbrecord.main(["finalize", "--settings", str(work / "job.env"), "--status", "OK", "--ranks-exit-code",
                        str(code)])
    return rc, fields(work)


def test_a_failed_row_names_the_rank_that_failed_first_in_its_own_words(tmp_path: Path) -> None:
    """No record (the driver refused its configuration): the rank killed afterwards (143) is not the reason."""
    rc, row = finalize_ranks(job_dir(tmp_path, None), SRUN_LOG, 143)
    assert (rc, row["status"], row["note"]) == (1, "FAILED", RANK1)
    assert row["status_reason"] == RANK1


def test_a_clean_stop_with_its_record_is_a_timeout_and_a_rank_that_failed_first_makes_it_failed(tmp_path: Path) -> None:
    """The driver's own clock: exit 124 and a TIMEOUT record (srun kills the rank that was slower to exit). A rank that
    failed first: FAILED in its words, also where rank 0 recorded srun's SIGTERM to it as TIMEOUT."""
    stopped = job_dir(tmp_path / "stopped", "TIMEOUT")
    log = "srun: error: n1: task 0: Exited with exit code 124\nsrun: error: n2: task 1: Terminated\n"
    rc, row = finalize_ranks(stopped, log, 143)
    assert (rc, row["status"]) == (124, "TIMEOUT") and row["note"].startswith("stopped cleanly after 9 of 100")
    killed = job_dir(tmp_path / "killed", "TIMEOUT")
    rc, row = finalize_ranks(killed, SRUN_LOG, 143)
    assert (rc, row["status"]) == (1, "FAILED")
    assert row["note"] == f"{RANK1} (the driver had reported TIMEOUT: stopped cleanly after 9 of 100 iterations)"
    failed = job_dir(tmp_path / "failed", "FAILED")
    rc, row = finalize_ranks(failed, SRUN_LOG, 143)
    assert (rc, row["status"]) == (1, "FAILED")
    assert row["note"] == f"{RANK1}; the driver: stopped cleanly after 9 of 100 iterations"


def test_a_rank_failing_beside_a_record_measured_to_its_end_is_a_warning_in_the_note(tmp_path: Path) -> None:
    work = job_dir(tmp_path, "OK")
    rc, row = finalize_ranks(work, SRUN_LOG, 64)
    assert (rc, row["status"]) == (0, "OK") and row["note"].endswith(f"; {RANK1}")
    assert read_run_record(work / "run" / "run_record.json").warnings == [RANK1.replace(";", ",")]


def test_local_ranks_are_found_as_job_sh_logs_them_and_without_any_rank_line_srun_s_own_error(tmp_path: Path) -> None:
    local = ("0: Traceback (most recent call last):\n0:   File \"x.py\", line 1\n0: RuntimeError: out of memory\n"
             "0: [W] destroy_process_group() was not called\n"
             "joulebench-job: [9 s] host-n0: task 0: Killed by SIGKILL\n")
    _, row = finalize_ranks(job_dir(tmp_path / "local", None), local, 137)
    assert row["note"] == "rank 0 on host-n0 was killed by signal 9 (out of memory?): RuntimeError: out of memory"
    killed = "srun: error: n1: tasks 0-1: Killed\n"  # srun's word for SIGKILL, the out-of-memory killer's signal
    _, row = finalize_ranks(job_dir(tmp_path / "killed", None), killed, 137)
    assert row["note"] == "rank 0 on n1 was killed by signal 9 (out of memory?) (nothing on its stderr)"
    srun = "srun: error: Unable to create step for job 7: Requested node configuration is not available\n"
    _, row = finalize_ranks(job_dir(tmp_path / "srun", None), srun, 1)
    assert row["note"] == ("the ranks exited with code 1 without writing the run record: srun: error: Unable to create "
                           "step for job 7: Requested node configuration is not available")


def test_every_warning_of_the_record_reaches_the_note(tmp_path: Path) -> None:
    work = job_dir(tmp_path, None)
    write_run_record(work / "run" / "run_record.json", RunRecord(
        benchmark="llm_training", run_id="llm-000000-000003", metrics={"energy_wh": 1.0},
        windows=[steady_window(tokens=1000.0, seconds=1.0, energy_j=3600.0)],
        warnings=["steady window: sensor aliasing: 100 ms updates against a 1.0 s step"]))
    jbrecord.main(["finalize", "--settings", str(work / "job.env"), "--status", "OK"])
    assert fields(work)["note"] == "steady window: sensor aliasing: 100 ms updates against a 1.0 s step"


def test_finalize_takes_the_drivers_record_from_elsewhere_and_survives_a_failing_disk(tmp_path, monkeypatch, request):
    """The driver's disk failed (its record went to $TMPDIR) and still fails when the job finalises: the row has
    the driver's figures and says why the record is not in the run directory, and the job's facts join the copy."""
    from joulebench.lifecycle import fallback_paths
    from tests.failing_disk import failing_disk

    monkeypatch.setenv("TMPDIR", str(tmp_path / "elsewhere"))
    with failing_disk(tmp_path / "disk", request) as disk:
        (disk.path / "run").mkdir()
        work = job_dir(tmp_path, None, JB_OUT_DIR=str(disk.path / "run"))
        fallback = fallback_paths("llm-000000-000003", disk.path / "run")[0]
        write_run_record(fallback, RunRecord(benchmark="llm_training", run_id="llm-000000-000003",
                                             windows=[steady_window(tokens=12_345.0, seconds=10.0)],
                                             metrics={"work_unit": "tokens", "tokens_per_s": 1234.5}))
        disk.fail()
        assert jbrecord.main(["finalize", "--settings", str(work / "job.env"), "--status", "OK"]) == 0
        row = fields(work)
        assert row["status"] == "OK" and row["tokens_per_s"] == "1234"
        assert f"the run record could not be written to {disk.path / 'run' / 'run_record.json'}" in row["note"]
        assert read_run_record(fallback).job["job_id"] == "4711"  # the finished record, still beside the driver's
        assert list((disk.path / "run").iterdir()) == []


def test_finalize_moves_the_drivers_record_from_elsewhere_into_the_run_directory(tmp_path, monkeypatch):
    from joulebench.lifecycle import fallback_paths

    monkeypatch.setenv("TMPDIR", str(tmp_path / "elsewhere"))
    work = job_dir(tmp_path, None)
    fallback = write_run_record(fallback_paths("llm-000000-000003", work / "run")[0], RunRecord(
        benchmark="llm_training", run_id="llm-000000-000003", metrics={"work_unit": "tokens", "tokens_per_s": 99.0}))
    assert jbrecord.main(["finalize", "--settings", str(work / "job.env"), "--status", "OK", "--ranks-exit-code",
                          "74"]) == 0  # the driver's code for a record it wrote elsewhere: the record decides
    record = read_run_record(work / "run" / "run_record.json")
    assert record.status == "OK" and record.metrics["tokens_per_s"] == 99.0 and not fallback.exists()


def test_a_long_warning_is_in_full_in_the_note_and_its_head_in_the_short_note(tmp_path: Path) -> None:
    """The meter's list of every sensor it could not read is one long text: the full table's note has it in full, the
    default table's Reason only its head, beside the other warnings' heads that fit."""
    sensors = ("no accelerator sensors on node vm: nvml: unavailable: nvmlInit failed: NVML Shared Library Not Found "
               "(no NVIDIA driver or GPU?); amdsmi: unavailable: amdsmi not installed (ships with ROCm); rapl: "
               "unavailable: no RAPL zones under /sys/class/powercap (no intel_rapl driver?)")
    work = job_dir(tmp_path, None, JB_NOTE="local: no GPU found (neither nvidia-smi -L nor rocm-smi lists one)")
    write_run_record(work / "run" / "run_record.json", RunRecord(
        benchmark="llm_training", run_id="llm-000000-000003", metrics={"energy_unavailable_reason": sensors},
        warnings=["steady window: 3 counter segments, the fit needs 20"]))
    jbrecord.main(["finalize", "--settings", str(work / "job.env"), "--status", "OK"])
    row = fields(work)
    assert row["note"].count("nvmlInit failed") == 1 and "intel_rapl driver?)" in row["note"]
    assert row["short_note"] == "energy n/a: no accelerator... +2"  # the head, cut at a word, and the two others
    assert len(row["short_note"]) <= jbrecord.SHORT_NOTE_CHARS


def test_the_point_names_the_coordinates_in_which_the_rows_differ(tmp_path: Path) -> None:
    """The default table's Point: `-` for a single point, else only the swept coordinates, in the sweep's order."""
    points = {"a": {"JB_COORD_GLOBAL_BATCH_SIZE": "8", "JB_COORD_PRECISION": "bf16"},
              "b": {"JB_COORD_GLOBAL_BATCH_SIZE": "16", "JB_COORD_PRECISION": "bf16"}}
    rundir = tmp_path / "rundir"
    for n, (name, coords) in enumerate(points.items()):
        work = job_dir(rundir / f"00000{n}_submit", "OK", JB_RUN_ID=name, **coords)
        jbrecord.main(["finalize", "--settings", str(work / "job.env"), "--status", "OK"])
        assert jbrecord.point_labels(rundir) == ({"a": "-"} if name == "a" else {"a": "gbs=8", "b": "gbs=16"})
    jbrecord.main(["compare", "--rundir", str(rundir)])
    assert "JB point=gbs=16\n" in (rundir / "compare" / "b.txt").read_text()


def test_points_that_differ_late_in_their_label_still_read_apart(tmp_path: Path) -> None:
    """Issue 48: cut at 24 characters, rows of a rate sweep differing only in their rate read `bs=...` alike; the
    Point is then cut at POINT_MAX_CHARS only."""
    grid = [(bs, slots, ttft, rate) for bs, slots, ttft in (("1", "256", "1000"), ("2", "512", "2000"))
            for rate in ("4", "max")]
    rundir = tmp_path / "rundir"
    for n, (bs, slots, ttft, rate) in enumerate(grid):
        work = job_dir(rundir / f"00000{n}_submit", "OK", JB_RUN_ID=f"r{n}", JB_DRIVER="llm_inference",
                       JB_SWEEP="batch_size,max_concurrency,slo_ttft_ms,rate", JB_COORD_BATCH_SIZE=bs,
                       JB_COORD_MAX_CONCURRENCY=slots, JB_COORD_SLO_TTFT_MS=ttft, JB_COORD_RATE=rate)
        jbrecord.main(["finalize", "--settings", str(work / "job.env"), "--status", "OK"])
    labels = jbrecord.point_labels(rundir)
    full = {f"r{n}": f"bs={bs} slots={slots} ttft_slo={ttft} rate={rate}"
            for n, (bs, slots, ttft, rate) in enumerate(grid)}
    assert all(len(label) > jbrecord.POINT_CHARS for label in full.values())  # cut at 24 they would read alike
    assert labels == full


@pytest.mark.parametrize("stale", ["another output directory", "an earlier run of this one"])
def test_finalize_never_takes_a_copy_another_run_left_elsewhere(tmp_path, monkeypatch, stale):
    """Run ids repeat across JUBE outpaths and reruns: a copy in $TMPDIR of a run with the same id is this run's only
    when it is named after this run directory and started after the job was submitted."""
    from joulebench.lifecycle import fallback_paths

    monkeypatch.setenv("TMPDIR", str(tmp_path / "elsewhere"))
    work = job_dir(tmp_path, None)  # this run's driver was killed: it left no record at all
    other = stale == "another output directory"
    copy = write_run_record(fallback_paths("llm-000000-000003", tmp_path / "old" if other else work / "run")[0],
                            RunRecord(benchmark="llm_training", run_id="llm-000000-000003",
                                      started_at="2020-01-01T00:00:00+00:00" if not other else utc_now(),
                                      metrics={"work_unit": "tokens", "tokens_per_s": 1234.5}))
    (work / "job.err").write_text("srun: error: n1: task 0: Killed\n")
    assert jbrecord.main(["finalize", "--settings", str(work / "job.env"), "--status", "OK", "--ranks-exit-code",
                          "137"]) == 1
    row = fields(work)
    assert row["status"] == "FAILED" and row["tokens_per_s"] == "n/a" and copy.exists()


def test_a_timeout_whose_record_went_elsewhere_stays_a_timeout(tmp_path, monkeypatch):
    """Rank 0 stopped cleanly, could not write its record to the run directory and exited 74 (srun names the task):
    the record decides, as for a clean stop's 124."""
    from joulebench.lifecycle import fallback_paths

    monkeypatch.setenv("TMPDIR", str(tmp_path / "elsewhere"))
    work = job_dir(tmp_path, None)
    write_run_record(fallback_paths("llm-000000-000003", work / "run")[0], RunRecord(
        benchmark="llm_training", run_id="llm-000000-000003", status="TIMEOUT",
        status_reason="stopped cleanly after 9 of 100 iterations", metrics={"work_unit": "tokens"}))
    (work / "job.err").write_text("0: [llm_training] error: cannot write the run record (No space left on device)\n"
                                  "srun: error: n1: task 0: Exited with exit code 74\n")
    assert jbrecord.main(["finalize", "--settings", str(work / "job.env"), "--status", "OK", "--ranks-exit-code",
                          "74"]) == 124
    row = fields(work)
    assert row["status"] == "TIMEOUT" and "stopped cleanly after 9 of 100 iterations" in row["note"]


def test_a_failed_rank_that_wrote_nothing_of_its_own_is_named(tmp_path):
    """srun names the task, but the rank printed no line of its own (no `N:` label): FAILED, nothing on its stderr."""
    work = job_dir(tmp_path, "TIMEOUT")
    (work / "job.err").write_text("srun: error: n2: task 1: Segmentation fault\n")
    assert jbrecord.main(["finalize", "--settings", str(work / "job.env"), "--status", "OK", "--ranks-exit-code",
                          "139"]) == 1
    assert "rank 1 on n2 ended: Segmentation fault (nothing on its stderr)" in fields(work)["note"]


def test_fields_of_a_record_no_workflow_wrote_name_the_fix(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Without job.env the row's workflow comes from the record's driver; an unknown one is refused, not guessed."""
    path = tmp_path / "run_record.json"
    write_run_record(path, RunRecord(benchmark="some_driver", run_id="r", status="OK"))
    assert jbrecord.main(["fields", str(path)]) == 64
    error = capsys.readouterr().err
    assert "'some_driver' is none of the workflows' drivers" in error and "Fix: pass the point's job.env" in error


@pytest.mark.parametrize(("value", "digits", "shown"), [
    (33650.4, 4, "33650"), (0.28, 4, "0.28"), (4.33e-05, 3, "0.0000433"), (1.2344e-07, 4, "0.0000001234"),
    (-2.5e-06, 4, "-0.0000025"), (0.0, 4, "0"), (None, 4, "n/a")])
def test_numbers_are_written_for_people_never_in_scientific_notation(value, digits, shown) -> None:
    """Issue 48: carbon and cost per unit read 1.234e-05 in the tables; a person reads decimals."""
    assert jbrecord._num(value, digits) == shown
