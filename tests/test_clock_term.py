"""The card-state term of the per-request model (joulebench/clock_term.py) and the card state it reads
(joulebench/card_state.py), on planted runs and on the recorded 2026-11-25 H100 sweep.

Planted: three loads of 3, 7 and 20 requests/s into 64 slots (tests/serving_run.serve, metered through the fake
pynvml and the real sampler) whose SM clock alternates between 1980 and 1600 MHz every 1.5 s; each step's work
energy is the planted costs times (f / 1980 MHz)^alpha. With alpha 2 the fits find it and adopt the term (it
predicts the rates left out better); with alpha 0 (the clock moves, the energy does not follow) they do not.
Recorded: the card state per counter segment is the median of the trace's own readings inside it; a check's
conditions name the decode's attended length (the 2026-12-06 H100 run whose controlled decode failed).
"""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest

from joulebench.cap_term import CLOCK_ADOPTED, NO_CAP_STATE
from joulebench.card_state import Comparison, check_fields
from joulebench.clock_term import NO_CLOCK, NO_HELD_OUT, ONE_CLOCK
from joulebench.joint_energy import JointFit, RateWindow, fit_joint
from joulebench.request_energy import (
    COLUMNS,
    HeldOutWindow,
    cross_check,
    fit_request_energy,
    fit_with_cap_trial,
    fit_with_clock_trial,
    work_conditions,
)
from joulebench.requests_table import StepKind, read_requests
from joulebench.segment_fit import window_segments
from llm_inference.serving_energy import controlled_intervals, steps_work_log, trace_knots
from tests import serving_run
from tests.serving_run import COSTS, F_MAX, IDLE_W

SWEEP = Path(__file__).parent.parent / "benchmarks/results/2026-11-25-session10/serving-compact/sweep"
P59R = Path(__file__).parent.parent / ("benchmarks/results/2026-12-06-wave5-s4/issue59/serving-256/p59r/branch/"
                                       "continuous-256/run")
DRAWS = 40
PLANTED = 2.0
PLANS = ((1, 3.0, 60), (6, 7.0, 140), (3, 20.0, 300))  # seed, requests/s, requests


def _clock(t: float) -> float:
    return F_MAX if int(t / 1.5) % 2 == 0 else 1.6e9


def _runs(root: Path, alpha: float) -> list[RateWindow]:
    import pynvml  # the fake (tests/conftest.py puts tests/fakes first)

    runs = []
    for seed, rate, requests in PLANS:
        log, _, schedule = serving_run.serve(seed, rate, requests, 64, clock_hz=_clock, alpha=alpha)
        knots = serving_run.meter(schedule, root / str(rate), pynvml, seed + 10)
        span = (float(log.t0_ns[0]), float(log.t1_ns[-1]))
        runs.append(RateWindow(f"{rate:g}/s", log, knots, IDLE_W, span, span))
    return runs


@pytest.fixture(scope="module")
def clocked(tmp_path_factory: pytest.TempPathFactory) -> list[RateWindow]:
    return _runs(tmp_path_factory.mktemp("clocked"), PLANTED)


@pytest.fixture(scope="module")
def unclocked(tmp_path_factory: pytest.TempPathFactory) -> list[RateWindow]:
    """The same clock, energy that does not follow it."""
    return _runs(tmp_path_factory.mktemp("unclocked"), 0.0)


@pytest.fixture(scope="module")
def joint(clocked: list[RateWindow]) -> JointFit:
    return fit_joint(clocked, draws=DRAWS)


def test_the_joint_fit_finds_the_planted_exponent_and_adopts_the_term(joint: JointFit,
                                                                      clocked: list[RateWindow]) -> None:
    trial = joint.clock
    assert trial.adopted and trial.term is not None, trial.reason
    assert trial.term.exponent == pytest.approx(PLANTED, abs=0.3) and trial.term.reference_hz == F_MAX
    record = trial.to_dict()
    assert record["rms_error_with"] < record["rms_error_without"]
    assert [h["rate"] for h in record["held_out_rates"]] == [r.label for r in clocked]
    assert record["alpha_likelihood_ratio"] > record["alpha_determined_above"]
    for column in ("prefill_tokens", "decode_steps"):  # the large costs, at the reference clock
        assert joint.coefficients[COLUMNS.index(column)] == pytest.approx(COSTS[column], rel=0.05), column
    planted = np.array([COSTS[c] for c in COLUMNS])
    for run in clocked:  # each run's work as the planted costs count it at the reference clock
        amounts = run.log.amounts(np.array([run.span[0]]), np.array([run.span[1]]))[0]
        assert amounts @ joint.coefficients[:len(COLUMNS)] == pytest.approx(amounts @ planted, rel=0.02)
    for run in clocked:  # every check out of sample, alpha too: each rate left out is predicted, each half closes
        model = joint.left_out[run.label]
        assert not isinstance(model, str) and model.clock is not None
        assert cross_check(model, run.log, run.knots, *run.window).passes
        assert joint.per_rate[run.label].clock == trial.term
        assert all(fold.closes for fold in joint.per_rate[run.label].folds)


def test_without_the_term_the_same_runs_are_predicted_worse(joint: JointFit, clocked: list[RateWindow]) -> None:
    base = fit_joint(clocked, draws=DRAWS, clock=False)
    assert base.clock.reason == "not tried (the fit was asked without it)"
    for held in joint.clock.held_out:  # the trial's "without" is the plain fit's leave-one-rate-out prediction
        run = next(r for r in clocked if r.label == held.label)
        model = base.left_out[run.label]
        assert not isinstance(model, str)
        assert held.without_j == model.predict(run.log, *run.window)[0]
    errors = np.array([(h.error_without, h.error_with) for h in joint.clock.held_out])
    assert np.sum(errors[:, 1] ** 2) < np.sum(errors[:, 0] ** 2)
    assert np.sqrt(np.mean(errors[:, 0] ** 2)) == pytest.approx(joint.clock.to_dict()["rms_error_without"])


def test_a_clock_the_energy_does_not_follow_is_not_adopted(unclocked: list[RateWindow]) -> None:
    joint = fit_joint(unclocked, draws=DRAWS)
    base = fit_joint(unclocked, draws=DRAWS, clock=False)
    assert not joint.clock.adopted and joint.clock.reason
    assert "not determined" in joint.clock.reason or "does not predict the held-out rates better" in joint.clock.reason
    np.testing.assert_array_equal(joint.coefficients, base.coefficients)  # the fit without the term, as it was
    assert joint.per_rate[unclocked[0].label].clock is None


def test_no_clock_or_one_clock_leaves_no_term_to_fit(clocked: list[RateWindow]) -> None:
    bare = [RateWindow(r.label, r.log.with_state(None, None), r.knots, r.idle_w, r.span, r.window) for r in clocked]
    assert fit_joint(bare, draws=DRAWS).clock.reason == NO_CLOCK
    one = [RateWindow(r.label, r.log.with_state(np.full(len(r.log.t0_ns), 1.7e9), None), r.knots, r.idle_w, r.span,
                      r.window) for r in clocked]
    assert fit_joint(one, draws=DRAWS).clock.reason == ONE_CLOCK


def test_the_per_rate_fit_tries_the_term_on_earlier_rates(clocked: list[RateWindow]) -> None:
    first, second, _ = clocked
    plain = fit_request_energy(second.log, second.knots, IDLE_W, *second.span, draws=DRAWS)
    alone, trial = fit_with_clock_trial(second.log, second.knots, IDLE_W, *second.span, [], draws=DRAWS)
    assert trial.reason == NO_HELD_OUT and trial.term is None
    np.testing.assert_array_equal(alone.coefficients, plain.coefficients)
    held = [HeldOutWindow(first.label, first.log, first.knots, *first.window)]
    fit, trial = fit_with_clock_trial(second.log, second.knots, IDLE_W, *second.span, held, draws=DRAWS)
    assert trial.term is not None and trial.term.exponent == pytest.approx(PLANTED, abs=0.5)
    assert trial.adopted == (trial.to_dict()["rms_error_with"] < trial.to_dict()["rms_error_without"])
    assert (fit.clock is not None) == trial.adopted
    chosen, cap = fit_with_cap_trial(second.log, second.knots, IDLE_W, *second.span, held, fit, trial, draws=DRAWS)
    assert chosen is fit and cap.term is None  # the power-cap term: tried only where the clock term is not adopted
    assert cap.reason == (CLOCK_ADOPTED if trial.adopted else NO_CAP_STATE)  # (no cap share planted: n/a)


def test_a_check_records_the_conditions_of_its_two_sides(clocked: list[RateWindow]) -> None:
    slow, _, fast = clocked
    fit = fit_request_energy(slow.log, slow.knots, IDLE_W, *slow.span, draws=DRAWS)
    check = cross_check(fit, fast.log, fast.knots, *fast.window)
    assert check.conditions == Comparison(fit.fitted, work_conditions([(fast.log, *fast.window)]))
    fitted_span = (float(fit.segments.t0_ns.min()), float(fit.segments.t1_ns.max()))
    assert fit.fitted == work_conditions([(slow.log, *fitted_span)]) and len(fit.fold_conditions) == len(fit.folds)
    for side in (check.conditions.fitted, check.conditions.predicted):
        assert side.sm_clock_mhz in (F_MAX / 1e6, 1600.0) and side.capped_share is None  # no cap planted: n/a


def test_a_failing_check_names_the_state_and_step_sizes_of_its_two_sides() -> None:
    """Batches of 8 rows of 64-token prompts at 1980 MHz against 64 rows of 16-token prompts at 1600 MHz: every
    prefill step holds 512 and 1024 tokens, every decode step 8 and 64 rows."""
    small, _ = serving_run.fixed_batches(3, 8, 64, 60, 3.0)
    large, _ = serving_run.fixed_batches(7, 64, 16, 30, 3.0)
    small = small.with_state(np.full(len(small.t0_ns), F_MAX), np.zeros(len(small.t0_ns)))
    large = large.with_state(np.full(len(large.t0_ns), 1.6e9), np.ones(len(large.t0_ns)))
    sides = Comparison(work_conditions([(small, 0.0, np.inf)]), work_conditions([(large, 0.0, np.inf)]))
    assert sides.decode_rows_factor == pytest.approx(8.0) and sides.prefill_step_factor == pytest.approx(2.0)
    # decode step j of a batch attends prompt + j positions a row: prompt + (decodes - 1) / 2 on average
    assert sides.decode_positions_factor == pytest.approx((16 + 29 / 2) / (64 + 59 / 2))
    fields = check_fields(sides, passes=False)
    assert fields["conditions"] == sides.to_dict() and "measured_cause" not in check_fields(sides, passes=True)
    assert fields["measured_cause"] == ("card state fitted 1980 MHz, 0% capped, predicted 1600 MHz, 100% capped; "
                                        "step size predicted/fitted: prefill 2x (1024 vs 512 tokens), decode 8x "
                                        "(64 vs 8 rows) attending 0.33x (30 vs 94 KV positions a row), decode rows "
                                        "p5-p95 64-64 vs 8-8")


def test_a_decode_check_names_the_attended_length_it_extrapolates_to() -> None:
    """The H100 run of 2026-12-06 (llama-8b, 256 rows, rate max; its controlled decode failed by +10.5 %): its
    controlled decode attended longer rows than the serving window's decode, which the rows per step (251 vs 249)
    do not show. Each side's positions a row are the step log's own: its decode members' attended KV tokens over
    their count."""
    with h5py.File(P59R / "requests.h5", "r") as h5:
        own = {name: {key: h5[f"{name}/{key}"][()] for key in ("kind", "member_offsets", "member_amount", "t0_ns",
                                                                  "t1_ns")} for name in ("steps", "controlled_steps")}

    def positions(steps: dict[str, np.ndarray], inside: np.ndarray) -> float:
        decode = (steps["kind"] == StepKind.DECODE) & inside
        member = np.repeat(decode, np.diff(steps["member_offsets"]))
        return float(steps["member_amount"][member].sum() / member.sum())

    table = read_requests(P59R / "requests.h5")
    window = tuple(float(t) for t in table.attrs["window_ns"])  # the serving window's edges
    serving, controlled = steps_work_log(table.steps), steps_work_log(table.controlled_steps)
    decode = controlled_intervals(table.controlled_steps)[1]
    sides = Comparison(work_conditions([(serving, *window)]), work_conditions([(controlled, *decode)]))
    steps = own["steps"]
    assert sides.fitted.decode_row_positions == pytest.approx(
        positions(steps, (steps["t0_ns"] >= window[0]) & (steps["t1_ns"] <= window[1])))
    assert sides.predicted.decode_row_positions == pytest.approx(
        positions(own["controlled_steps"], np.ones(len(own["controlled_steps"]["kind"]), bool)))
    factor = sides.decode_positions_factor
    assert factor is not None and factor > 1.3 and sides.decode_rows_factor == pytest.approx(1.0, abs=0.02)
    assert f"attending {factor:.2g}x" in sides.cause()


def test_each_segment_gets_the_median_clock_and_capped_share_of_its_readings() -> None:
    directory = SWEEP / "rate_32"
    counter = trace_knots(directory / "jpwr")
    assert counter.state is not None and counter.state.capped is not None
    segments = window_segments(counter.knots, -np.inf, np.inf)
    clock, capped = counter.state.per_segment(segments)
    assert capped is not None
    with h5py.File(next((directory / "jpwr").glob("*/trace.h5")), "r") as h5:  # the trace's own readings
        names = np.array([n.decode() for n in h5["metrics/name"][()]])
        t_ns, values = h5["metrics/t_ns"][()], h5["metrics/value"][()]
    for k in range(0, len(segments), 37):
        inside = (t_ns >= segments.t0_ns[k]) & (t_ns <= segments.t1_ns[k])
        readings = values[inside & (names == "sm_clock_hz")]
        reasons = values[inside & (names == "throttle_reasons")].astype(np.int64)
        if len(readings) and len(reasons):
            assert clock[k] == np.median(readings)
            assert capped[k] == np.mean((reasons & 0x4) > 0)  # NVML's SW power cap bit
    assert 0 < capped.mean() < 1 and clock.min() < clock.max()


def test_a_failing_checks_cause_names_the_range_of_rows_per_decode_step() -> None:
    """2026-12-06's held-out half 2 at rate max (docs/BENCHMARKS.md, "Why the held-out second half fails"): its mean
    rows per step are near half 1's, but its drain's few-row steps are outside anything half 1 holds; the cause names
    both sides' 5th-95th percentile of rows per decode step (step-weighted, from the step log)."""
    table = read_requests(P59R / "requests.h5")
    steps = table.steps
    log = steps_work_log(steps)
    start, end = float(table.attrs["window_ns"][0]), float(np.max(steps["t1_ns"]))
    middle = (start + end) / 2
    sides = Comparison(work_conditions([(log, start, middle)]), work_conditions([(log, middle, end)]))
    decode = np.asarray(steps["kind"]) == StepKind.DECODE
    rows = np.diff(steps["member_offsets"])[decode]
    late = rows[np.asarray(steps["t0_ns"])[decode] >= middle]
    assert sides.predicted.decode_rows_p5 == pytest.approx(np.quantile(late, 0.05), abs=1)  # whole steps: exact
    fitted, predicted = sides.fitted, sides.predicted
    assert fitted.decode_rows_p5 is not None and predicted.decode_rows_p5 is not None
    assert predicted.decode_rows_p5 < fitted.decode_rows_p5 / 2  # the drain: far below anything fitted
    assert f"decode rows p5-p95 {predicted.decode_rows_p5:.0f}-{predicted.decode_rows_p95:.0f} vs " \
           f"{fitted.decode_rows_p5:.0f}-{fitted.decode_rows_p95:.0f}" in sides.cause()
