"""Steady windows sized by time and bound (joulebench.sizing), planned from the sampler's live readings.

The live readings come from the production sampler replaying the recorded H100 trace through the
fake pynvml on a virtual clock; the rule's honesty is checked against the estimator's own bounds.
"""

from __future__ import annotations

import dataclasses
import math
import time

import pytest

from joulebench.launch import LaunchEnv
from joulebench.sizing import (
    ASSUMED_UPDATE_S,
    MAX_SECONDS,
    MIN_SECONDS,
    STEP_UNCERTAINTY,
    TARGET_BOUND_FRACTION,
    StepTimer,
    plan_steady,
    plan_steady_window,
    steady_seconds_arg,
)
from jpwr.channel import Mark
from jpwr.estimator import aliasing_warning, planned_bound_j
from jpwr.live import DeviceLive, NodeLive
from jpwr.meter import WindowMeter
from jpwr.sampler import LocalChannel
from tests.jpwr.test_sampler_replay import _drive, _replay_sampler

# Phases of tests/data/h100_trace (meta.json), seconds from the trace's start.
STEADY = (3.0, 11.0)
IDLE_AFTER_STEADY = (11.0, 14.0)


def _live(update_s: float | None, power: float | None = None, peak: float | None = None) -> NodeLive:
    device = DeviceLive("nvml:GPU-x", update_s, power, power, peak or power, 2.0, None, None, None)
    return NodeLive("n1", 2.0, (device,))


def test_plan_from_the_live_sampler_meets_the_bound_target_in_whole_iterations(fake_pynvml, h100_trace_dir,
                                                                               tmp_path):
    sampler, clock = _replay_sampler(fake_pynvml, h100_trace_dir, tmp_path)
    _drive(sampler, clock, STEADY[1] - 0.5)  # end of a warm-up inside the steady matmul phase
    live = sampler.live(2.0)
    assert live.update_period_s == pytest.approx(0.1)  # the NVML counter's update period
    assert 600 < live.power_w < live.peak_power_w  # the recorded matmul ran at the 700 W cap
    step_s = 0.85
    plan = plan_steady_window(step_s, live)
    edge_over_mean = live.peak_power_w / live.power_w
    needed = planned_bound_j(edge_over_mean, live.update_period_s) / TARGET_BOUND_FRACTION
    assert plan.rule == "bound" and plan.update_period_source == "sampler"
    assert plan.seconds == pytest.approx(needed)
    assert (plan.iterations - 1) * step_s < needed <= plan.iterations * step_s  # whole iterations, no more
    assert plan.predicted_bound_fraction <= TARGET_BOUND_FRACTION
    assert MIN_SECONDS <= plan.iterations * step_s <= MAX_SECONDS
    assert plan.aliasing is None and "planned bound" in plan.reason


def test_planned_bound_covers_the_bound_the_estimator_states(fake_pynvml, h100_trace_dir, tmp_path):
    """The planning model (2·P_edge·T) is at least the bound the estimator then states, on real H100 windows."""
    sampler, clock = _replay_sampler(fake_pynvml, h100_trace_dir, tmp_path)
    for name, (t0, t1) in {"steady": STEADY, "idle": IDLE_AFTER_STEADY}.items():
        _drive(sampler, clock, t0 + 0.3)
        sampler.add_mark(Mark(name, "begin", 0, clock.monotonic_ns()))
        _drive(sampler, clock, t1 - 0.3)
        sampler.add_mark(Mark(name, "end", 1, clock.monotonic_ns()))
        live = sampler.live(t1 - t0 - 0.6)
        energy = sampler.window_energies([name])[name]
        assert energy.method == "counter+power"
        assert 0 < energy.error_bound_j <= planned_bound_j(live.peak_power_w, live.update_period_s), name


@pytest.mark.parametrize(("update_s", "rule", "seconds"), [
    (None, "bound", 2 * ASSUMED_UPDATE_S / TARGET_BOUND_FRACTION),  # no sampler: a 100 ms sensor is assumed
    (0.02, "minimum", MIN_SECONDS),  # a fast sensor: the bound needs only 8 s
    (1.0, "maximum", MAX_SECONDS),  # a 1 s sensor would need 400 s: capped, and the plan says so
])
def test_rule_picks_the_binding_limit(update_s, rule, seconds):
    plan = plan_steady_window(0.5, _live(update_s, 300.0) if update_s else None)
    assert plan.rule == rule and plan.seconds == pytest.approx(seconds)
    assert plan.update_period_source == ("sampler" if update_s else "assumed (no sampler)")
    if rule == "maximum":
        assert plan.predicted_bound_fraction > TARGET_BOUND_FRACTION and "maximum" in plan.reason


def test_explicit_seconds_win_over_the_rule_and_are_whole_iterations():
    plan = plan_steady_window(0.37, _live(0.1, 500.0), seconds=2.0)
    assert plan.rule == "steady-seconds" and plan.iterations == 6  # 6 × 0.37 s is the first count >= 2 s
    assert "--steady-seconds 2" in plan.reason


def test_a_loop_aliasing_with_the_sensor_gets_enough_steps_to_drift_through_its_phases():
    step_s, update_s = 0.1001, 0.1  # one step per sensor period, 0.1 ms off
    plan = plan_steady_window(step_s, _live(update_s, 500.0))
    assert plan.aliasing is None and "lengthened" in plan.reason
    assert plan.iterations * abs(step_s - update_s) >= update_s  # the loop's phase walks once around the sensor's
    locked = plan_steady_window(update_s, _live(update_s, 500.0))  # exactly in step: no length helps
    assert locked.aliasing and "aliasing" in locked.aliasing
    assert "cannot drift" in locked.aliasing_risk and "remedy" in locked.aliasing_risk
    assert locked.iterations * update_s <= MAX_SECONDS  # the longest window within the cap, not more


# The H200 run of the README's JUBE command (shared/reference/measured-2026-11-27.md): GPT-800M at 800.6 ms per
# steady step, 8 NVML update periods of 100 ms and 0.6 ms, over 63 steps: aliased, bound widened to 8 %.
H200_STEADY_S = 0.8006
# The warm-up's median against the steady mean, measured on an H100 (two default GPT-800M runs): 0.45 % and
# 0.72 % below it; the other sign too, for a card whose steady step comes out faster than its warm-up.
WARMUP_OFFSETS = (-0.0072, -0.0045, 0.0, 0.0045, 0.0072)


@pytest.mark.parametrize("offset", WARMUP_OFFSETS)
def test_the_h200_steady_step_near_8_sensor_periods_gets_a_window_that_drifts(fake_pynvml, h100_trace_dir, tmp_path,
                                                                             offset):
    """Planned as the loop plans it (plan_steady on a meter whose sampler reads the NVML counter), from the
    warm-up's step time, judged by the estimator's rule on the steady step the window then runs."""
    sampler, clock = _replay_sampler(fake_pynvml, h100_trace_dir, tmp_path)
    _drive(sampler, clock, STEADY[1] - 0.5)  # end of a warm-up inside the steady matmul phase
    meter = WindowMeter(LaunchEnv.from_env({}), LocalChannel(sampler), clock=clock)
    plan = plan_steady(meter, H200_STEADY_S * (1 + offset), None)
    update_s = plan.update_period_s
    assert plan.update_period_source == "sampler" and update_s == pytest.approx(0.1)
    delta = abs(H200_STEADY_S - round(H200_STEADY_S / update_s) * update_s)
    assert plan.iterations >= math.floor(update_s / delta) + 1  # 167: one walk around the sensor's phases
    assert aliasing_warning(plan.iterations * H200_STEADY_S, plan.iterations, update_s) is None
    assert plan.iterations * H200_STEADY_S <= MAX_SECONDS
    assert "8 × 100 ms" in plan.aliasing_risk and f"capped at {MAX_SECONDS:g} s" in plan.aliasing_risk


def test_the_warmup_step_alone_missed_the_h200_aliasing():
    """Why the rule did not fire: at the warm-up's step (0.72 % faster) the count sized for the bound looked
    clear of the sensor, while the steady step aliased over that count."""
    warmup_s = H200_STEADY_S * (1 + WARMUP_OFFSETS[0])
    plan = plan_steady_window(warmup_s, _live(0.1, 500.0))
    unlengthened = math.ceil(plan.seconds / warmup_s)
    assert aliasing_warning(unlengthened * warmup_s, unlengthened, 0.1) is None
    assert aliasing_warning(unlengthened * H200_STEADY_S, unlengthened, 0.1) is not None
    assert plan.iterations > unlengthened


def test_a_step_near_a_multiple_is_lengthened_until_every_nearby_step_drifts():
    update_s, gap_s = 0.1, 0.0013
    step_s = (8 * update_s + gap_s) / (1 - STEP_UNCERTAINTY)  # the fastest plausible step: 1.3 ms off 800 ms
    plan = plan_steady_window(step_s, _live(update_s, 500.0))
    assert plan.iterations == math.floor(update_s / gap_s) + 1 and plan.aliasing_risk is None
    assert "drifts through every sensor phase" in plan.reason
    plausible = [step_s * (1 + STEP_UNCERTAINTY * k / 10) for k in range(-10, 11)]
    assert all(aliasing_warning(plan.iterations * p, plan.iterations, update_s) is None for p in plausible)


def test_a_step_far_from_any_multiple_keeps_the_bound_length():
    update_s = 0.1
    step_s = 8.5 * update_s  # half a period off: any count of the window drifts
    plan = plan_steady_window(step_s, _live(update_s, 500.0))
    assert plan.iterations == math.ceil(plan.seconds / step_s) and plan.aliasing_risk is None
    assert "lengthened" not in plan.reason


def test_warmup_step_time_is_the_median_after_the_first_step():
    pauses = iter([0.2, 0.01, 0.01, 0.01])
    timer = StepTimer(sync=lambda: None)
    timer.tick()
    for pause in pauses:
        time.sleep(pause)
        timer.tick()
    assert timer.step_s is not None and timer.step_s < 0.1  # the slow first (compiling) step is left out


@pytest.mark.parametrize(("text", "value"), [("auto", None), ("AUTO", None), ("45", 45.0), ("0.5", 0.5)])
def test_steady_seconds_option_values(text, value):
    assert steady_seconds_arg(text) == value


@pytest.mark.parametrize("text", ["0", "-3", "soon"])
def test_steady_seconds_option_refuses_nonsense(text):
    import argparse

    with pytest.raises(argparse.ArgumentTypeError, match="auto"):
        steady_seconds_arg(text)


def test_every_rank_runs_the_plan_rank_0_made_from_its_meter():
    """plan_steady: rank 0 plans from its meter's live readings (none here: no sampler), the rest take its plan."""
    single = LaunchEnv.from_env({})
    alone = plan_steady(WindowMeter(single, None), 0.25, None)
    assert alone == plan_steady_window(0.25, None) and alone.update_period_source == "assumed (no sampler)"
    asked: list[object] = []

    def gather(obj: object) -> list[object]:  # rank 0's plan first, as a rank-ordered all-gather returns it
        asked.append(obj)
        return [alone.to_dict(), obj]

    second = WindowMeter(dataclasses.replace(single, rank=1, local_rank=1, world_size=2, local_world_size=2), None)
    assert plan_steady(second, 9.0, 60.0, gather) == alone and asked == [None]  # rank 1 plans nothing itself


def test_an_asked_length_is_kept_where_the_loop_could_alias_and_the_plan_says_what_that_leaves():
    """Decision (issue 48): --steady-seconds is the user's length; the aliasing rule lengthened a 10 s first look to
    5 minutes. Kept now: the same count as without a sensor near the step, the risk and its remedy named."""
    step_s, update_s = 0.1001, 0.1  # sized by the rule, this loop gets a longer window (the test above)
    plan = plan_steady_window(step_s, _live(update_s, 500.0), seconds=10.0)
    assert plan.iterations == math.ceil(10.0 / step_s) and plan.rule == "steady-seconds"
    assert "not lengthened (--steady-seconds 10 was asked" in plan.reason and "lengthened to" not in plan.reason
    assert "--steady-seconds 10 was asked: the window keeps that length" in plan.aliasing_risk
    assert "remedy" in plan.aliasing_risk and "longer --steady-seconds" in plan.aliasing_risk
    clear = plan_steady_window(0.137, _live(update_s, 500.0), seconds=10.0)  # far from any multiple of 100 ms
    assert clear.iterations == math.ceil(10.0 / 0.137) and clear.aliasing_risk is None
