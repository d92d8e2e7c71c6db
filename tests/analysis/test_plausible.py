"""Issue 47 item 1: record values analysis computes with are checked against what the record says of the device and
the window (joulebench.analysis.plausible): a clock outside the devices' recorded range never reaches `plan`'s
recommendation, one without a range is flagged; an idle baseline that is not positive, or lies above the window's
mean power beyond both bounds, gives no dynamic energy (n/a with the reason) in `attribute`."""

from __future__ import annotations

import io
import json
import shutil
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from joulebench.analysis import plan
from joulebench.analysis.attribute import main as attribute_main
from joulebench.analysis.plausible import clock_check, idle_power_w
from joulebench.device_settings import Request
from joulebench.device_settings.record import node_block
from joulebench.record import RunRecord, read_run_record
from tests.reports.test_plan import H100_SM_CLOCKS_MHZ, KNOWN, STEP_PHASES, write_attributed_run

REPO = Path(__file__).resolve().parents[2]
INFERENCE = REPO / "benchmarks" / "results" / "2026-11-25-session9" / "lifecycle" / "new" / "llm_inference" / "run"


def _sweep(root: Path) -> Path:
    for clock in (None, 1410, 1110):
        write_attributed_run(root, f"sm-{clock or 'default'}", clock, {p: KNOWN[p][clock] for p in STEP_PHASES})
    return root


def _edit_devices(path: Path, devices: list[dict]) -> None:
    data = json.loads(path.read_text())
    data["config"]["device_settings"]["devices"] = devices
    path.write_text(json.dumps(data))


@pytest.mark.parametrize(("devices", "named"), [
    ([{"locked_sm_clock_mhz": 1110, "supported_sm_clock_range_mhz": [1200, 1980]}],
     "sm_clock_mhz 1110 MHz, locked_sm_clock_mhz 1110 MHz outside the devices' supported SM clocks 1200-1980 MHz"),
    ([{"locked_sm_clock_mhz": 1110, "supported_sm_clock_range_mhz": [210, 1980]},  # two devices: both ranges hold
      {"locked_sm_clock_mhz": 1110, "supported_sm_clock_range_mhz": [1500, 2100]}], "outside the devices' supported"),
    ([{"locked_sm_clock_mhz": 1110, "supported_sm_clock_range_mhz": "210-1980"}], "is not a [min, max] range in MHz"),
    ([{"locked_sm_clock_mhz": 987654321}], "locked_sm_clock_mhz 987654321 MHz is outside 1 to 100000 MHz"),
])
def test_a_clock_outside_the_devices_range_never_reaches_the_plan(tmp_path, devices, named) -> None:
    root = _sweep(tmp_path / "runs")
    _edit_devices(root / "sm-1110" / "run_record.json", devices)
    profile = plan.profile_from_records([root], "fit")
    (left_out,) = profile.excluded
    assert left_out.startswith("run sm-1110: ") and named in left_out
    assert 1110 not in profile.clocks and 1410 in profile.clocks


def test_a_clock_without_a_recorded_range_is_used_and_flagged(tmp_path, capsys) -> None:
    root = _sweep(tmp_path / "runs")
    _edit_devices(root / "sm-1410" / "run_record.json", [])
    assert plan.main([str(root), "--json", str(tmp_path / "plan.json")]) == 0
    flag = ("run sm-1410: clock 1410 MHz not checked against the device's range (the record's device settings have "
            "no supported_sm_clock_range_mhz)")
    assert f"flagged: {flag}" in capsys.readouterr().out
    result = json.loads((tmp_path / "plan.json").read_text())
    assert result["clock_unchecked"] == [flag] and result["excluded"] == []


def test_the_clock_check_reads_what_device_settings_apply_records() -> None:
    """The range key is the one joulebench.device_settings writes per device (its fake-NVML tests cover the write)."""
    device = {"locked_sm_clock_mhz": 1410, "supported_sm_clock_range_mhz": list(H100_SM_CLOCKS_MHZ)}
    record = RunRecord("llm_training", "r", config={"device_settings": node_block(Request(sm_clock_mhz=1410), "nvml",
                                                                                  "n1", None, [device])})
    checked = clock_check(record)
    assert checked.problem is None and checked.unchecked is None and checked.settings is not None
    assert checked.settings.requested.sm_clock_mhz == 1410
    default = clock_check(RunRecord("llm_training", "d"))
    assert default.problem is None and default.settings is not None and default.settings.is_default


def _attribute(run_dir: Path) -> str:
    out = io.StringIO()
    with redirect_stdout(out):
        assert attribute_main([str(run_dir), "--no-write"]) == 0
    return out.getvalue()


@pytest.mark.parametrize(("idle", "reason"), [
    ({"power_w": -20.0}, "meter.idle_baseline.power_w -20 is not positive"),
    ({"power_w": 0.0}, "meter.idle_baseline.power_w 0 is not positive"),
    ({"power_w": "126 W"}, "meter.idle_baseline.power_w '126 W' is not a number"),
    ({"devices": 0.5}, "meter.idle_baseline.devices 0.5 is not a whole number"),
    ({"power_w": 900.0}, "the idle baseline 900 W per device is above the steady window's mean power 475.5 W per "
                         "device beyond the combined bounds"),
])
def test_an_implausible_idle_baseline_gives_no_dynamic_energy(tmp_path, idle, reason) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(INFERENCE, run_dir)
    path = run_dir / "run_record.json"
    data = json.loads(path.read_text())
    data["meter"]["idle_baseline"].update(idle)
    path.write_text(json.dumps(data))
    record = read_run_record(path)
    idle_w, said = idle_power_w(record, record.window("steady"))
    assert idle_w is None and reason in said
    text = _attribute(run_dir)
    assert f"dynamic J n/a: {reason}" in text and "dynamic J |" not in text  # no column of made-up dynamic energies


def test_the_shipped_idle_baseline_passes_and_splits_the_energy(tmp_path) -> None:
    record = read_run_record(INFERENCE / "run_record.json")
    steady = record.window("steady")
    idle_w, said = idle_power_w(record, steady)
    baseline = record.meter["idle_baseline"]
    assert idle_w == pytest.approx(baseline["power_w"] / baseline["devices"]) and said.startswith("the record's idle")
    assert "dynamic J |" in _attribute(INFERENCE)


def test_an_idle_baseline_above_the_window_only_within_the_bounds_is_kept() -> None:
    """Above the mean power, but by less than the two bounds together: a settled baseline taken a little hot."""
    record = read_run_record(INFERENCE / "run_record.json")
    steady = record.window("steady")
    assert steady is not None and steady.energy is not None and steady.energy.energy_j is not None
    mean_w = steady.energy.energy_j / steady.duration_s
    window_bound_w = (steady.energy.error_bound_j or 0.0) / steady.duration_s
    record.meter["idle_baseline"] = {**record.meter["idle_baseline"], "power_w": mean_w + window_bound_w + 2.0,
                                     "error_bound_w": 3.0}
    assert idle_power_w(record, steady)[0] == pytest.approx(mean_w + window_bound_w + 2.0)
    record.meter["idle_baseline"]["error_bound_w"] = 1.0
    assert idle_power_w(record, steady)[0] is None
