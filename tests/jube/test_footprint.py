"""Carbon and cost (jube/jbfootprint.py): a real run's record finished by jbrecord.py with a fixed intensity, price
and PUE, and without (n/a); an hourly CSV weighted by the energy in each hour; validate's refusals of bad files."""

from __future__ import annotations

import datetime as dt
import shutil
import sys
from pathlib import Path

import pytest

from joulebench.analysis.report import load_runs, table_rows
from joulebench.record import RunRecord, read_run_record
from jpwr import Window, WindowEnergy
from jpwr.output import readable
from tests.jube.test_profile import CLEAN_ENV, jbprofile
from tests.jube.test_record_fields import fields, jbrecord, job_dir

pytest.importorskip("torchvision")
jbfootprint = sys.modules["jbfootprint"]  # loaded by jbprofile from the same directory
J_PER_KWH = 3.6e6


@pytest.fixture(scope="module")
def real_record(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny ResNet-50 run on the CPU metered by the fake NVML (in-process sampler): idle, warm-up, steady."""
    from tests.resnet50.conftest import metered_run

    out = tmp_path_factory.mktemp("run")
    assert metered_run(out, "--warmup-iterations", "1", "--iterations", "3") == 0
    return out / "run_record.json"


def finished(tmp_path: Path, record: Path, **profile: str) -> tuple[RunRecord, dict[str, str]]:
    """The record through jbrecord.py finalize with the footprint settings validate would have written; its CSV
    table row (the JB lines)."""
    site = jbfootprint.site_footprint(profile).settings()
    work = job_dir(tmp_path, None, JB_BENCHMARK="resnet50", JB_DRIVER="resnet50", **site)
    shutil.copy(record, work / "run" / "run_record.json")
    assert jbrecord.main(["finalize", "--settings", str(work / "job.env"), "--status", "OK"]) == 0
    return read_run_record(work / "run" / "run_record.json"), fields(work)


def test_a_fixed_intensity_price_and_pue_give_grams_and_cost_per_run_and_per_image(tmp_path: Path,
                                                                                    real_record: Path) -> None:
    record, row = finished(tmp_path, real_record, carbon_intensity_g_per_kwh="400", price_per_kwh="0.30",
                           currency="EUR", pue="1.25")
    block = record.footprint
    assert record.meter["clock"]["wall_ns"] > 0  # the lifecycle's anchor placed the windows in UTC
    metered = [w for w in record.windows if w.energy and w.energy.energy_j is not None]
    assert [w.name for w in metered] == ["idle", "warmup", "steady"]
    run_j = sum(w.energy.energy_j for w in metered)
    bound_j = sum(w.energy.error_bound_j for w in metered)
    steady = next(w for w in metered if w.name == "steady")
    assert block["run_energy_j"] == pytest.approx(run_j) and block["run_energy_error_bound_j"] == pytest.approx(bound_j)
    assert block["g_co2e"] == pytest.approx(run_j * 1.25 * 400 / J_PER_KWH)
    assert block["g_co2e_error_bound"] == pytest.approx(bound_j * 1.25 * 400 / J_PER_KWH)
    assert block["cost"] == pytest.approx(run_j * 1.25 * 0.30 / J_PER_KWH)
    images = steady.work["images"]
    assert block["g_co2e_per_unit"] == pytest.approx(steady.energy.energy_j * 1.25 * 400 / J_PER_KWH / images)
    assert block["cost_per_unit_error_bound"] == pytest.approx(steady.energy.error_bound_j * 1.25 * 0.3
                                                               / J_PER_KWH / images)
    assert (block["work_unit"], block["currency"], block["pue_source"]) == ("images", "EUR", "profile pue = 1.25")
    assert block["estimate"].startswith("estimate")
    assert block["carbon_source"] == "profile carbon_intensity_g_per_kwh = 400"
    assert block["placement"] == "windows placed by the record's clock anchor"
    assert float(row["g_co2e"]) == pytest.approx(block["g_co2e"], rel=1e-3)
    assert float(row["cost_per_unit"]) == pytest.approx(block["cost_per_unit"], rel=1e-3)
    assert row["currency"] == "EUR"
    (report,) = table_rows(load_runs([tmp_path / "work" / "run"]))  # joulebench report's table
    assert report["g CO2e (estimate)"] == f"{readable(block['g_co2e'])} ± {readable(block['g_co2e_error_bound'])}"
    assert report["cost (estimate)"].endswith(" EUR")


def test_without_an_intensity_or_price_every_figure_is_n_a_with_the_reason(tmp_path: Path, real_record: Path) -> None:
    record, row = finished(tmp_path, real_record)
    block = record.footprint
    assert block["g_co2e"] is None and block["cost_per_unit"] is None and block["run_energy_j"] > 0
    assert block["g_co2e_unavailable_reason"] == "no carbon intensity in the site profile"
    assert block["cost_unavailable_reason"] == "no price in the site profile"
    assert block["pue_source"] == "not given: 1 (accelerator energy only)"
    assert {row[key] for key in (*jbrecord.FOOTPRINT_KEYS, "currency")} == {"n/a"}
    (report,) = table_rows(load_runs([tmp_path / "work" / "run"]))
    assert report["g CO2e (estimate)"] == report["cost (estimate)"] == "n/a"


def _window(name: str, start: dt.datetime, seconds: float, joules: float, bound: float, anchor_ns: int) -> Window:
    """A window whose monotonic edges are `anchor_ns` + its UTC time since the epoch (anchor: wall 0 = mono 0)."""
    t0 = int(start.timestamp() * 1e9) - anchor_ns
    energy = WindowEnergy(energy_j=joules, mean_power_w=joules / seconds, devices=1, method="counter", coverage=1.0,
                          error_bound_j=bound)
    return Window(name, 0, 10, t0, t0 + int(seconds * 1e9), {"tokens": 1000.0}, energy)


def test_an_hourly_csv_weights_each_hour_by_the_energy_in_it(tmp_path: Path) -> None:
    csv = tmp_path / "intensity.csv"  # local time at +01:00: 14:00+01:00 is 13:00 UTC
    csv.write_text("time,g_per_kwh\n2026-11-26T13:00:00+01:00,100\n2026-11-26T14:00:00+01:00,300\n"
                   "2026-11-26T15:00:00+01:00,500\n")
    site = jbfootprint.site_footprint({"carbon_intensity_csv": str(csv), "pue": "1.5"})
    utc = dt.UTC
    record = RunRecord(benchmark="llm_training", run_id="r", metrics={"window": "steady", "work_unit": "tokens"},
                       meter={"clock": {"wall_ns": 0, "monotonic_ns": 0}})
    record.windows = [  # warm-up 12:50-13:00 UTC in the first hour; steady 13:30-14:30 UTC: half in each of the others
        _window("warmup", dt.datetime(2026, 11, 26, 12, 50, tzinfo=utc), 600, 600.0, 6.0, 0),
        _window("steady", dt.datetime(2026, 11, 26, 13, 30, tzinfo=utc), 3600, 7200.0, 72.0, 0),
    ]
    block = jbfootprint.footprint_block(record, site)
    assert block["g_co2e"] == pytest.approx(1.5 * (600 * 100 + 3600 * 300 + 3600 * 500) / J_PER_KWH)
    assert block["g_co2e_per_unit"] == pytest.approx(1.5 * (3600 * 300 + 3600 * 500) / J_PER_KWH / 1000)
    assert block["g_co2e_error_bound"] == pytest.approx(1.5 * (6 * 100 + 36 * 300 + 36 * 500) / J_PER_KWH)
    assert block["carbon_source"] == f"csv {csv}" and block["cost"] is None

    record.windows.append(_window("replay/step", dt.datetime(2026, 11, 26, 14, 40, tzinfo=utc), 1800, 1.0, 0, 0))
    late = jbfootprint.footprint_block(record, site)  # 14:40-15:10 UTC: the CSV ends at 15:00 UTC
    assert late["g_co2e"] is None and late["g_co2e_per_unit"] is not None
    assert "has no value for the hour 2026-11-26T15:00:00+00:00" in late["g_co2e_unavailable_reason"]


def test_a_csv_in_a_half_hour_offset_weights_its_own_hours(tmp_path: Path) -> None:
    csv = tmp_path / "intensity.csv"  # India: 14:00+05:30 is 08:30 UTC
    csv.write_text("2026-11-26T14:00:00+05:30,100\n2026-11-26T15:00:00+05:30,300\n")
    site = jbfootprint.site_footprint({"carbon_intensity_csv": str(csv)})
    record = RunRecord(benchmark="llm_training", run_id="r", metrics={"window": "steady", "work_unit": "tokens"},
                       meter={"clock": {"wall_ns": 0, "monotonic_ns": 0}})
    record.windows = [  # 09:00-10:00 UTC: half in the hour from 08:30 UTC, half in the one from 09:30
        _window("steady", dt.datetime(2026, 11, 26, 9, 0, tzinfo=dt.UTC), 3600, 7200.0, 0.0, 0)]
    assert jbfootprint.footprint_block(record, site)["g_co2e"] == pytest.approx((3600 * 100 + 3600 * 300) / J_PER_KWH)


def test_a_byte_order_mark_is_no_header_and_a_utf16_file_is_refused_by_name(tmp_path: Path) -> None:
    bom = tmp_path / "bom.csv"
    bom.write_bytes("2026-11-26T13:00:00Z,100\n2026-11-26T14:00:00Z,200\n".encode("utf-8-sig"))
    rate = jbfootprint.site_footprint({"carbon_intensity_csv": str(bom)}).carbon
    assert rate is not None and list((rate.hourly or {}).values()) == [100.0, 200.0]
    utf16 = tmp_path / "u16.csv"
    utf16.write_bytes("time,value\n2026-11-26T13:00:00Z,100\n".encode("utf-16"))
    with pytest.raises(jbprofile.ConfigError, match=f"carbon_intensity_csv = {utf16} is not UTF-8 text"):
        jbfootprint.site_footprint({"carbon_intensity_csv": str(utf16)})


@pytest.mark.parametrize(("lines", "message"), [
    ("2026-11-26T13:00:00+01:00,100\n2026-11-26T15:00:00+01:00,300\n", "line 2: .* a gap in the hourly values"),
    ("time,value\n2026-11-26T13:00:00Z,100\n2026-11-26T14:00:00Z,-3\n", r"line 3: -3 is out of range \(a negative"),
    ("2026-11-26T13:00:00,100\n", "line 1: .* has no UTC offset"),
    ("2026-11-26T13:00:00Z,100\n2026-11-26T13:00:00Z,100\n", "line 2: .* out of order or repeated"),
    ("2026-11-26T13:30:00Z,100\n", "line 1: .* is not the start of an hour"),
    ("2026-11-26T13:00:00Z;100\n", "line 1: 1 fields, not 2"),
])
def test_validate_refuses_a_bad_csv_naming_the_line(tmp_path: Path, lines: str, message: str) -> None:
    csv = tmp_path / "intensity.csv"
    csv.write_text(lines)
    with pytest.raises(jbprofile.ConfigError, match=message):
        jbprofile.build_settings("llm", [], {}, "r", {**CLEAN_ENV, "JOULEBENCH_CARBON_INTENSITY_CSV": str(csv)})


@pytest.mark.parametrize(("profile", "message"), [
    ({"JOULEBENCH_PUE": "0.9"}, "profile key pue: 0.9 is out of range"),
    ({"JOULEBENCH_CARBON_INTENSITY_G_PER_KWH": "-1"}, "out of range \\(a negative intensity\\)"),
    ({"JOULEBENCH_PRICE_PER_KWH": "0.3"}, "a price is set but profile key currency is empty"),
    ({"JOULEBENCH_CARBON_INTENSITY_G_PER_KWH": "1", "JOULEBENCH_CARBON_INTENSITY_CSV": "x.csv"}, "both set"),
])
def test_validate_refuses_bad_profile_values_naming_the_key(profile: dict[str, str], message: str) -> None:
    with pytest.raises(jbprofile.ConfigError, match=message):
        jbprofile.build_settings("llm", [], {}, "r", {**CLEAN_ENV, **profile})


def test_the_job_carries_the_checked_values_and_the_csv_as_an_absolute_path(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "p.csv").write_text("2026-11-26T13:00:00Z,0.25\n")
    monkeypatch.chdir(tmp_path)
    settings = jbprofile.build_settings("llm", [], {}, "r", {**CLEAN_ENV, "JOULEBENCH_PRICE_CSV": "p.csv",
                                                             "JOULEBENCH_CURRENCY": "CHF", "JOULEBENCH_PUE": "1.1"})
    assert (settings["JB_PRICE_CSV"], settings["JB_CURRENCY"], settings["JB_PUE"]) == (str(tmp_path / "p.csv"),
                                                                                       "CHF", "1.1")
    assert settings["JB_CARBON_INTENSITY_G_PER_KWH"] == settings["JB_CARBON_INTENSITY_CSV"] == ""


def test_a_relative_csv_path_is_relative_to_the_profile_file_that_sets_it(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    site = tmp_path / "site"
    (site / "data").mkdir(parents=True)
    (site / "data" / "p.csv").write_text("2026-11-26T13:00:00Z,0.25\n")
    (site / "profile.ini").write_text("[DEFAULT]\nprice_csv = data/p.csv\ncurrency = CHF\n")
    monkeypatch.chdir(tmp_path)  # not the profile's directory
    env = {**CLEAN_ENV, "JOULEBENCH_PROFILE": str(site / "profile.ini")}
    settings = jbprofile.build_settings("llm", [], {}, "r", env)
    assert settings["JB_PRICE_CSV"] == str(site / "data" / "p.csv")
