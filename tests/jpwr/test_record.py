"""The run record's shared headline computation."""

from __future__ import annotations

import pytest

from joulebench.record import (
    SCHEMA_VERSION,
    RunRecord,
    read_run_record,
    steady_metrics,
    write_run_record,
)
from jpwr.energy import Window, WindowEnergy


def _window(devices_metered: int) -> Window:
    energy = WindowEnergy(energy_j=7200.0, mean_power_w=720.0, devices=devices_metered, method="counter+power",
                          coverage=1.0, error_bound_j=20.0)
    return Window("steady", 5, 15, 0, 10 * 10**9, {"tokens": 655360.0}, energy)


def test_steady_metrics_rates_energy_and_units():
    metrics = steady_metrics(_window(1), "tokens", devices=1, flops_per_unit=6.0e9, peak_flops_per_device=989e12)
    assert metrics["tokens_per_s"] == pytest.approx(65536.0)
    assert metrics["time_per_iteration_s"] == pytest.approx(1.0)
    assert metrics["energy_wh"] == pytest.approx(2.0)
    assert metrics["tokens_per_wh"] == pytest.approx(327680.0)
    assert metrics["mfu"] == pytest.approx(65536.0 * 6.0e9 / 989e12)
    assert metrics["energy_warning"] is None


def test_the_figures_go_into_the_record_named_after_the_work_unit():
    data = steady_metrics(_window(1), "images", devices=1)
    assert data["images_per_s"] is data["images_per_wh"] is None  # the window's work is in tokens: no images counted
    assert "partial_images_per_wh" in data and not {"work_per_s", "work_per_wh", "tokens_per_s"} & set(data)
    assert steady_metrics(_window(1), "tokens", devices=2)["tokens_per_s_per_device"] == pytest.approx(32768.0)


def test_idle_devices_in_the_energy_are_flagged():
    metrics = steady_metrics(_window(2), "tokens", devices=1)
    assert "2 metered devices but the run used 1" in metrics["energy_warning"]
    assert metrics["mean_power_w_per_device"] == pytest.approx(360.0)


def test_missing_energy_is_none_with_a_reason_never_zero():
    window = _window(1)
    window.energy = WindowEnergy.unavailable("no accelerator sensors on node n1")
    metrics = steady_metrics(window, "images", devices=1)
    assert metrics["energy_wh"] is None and metrics["images_per_wh"] is None
    assert metrics["energy_unavailable_reason"] == "no accelerator sensors on node n1"


def test_record_round_trip_and_atomic_write(tmp_path):
    record = RunRecord(benchmark="llm_training", run_id="r1", windows=[_window(1)])
    record.metrics = steady_metrics(record.windows[0], "tokens", devices=1)
    path = write_run_record(tmp_path / "run_record.json", record)
    again = read_run_record(path)
    assert again.window("steady").energy.energy_j == 7200.0
    assert not list(tmp_path.glob(".run_record.json.*"))  # no temporary file left behind
    assert oct(path.stat().st_mode & 0o777) != "0o600"  # readable by others in a shared directory


def test_version_one_records_still_load_and_are_written_back_as_the_current_version(tmp_path):
    """Schema 2 added statuses (PARTIAL, CANCELLED, INVALID) and `job`; a version 1 file has neither."""
    data = RunRecord(benchmark="resnet50", run_id="old", status="TIMEOUT").to_dict()
    data["schema_version"] = 1
    del data["job"]
    old = RunRecord.from_dict(data)
    assert (old.status, old.job) == ("TIMEOUT", {})
    path = write_run_record(tmp_path / "run_record.json", old)
    assert read_run_record(path).to_dict()["schema_version"] == SCHEMA_VERSION
    with pytest.raises(ValueError, match=f"schema_version {SCHEMA_VERSION + 1} is not supported"):
        RunRecord.from_dict({**data, "schema_version": SCHEMA_VERSION + 1})


@pytest.mark.parametrize("status", ["PARTIAL", "CANCELLED", "INVALID"])
def test_statuses_of_schema_two_round_trip_with_the_job_facts(tmp_path, status):
    record = RunRecord(benchmark="llm_training", run_id="r2", status=status, status_reason="why",
                       job={"job_id": "42", "time_limit_s": 60, "stop_budget_s": 50})
    again = read_run_record(write_run_record(tmp_path / "run_record.json", record))
    assert (again.status, again.status_reason, again.job) == (status, "why", record.job)


def test_an_unknown_status_is_refused():
    with pytest.raises(ValueError, match="status 'DONE' is not one of"):
        RunRecord(benchmark="llm_training", run_id="r3", status="DONE")
