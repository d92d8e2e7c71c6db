"""The per-request fit after a load run (`python -m llm_inference request-energy`, llm_inference/recorded_energy.py),
as a JUBE job runs it once its node sampler wrote the trace (jube/jbrecord.py finalize).

The replay: an in-process `load` on the CPU, metered through the fake pynvml (the recorded H100 trace), fits its
per-request energy itself. Its files are then put as a JUBE job's driver leaves them (the driver under the node's
sampler has no trace: its block waits for one, the table's energy columns are empty, the node's trace lies under
<run>/energy), and the JUBE-side fit gets exactly the run's own block, figures and table from them.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from joulebench.lifecycle import amend_written_record
from joulebench.record import RECORD_FILE, RunRecord
from joulebench.requests_table import FILE_NAME, REQUEST_COLUMNS, read_requests, write_requests
from llm_inference.cli import main
from llm_inference.serving_energy import NO_TRACE
from tests.conftest import FAKES_DIR, H100_TRACE_DIR, TESTS_DIR
from tests.jube.test_record_fields import fields, jbrecord, jbsettings, job_dir
from tests.llm_inference.conftest import INFER, run_cmd

ENERGY_COLUMNS = [c for c in REQUEST_COLUMNS if c.endswith(("_j", "_j_low", "_j_high"))]


@pytest.fixture(scope="module")
def in_process(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One rate of `load` metered in process (`--energy-methods nvml`): its record fits per-request energy."""
    import os

    out = tmp_path_factory.mktemp("load") / "rate"
    env = {**os.environ, "JPWR_FAKE_NVML_TRACE": str(H100_TRACE_DIR),
           "PYTHONPATH": os.pathsep.join([str(FAKES_DIR), str(TESTS_DIR.parent), os.environ.get("PYTHONPATH", "")])}
    result = run_cmd([*INFER, "load", "--preset", "tiny", "--task", "tiny", "--device", "cpu", "--max-concurrency",
                      "4", "--rate", "40", "--steady-seconds", "2", "--energy-methods", "nvml", "--out-dir", str(out),
                      "--run-id", "replay"], env, out.parent)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    energy = json.loads((out / RECORD_FILE).read_text())["requests"]["energy"]
    assert energy.get("segments", 0) > 0 and "unavailable_reason" not in energy, energy
    return out


def as_a_jube_job_leaves_it(run: Path, target: Path) -> Path:
    """The run's files as its driver writes them under a job's node sampler, which writes its trace under
    <run>/energy when it stops: the record's block waiting for the trace, no J/request, empty energy columns."""
    shutil.copytree(run, target)
    (target / "jpwr").rename(target / "energy")

    def waiting(record: RunRecord) -> bool:
        record.requests = {**(record.requests or {}), "energy": {"unavailable_reason": NO_TRACE}}
        record.metrics.update(energy_per_request_p50_j=None, energy_per_request_p90_j=None)
        return True

    amend_written_record(target, waiting)
    table = read_requests(target / FILE_NAME)
    for column in ENERGY_COLUMNS:
        table.requests[column][:] = np.nan
    table.attrs.pop("energy_split_unavailable_reason", None)
    table.attrs["energy_unavailable_reason"] = NO_TRACE
    write_requests(target / FILE_NAME, table)
    return target


def test_the_fit_after_the_job_gets_exactly_the_in_process_runs_block(in_process: Path, tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    run = as_a_jube_job_leaves_it(in_process, tmp_path / "run")
    assert main(["request-energy", "--run", str(run)]) == 0
    said = capsys.readouterr().out
    own, replayed = (json.loads((d / RECORD_FILE).read_text()) for d in (in_process, run))
    energy = replayed["requests"]["energy"]
    assert energy["coefficients"] == own["requests"]["energy"]["coefficients"]
    assert energy["intervals_95"] == own["requests"]["energy"]["intervals_95"]
    assert energy["energy_per_request_j"] == own["requests"]["energy"]["energy_per_request_j"]
    assert energy["shares"] == own["requests"]["energy"]["shares"]
    assert energy["checks_failed"] == own["requests"]["energy"]["checks_failed"]
    assert isinstance(energy["controlled_split"], list)  # the first rate's table holds the controlled window's steps
    assert replayed["requests"] == own["requests"] and replayed["metrics"] == own["metrics"]  # the whole block
    tables = [read_requests(d / FILE_NAME) for d in (in_process, run)]
    for column in ENERGY_COLUMNS:
        np.testing.assert_array_equal(tables[1].requests[column], tables[0].requests[column])
    assert tables[1].attrs == tables[0].attrs and tables[1].controlled_steps.keys() == tables[0].controlled_steps.keys()
    p50 = own["metrics"]["energy_per_request_p50_j"]
    assert f"rate 40: J/request p50 {p50:.4g}" in said and max(map(len, said.splitlines())) <= 160
    # Run again, the rate no longer waits for a trace: left as it is.
    before = (run / RECORD_FILE).read_text()
    assert main(["request-energy", "--run", str(run)]) == 0
    assert "left as the run recorded it" in capsys.readouterr().out and (run / RECORD_FILE).read_text() == before


def test_without_the_nodes_trace_the_block_says_where_none_was(in_process: Path, tmp_path: Path) -> None:
    run = as_a_jube_job_leaves_it(in_process, tmp_path / "run")
    assert main(["request-energy", "--run", str(run), "--trace", str(tmp_path / "elsewhere")]) == 0
    energy = json.loads((run / RECORD_FILE).read_text())["requests"]["energy"]
    assert energy == {"unavailable_reason": f"no trace under {tmp_path / 'elsewhere'} (its sampler wrote none: see "
                                           "its log)"}
    assert read_requests(run / FILE_NAME).attrs["energy_unavailable_reason"] == energy["unavailable_reason"]


def test_a_directory_without_a_load_record_is_refused_naming_the_fix(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["request-energy", "--run", str(tmp_path)]) == 64
    err = capsys.readouterr().err
    assert f"--run {tmp_path} holds no run record (run_record.json)" in err and "load metered by an external" in err


def serving_job(tmp_path: Path, run: Path, **settings: str) -> Path:
    """A serving point's submit directory whose run directory holds `run` as the job's driver left it."""
    work = job_dir(tmp_path, None, JB_BENCHMARK="inference", JB_DRIVER="llm_inference", JB_DRIVER_COMMAND="load",
                   JB_LAUNCHER="local", JB_NODES="1", JB_WORLD_SIZE="1", JB_SWEEP="rate", JB_COORD_RATE="40",
                   JB_TIME_LIMIT_S="600", **settings)
    shutil.rmtree(work / "run")
    as_a_jube_job_leaves_it(run, work / "run")
    return work


def test_finalize_fits_a_serving_row_after_the_job_and_the_row_has_its_figures(in_process: Path,
                                                                               tmp_path: Path) -> None:
    work = serving_job(tmp_path, in_process)
    record = jbrecord.finalize(jbsettings.read_settings(work / "job.env"), "OK", "", 30.0, after_job=True)
    jbrecord.write_result(jbsettings.read_settings(work / "job.env"), record)
    own = json.loads((in_process / RECORD_FILE).read_text())
    assert record.requests["energy"]["coefficients"] == own["requests"]["energy"]["coefficients"]
    row = fields(work)
    assert float(row["energy_per_request_p50_j"]) == pytest.approx(own["metrics"]["energy_per_request_p50_j"], 1e-3)
    assert float(row["energy_per_request_p90_j"]) > 0 and float(row["idle_share"]) > 0
    energy = own["requests"]["energy"]
    if energy["split_unavailable_reason"]:  # the fake trace's power does not follow the CPU engine's steps
        assert row["prefill_share"] == row["decode_share"] == "n/a"
        assert "prefill/decode shares n/a: the prefill columns'" in row["note"]
    checks = energy["checks_failed"]
    assert (f"J/request model checks failed: {checks}".replace(",", ";") in row["note"]) if checks != "none" else \
        "J/request model checks: none failed" in row["note"]
    assert "J/request and shares n/a" not in row["note"]


@pytest.mark.parametrize(("status", "elapsed_s", "why"), [
    ("CANCELLED", 30.0, "the job was cancelled"), ("TIMEOUT", 590.0, "0 s left before the job's time limit")])
def test_a_serving_row_not_fitted_after_the_job_says_why(in_process: Path, tmp_path: Path, status: str,
                                                          elapsed_s: float, why: str) -> None:
    work = serving_job(tmp_path, in_process)
    record = jbrecord.finalize(jbsettings.read_settings(work / "job.env"), status, "stopped", elapsed_s,
                               after_job=True)
    assert record.requests["energy"] == {"unavailable_reason": NO_TRACE}
    assert any(w.startswith(f"per-request energy not fitted after the job: {why}") for w in record.warnings)


def test_the_fit_after_a_jube_job_gets_the_h100_sweeps_coefficients_from_its_files(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 60: a JUBE serving row uses the driver's model. The first rate of the H100 sweep (it holds the
    controlled split's steps), left as a job's driver leaves it, fitted after the job: the same coefficients (to the
    replay's 1e-9: the GPU machine's BLAS differs in the last bits), checks and per-request figures as its record."""
    from benchmarks.joint_fit_replay import block_differences
    from tests.test_h100_sweep_replay import SWEEP

    run = as_a_jube_job_leaves_it(SWEEP / "rate_4", tmp_path / "run")
    assert main(["request-energy", "--run", str(run)]) == 0
    own, replayed = (json.loads((d / RECORD_FILE).read_text())["requests"]["energy"] for d in (SWEEP / "rate_4", run))
    p50, p90 = own["energy_per_request_j"]["p50"], own["energy_per_request_j"]["p90"]
    assert f"rate 4: J/request p50 {p50:.4g}, p90 {p90:.4g}" in capsys.readouterr().out
    assert block_differences("rate 4", own, replayed) == []
    assert replayed["checks_failed"] == own["checks_failed"] and "joint" not in replayed  # one job: one rate
    for key in ("energy_per_request_j", "shares"):
        assert replayed[key] == pytest.approx(own[key], rel=1e-9)
