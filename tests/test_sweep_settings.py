"""One declaration per sweep setting (issue 57 part 6): the core's table (joulebench.sweep_settings) against the
drivers' own options, and a new setting, one row of the table, reaching JUBE (the XML's generated parameters, a
point's driver options, its coordinate) and `joulebench recommend` (read back from records, applied)."""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import shlex
from pathlib import Path

import pytest

from joulebench import sweep_settings
from joulebench.sweep_settings import SweepSetting
from tests.jube.test_profile import CLEAN_ENV, jbprofile
from tests.reports.test_recommend import CHEAPER, DEFAULT, FASTER, run_recommend, write_point

jbcolumns = importlib.import_module("jbcolumns")  # jube/ is on sys.path once jbprofile is loaded
jbworkloads = importlib.import_module("jbworkloads")
INFERENCE_XML = Path(jbcolumns.JUBE_DIR) / "inference_benchmark.xml"


def _options(driver: str) -> dict[str, argparse.Action]:
    """Every option of the driver's parser and its subcommands', with its action."""
    parser = importlib.import_module(f"{driver}.cli").build_parser()
    subparsers = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    parsers = [parser, *(s for sub in subparsers for s in sub.choices.values())]
    return {o: a for p in parsers for a in p._actions for o in a.option_strings}


@pytest.mark.parametrize("driver", sorted(sweep_settings.SETTINGS))
def test_each_row_is_its_driver_s_option_with_the_driver_s_default(driver: str) -> None:
    """The one declaration outside the table is the driver's option: each row names an option the driver has, with
    the default the driver's parser gives it (where the parser leaves it to the run, None, the run's is the row's:
    a preset's layout, the objective); one passed as given is spelled as jube's command line writes it."""
    options = _options(driver)
    for row in sweep_settings.settings_of(driver):
        if not row.option:
            continue
        assert row.option in options, (driver, row.option)
        if row.default is not None:
            default = options[row.option].default
            assert default is None or (str(default).lower() if isinstance(default, bool) else str(default)) == \
                row.default, (driver, row)
        if row.key in sweep_settings.passed_as_given(driver):
            assert row.option == f"--{row.key.replace('_', '-')}", (driver, row)  # jbarguments.cli_args' spelling


def test_a_new_setting_is_one_row_and_reaches_jube_and_recommend(monkeypatch, tmp_path, capsys) -> None:
    """--attention, an option of llm_inference that is no sweep setting, becomes one by a row of the table alone."""
    assert "attention" not in jbworkloads.WORKLOADS["inference"].sweep_keys
    row = SweepSetting("attention", "--attention", "sdpa", knob=1 + max(s.knob for s in sweep_settings.SETTINGS[
        "llm_inference"].settings))
    table = sweep_settings.SETTINGS["llm_inference"]
    monkeypatch.setitem(sweep_settings.SETTINGS, "llm_inference",
                        dataclasses.replace(table, settings=(*table.settings, row)))
    assert row.option in _options("llm_inference")  # ... plus its driver option, which llm_inference has

    # JUBE: a sweep dimension of the workflow, written into the XML's generated region with its coordinate pattern
    assert jbworkloads.WORKLOADS["inference"].sweep_keys[-1] == "attention"
    xml = jbcolumns.generate(INFERENCE_XML.read_text(), INFERENCE_XML)
    assert ('<parameter name="attention" mode="shell" export="true">printf %s "${JOULEBENCH_SWEEP_ATTENTION-}"'
            "</parameter>") in xml
    assert "^JB coord_attention=(\\S+)" in xml
    # ... and a point's value reaches the driver as its option, and the row's coordinate
    settings = jbprofile.build_settings("inference", [], {"attention": "eager"}, "r", CLEAN_ENV)
    args = shlex.split(settings["JB_TRAIN_ARGS"])
    assert args[args.index("--attention") + 1] == "eager" and settings["JB_COORD_ATTENTION"] == "eager"
    assert "--attention" not in jbprofile.build_settings("inference", [], {}, "r", CLEAN_ENV)["JB_TRAIN_ARGS"]

    # recommend: the knob read back from the records (absent: the driver's default) and applied both ways
    write_point(tmp_path, "default", DEFAULT, FASTER)
    write_point(tmp_path, "eager", {**DEFAULT, "attention": "eager"}, CHEAPER)
    out = run_recommend(capsys, str(tmp_path), "--max-slowdown", "15%")
    assert "recommended (PREDICTED from the sweep, not re-measured): attention=eager\n" in out
    assert "default setting: attention=sdpa:" in out
    assert "apply (driver options): python -m llm_inference ... --attention eager" in out
    assert "apply (JUBE): JOULEBENCH_SWEEP_ATTENTION=eager jube run jube/inference_benchmark.xml" in out


def test_the_admission_divisor_is_a_serving_knob_jube_sweeps_and_recommend_chooses(tmp_path, capsys) -> None:
    """Issue 59: `load --admit-divisor`, the engine's prefill/decode interleave, is its row of the table: a sweep
    dimension of serving points only (a static point's `run` has no such option), checked as a whole number >= 1
    before any job, and a free knob recommend reads back and applies (16 where a record predates it)."""
    assert "admit_divisor" in jbworkloads.WORKLOADS["inference"].sweep_keys
    assert "^JB coord_admit_divisor=(\\S+)" in INFERENCE_XML.read_text()
    serving = jbprofile.build_settings("inference", [], {"rate": "max", "admit_divisor": "32"}, "r", CLEAN_ENV)
    args = shlex.split(serving["JB_TRAIN_ARGS"])
    assert args[args.index("--admit-divisor") + 1] == "32" and serving["JB_COORD_ADMIT_DIVISOR"] == "32"
    static = jbprofile.build_settings("inference", [], {"batch_size": "8"}, "r", CLEAN_ENV)
    assert "--admit-divisor" not in static["JB_TRAIN_ARGS"] and static["JB_COORD_ADMIT_DIVISOR"] == "-"
    with pytest.raises(jbprofile.PointRefused, match="admit_divisor=0 is out of range"):
        jbprofile.build_settings("inference", [], {"rate": "max", "admit_divisor": "0"}, "r", CLEAN_ENV)

    serving_point = {"rate": "max", "engine": "continuous", "max_concurrency": 256}
    write_point(tmp_path, "default", {**DEFAULT, **serving_point}, FASTER)  # no admit_divisor: 16, the default
    write_point(tmp_path, "every-4", {**DEFAULT, **serving_point, "admit_divisor": 64}, CHEAPER)
    out = run_recommend(capsys, str(tmp_path), "--max-slowdown", "15%")
    assert "recommended (PREDICTED from the sweep, not re-measured): admit_divisor=64\n" in out
    assert "default setting: admit_divisor=16:" in out
    assert "apply (driver options): python -m llm_inference ... --admit-divisor 64" in out
    assert "apply (JUBE): JOULEBENCH_SWEEP_ADMIT_DIVISOR=64 jube run jube/inference_benchmark.xml" in out
