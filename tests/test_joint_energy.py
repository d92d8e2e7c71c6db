"""The joint per-request fit over a sweep's rates (joulebench/joint_energy.py), on planted costs and on the
recorded 2026-11-25 H100 sweep (benchmarks/results/.../serving-final/sweep, rates 4 and 8: the smallest files).

Planted: three runs of fixed batches, each with every step of a kind the same size (a decode step's rows a fixed
multiple of its count, a prefill step's tokens too), so no run alone can tell a step's fixed cost from its cost per
row or token; the runs' sizes differ, and together the planted costs come back.
Recorded: the replay rebuilds the driver's per-rate fit exactly, and a sweep's records gain the joint block.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from benchmarks.joint_fit_replay import differences, load_rate
from joulebench.cap_term import NEVER_CAPPED
from joulebench.clock_term import FORM
from joulebench.joint_energy import JointFit, RateWindow, fit_joint
from joulebench.record import read_run_record, write_run_record
from joulebench.request_energy import COLUMNS, DECODE, MAX_PREFILL_VIF, PREFILL, cross_check, fit_request_energy
from joulebench.requests_table import FILE_NAME, read_requests
from jpwr import ValidationError
from llm_inference.serving_energy import JointMaterial, Measured, Sweep, joint_blocks, write_joint
from tests import serving_run
from tests.serving_run import COSTS, IDLE_W

SWEEP = Path(__file__).parent.parent / "benchmarks/results/2026-11-25-session10/serving-final/sweep"
DRAWS = 40


# ---- planted costs: collinear per rate, separable together -------------------------------------------------
@pytest.fixture(scope="module")
def constant_runs(tmp_path_factory: pytest.TempPathFactory) -> list[RateWindow]:
    """Three runs of fixed batches (tests/serving_run.fixed_batches), 12 s each: 8 rows of 64-token prompts, 32 rows
    of 256-token prompts (each decoded for 60 steps), 64 rows of 16-token prompts (30 steps)."""
    import pynvml  # the fake (tests/conftest.py puts tests/fakes first)

    root = tmp_path_factory.mktemp("joint")
    runs = []
    for seed, rows, prompt, decodes in ((3, 8, 64, 60), (5, 32, 256, 60), (7, 64, 16, 30)):
        log, schedule = serving_run.fixed_batches(seed, rows, prompt, decodes, 12.0)
        knots = serving_run.meter(schedule, root / str(rows), pynvml, seed + 10)
        span = (float(log.t0_ns[0]), float(log.t1_ns[-1]))
        runs.append(RateWindow(f"{rows}-rows", log, knots, IDLE_W, span, span))
    return runs


@pytest.fixture(scope="module")
def planted_joint(constant_runs: list[RateWindow]) -> JointFit:
    return fit_joint(constant_runs, draws=DRAWS)


def test_no_rate_alone_tells_a_steps_fixed_cost_from_its_cost_per_row(constant_runs: list[RateWindow]) -> None:
    for run in constant_runs:
        fit = fit_request_energy(run.log, run.knots, run.idle_w, *run.span, draws=DRAWS)
        for column in ("prefill_tokens", "prefill_steps", "decode_steps", "row_steps"):
            assert fit.vif[COLUMNS.index(column)] == np.inf, column


def test_the_joint_fit_recovers_the_planted_costs(planted_joint: JointFit, constant_runs: list[RateWindow]) -> None:
    joint = planted_joint
    assert joint.reason is None and joint.columns == COLUMNS  # idle given for every run: no idle columns
    assert np.all(joint.vif < MAX_PREFILL_VIF)  # every column determined together
    for column in ("prefill_tokens", "decode_steps", "row_steps"):  # the large parts of the energy
        assert joint.coefficients[COLUMNS.index(column)] == pytest.approx(COSTS[column], rel=0.05), column
    # The prefill and decode parts of each run's work: the planted energy inside the joint fit's 95 % interval.
    planted = np.array([COSTS[c] for c in COLUMNS])
    for run in constant_runs:
        amounts = run.log.amounts(np.array([run.span[0]]), np.array([run.span[1]]))[0]
        for part in (PREFILL, DECODE):
            low, high = np.percentile(joint.draws[:, part] @ amounts[part], (2.5, 97.5))
            assert low <= amounts[part] @ planted[part] <= high, (run.label, part)
    # Every rate's view carries the shared costs and its own held-out halves, which close.
    for run in constant_runs:
        view = joint.per_rate[run.label]
        np.testing.assert_array_equal(view.coefficients, joint.coefficients)
        assert view.separable and len(view.folds) == 2 and all(f.closes for f in view.folds)


def test_a_rate_left_out_is_predicted_by_the_other(planted_joint: JointFit, constant_runs: list[RateWindow]) -> None:
    for run in constant_runs:
        model = planted_joint.left_out[run.label]
        assert not isinstance(model, str)
        check = cross_check(model, run.log, run.knots, *run.window)
        assert check.passes, check


def test_a_joint_fit_needs_two_distinct_rates(constant_runs: list[RateWindow]) -> None:
    with pytest.raises(ValidationError, match="at least 2 rates"):
        fit_joint(constant_runs[:1])
    with pytest.raises(ValidationError, match="distinct labels"):
        fit_joint([constant_runs[0], constant_runs[0]])


def test_a_rate_without_idle_baseline_gets_its_own_idle_column(constant_runs: list[RateWindow]) -> None:
    first, *others = constant_runs
    no_idle = RateWindow(first.label, first.log, first.knots, None, first.span, first.window)
    joint = fit_joint([no_idle, *others], draws=DRAWS)
    assert joint.columns == (*COLUMNS, f"idle_w[{first.label}]")
    assert joint.per_rate[first.label].given_idle_w is None
    view = joint.per_rate[first.label]
    low, high = np.percentile(view.idle_draws_w, (2.5, 97.5))
    assert low <= IDLE_W <= high  # a run busy all the time barely tells idle power from step costs: wide
    assert cross_check(view, first.log, first.knots, *first.span).passes  # their sum it does
    assert isinstance(joint.left_out[first.label], str)  # its idle power is unknown to the other rates


# ---- the recorded H100 sweep -------------------------------------------------------------------------------
RATES = ("4", "8")


@pytest.fixture(scope="module")
def recorded() -> dict[str, tuple[RateWindow, dict]]:
    return {label: load_rate(SWEEP / f"rate_{label}") for label in RATES}


def test_the_replay_rebuilds_the_drivers_per_rate_fit(recorded: dict[str, tuple[RateWindow, dict]]) -> None:
    for run, record in recorded.values():
        energy = record["requests"]["energy"]
        fit = fit_request_energy(run.log, run.knots, run.idle_w, *run.span, draws=DRAWS)
        assert fit.segment_count == energy["segments"]
        expected = [energy["coefficients"][c] for c in COLUMNS]
        np.testing.assert_allclose(fit.coefficients, expected, rtol=1e-9, atol=1e-12)


def _sweep(recorded: dict[str, tuple[RateWindow, dict]], tmp_path: Path) -> Sweep:
    """The sweep as the driver holds it after its rates, with each rate's record copied under tmp_path."""
    sweep = Sweep()
    for label, (run, _) in recorded.items():
        directory = tmp_path / f"rate_{label}"
        directory.mkdir()
        shutil.copy(SWEEP / f"rate_{label}" / "run_record.json", directory)
        path = directory / "run_record.json"
        write_run_record(path, read_run_record(path))  # as this tree's driver writes it (the files predate fields)
        table = read_requests(SWEEP / f"rate_{label}" / FILE_NAME)
        rows = table.requests
        start = float(table.attrs["start_ns"])
        admitted = np.isfinite(rows["admitted_s"]) & np.isfinite(rows["finish_s"])
        lifetimes = np.column_stack([rows["id"][admitted], start + rows["arrival_s"][admitted] * 1e9,
                                     start + rows["finish_s"][admitted] * 1e9]).astype(np.int64)
        finished = {int(i) for i in rows["id"][admitted & (rows["counted"] == 1)]}
        fit = fit_request_energy(run.log, run.knots, run.idle_w, *run.span, draws=DRAWS)
        sweep.earlier.append(Measured(label, run.log, list(run.knots), *run.window, fit,
                                      JointMaterial(run.span, run.idle_w, directory, lifetimes, finished)))
    return sweep


def test_a_sweep_writes_the_joint_block_into_each_rates_record(recorded: dict[str, tuple[RateWindow, dict]],
                                                               tmp_path: Path) -> None:
    sweep = _sweep(recorded, tmp_path)
    before = {label: json.loads((tmp_path / f"rate_{label}" / "run_record.json").read_text()) for label in RATES}
    lines: list[str] = []
    write_joint(sweep, lines.append)
    assert len(lines) == len(RATES)
    coefficients = []
    for label, (_, original) in recorded.items():
        path = tmp_path / f"rate_{label}" / "run_record.json"
        written = json.loads(path.read_text())
        energy = written["requests"]["energy"]
        joint = energy.pop("joint")
        assert written == before[label]  # the record is as it was but for the joint block
        assert joint["rates"] == list(RATES) and joint["idle_given"] is True
        assert joint["joint_segments"] > joint["segments"] == original["requests"]["energy"]["segments"]
        (cross,) = joint["cross_rate"]
        assert cross["fitted_at"] == f"all but {label}" and cross["predicted"] == label
        assert len(joint["held_out_halves"]) == 2
        assert joint["controlled_split"] == "no controlled-split window in this invocation"
        failed = [f"held-out half {k + 1}" for k, f in enumerate(joint["held_out_halves"]) if not f["closes"]]
        assert (joint["checks_failed"] == "none") == (not failed and cross["passes"])
        assert joint["requests"] == original["requests"]["energy"]["requests"]
        assert joint["energy_per_request_j"]["p50"] > 0
        coefficients.append(joint["coefficients"])
        assert any(label in line and "joint per-request fit" in line for line in lines)
    assert coefficients[0] == coefficients[1]  # shared


def test_a_single_rate_keeps_todays_block(recorded: dict[str, tuple[RateWindow, dict]], tmp_path: Path) -> None:
    sweep = _sweep({"8": recorded["8"]}, tmp_path)
    assert joint_blocks(sweep) == {}
    before = (tmp_path / "rate_8" / "run_record.json").read_text()
    write_joint(sweep, lambda line: pytest.fail(line))
    assert (tmp_path / "rate_8" / "run_record.json").read_text() == before


def test_the_replay_by_the_drivers_code_reproduces_every_records_checks_and_coefficients(tmp_path: Path) -> None:
    """The sweep's rates 4 and 8 fitted again as the driver fits them (serving_energy per rate, in order): the records
    predate the card state, so the model they name is the one without it; a changed coefficient is caught."""
    for label in RATES:
        shutil.copytree(SWEEP / f"rate_{label}", tmp_path / f"rate_{label}")
    assert differences(tmp_path) == []
    path = tmp_path / "rate_8" / "run_record.json"
    record = json.loads(path.read_text())
    record["requests"]["energy"]["coefficients"]["decode_steps"] *= 1.001
    record["requests"]["energy"]["held_out_halves"][0]["closes"] ^= True
    path.write_text(json.dumps(record))
    found = differences(tmp_path)
    assert len(found) == 2 and found[0].startswith("rate 8: coefficient decode_steps") and "held-out halves" in found[1]


def test_a_rate_left_out_of_the_joint_fit_is_named_with_why(recorded: dict[str, tuple[RateWindow, dict]],
                                                          tmp_path: Path) -> None:
    sweep = _sweep(recorded, tmp_path)
    shutil.copytree(tmp_path / "rate_8", tmp_path / "rate_max")
    sweep.left_out["max"] = (tmp_path / "rate_max", "no trace beside the record")
    lines: list[str] = []
    write_joint(sweep, lines.append)
    blocks = {label: json.loads((tmp_path / f"rate_{label}" / "run_record.json").read_text())["requests"]["energy"]
              ["joint"] for label in (*RATES, "max")}
    assert all(blocks[label]["rates"] == list(RATES) for label in RATES)
    assert all(block["rates_left_out"] == {"max": "no trace beside the record"} for block in blocks.values())
    assert blocks["max"]["unavailable_reason"] == ("left out of the joint fit over rates 4, 8: no trace beside the "
                                                   "record")
    assert any(line.startswith("rate max: joint per-request fit n/a (left out: max;") for line in lines)
    assert max(map(len, lines)) <= 160


def test_a_sweep_with_one_rate_to_fit_says_why_it_has_no_joint_fit(recorded: dict[str, tuple[RateWindow, dict]],
                                                                    tmp_path: Path) -> None:
    """Two rates (a `--rates 10,max` sweep) of which one has too few counter segments in its span: neither gets a joint
    fit, and each record says which rate was left out for what."""
    sweep = _sweep(recorded, tmp_path)
    short = sweep.earlier[1].joint
    assert short is not None
    short.span = (short.span[0], short.span[0] + 1e9)  # one second: about ten counter segments
    write_joint(sweep, lambda line: None)
    for label in RATES:
        joint = json.loads((tmp_path / f"rate_{label}" / "run_record.json").read_text())["requests"]["energy"]["joint"]
        assert joint["unavailable_reason"].startswith("fewer than 2 rates of the sweep can be fitted together (left "
                                                      "out: rate 8: ")
        assert "counter segments inside its span, the fit needs 20" in joint["rates_left_out"]["8"]


def test_the_joint_block_names_its_clock_term_and_each_checks_conditions(
        recorded: dict[str, tuple[RateWindow, dict]], tmp_path: Path) -> None:
    blocks = joint_blocks(_sweep(recorded, tmp_path))
    for label, block in blocks.items():
        term = block["clock_term"]
        assert term["form"] == FORM and term["adopted"] == (term["unadopted_reason"] is None)
        assert [h["rate"] for h in term["held_out_rates"]] == list(RATES)  # each rate left out, without and with
        assert (term["alpha"] is not None) and term["reference_clock_mhz"] == 1980.0
        conditions = block["fitted_conditions"]
        assert 0 <= conditions["capped_share"] <= 1 and conditions["sm_clock_mhz"] <= 1980
        for check in (*block["held_out_halves"], *block["cross_rate"]):
            assert check["conditions"]["fitted"] and check["conditions"]["predicted"]
            passes = check.get("closes", check.get("passes"))
            assert ("measured_cause" in check) == (not passes), (label, check)


def test_the_power_cap_term_is_not_tried_where_a_check_would_fit_its_law_on_no_capped_step(
        recorded: dict[str, tuple[RateWindow, dict]]) -> None:
    """Rate 4's steps marked never capped: the law fitted on every rate exists (rate 8's capped steps), but predicting
    rate 8 from rate 4 alone would need a law from steps never capped, so the term is refused, naming that."""
    slow, fast = (recorded[label][0] for label in RATES)
    free = dataclasses.replace(slow, log=slow.log.with_state(slow.log.sm_clock_hz, np.zeros(len(slow.log.t0_ns))))
    joint = fit_joint([free, fast], draws=DRAWS)
    assert fast.log.capped is not None and np.any(fast.log.capped > 0)
    assert not joint.cap.adopted and joint.cap.term is None and joint.cap_fits is None
    assert joint.cap.reason == (f"a check's training data (the other rates, or a rate but its held-out half): "
                                f"{NEVER_CAPPED}")
    assert joint.columns == COLUMNS
