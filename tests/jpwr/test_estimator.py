"""The window-energy estimator on synthetic signals whose true energy is known."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jpwr.aliasing import CONSERVATIVE_BOUND as ALIASING_RELATIVE_BOUND
from jpwr.domains import Sensor, Signal
from jpwr.estimator import (
    PowerCurve,
    aliasing_warning,
    counter_segments,
    domain_window_energy,
)
from jpwr.trace_io import SensorSeries

from .synthetic import NS, counter_series, integral, power_series, square_wave, steps

LOAD = steps([(0.0, 120.0), (3.0, 690.0), (9.0, 120.0)])


def test_counter_anchored_window_matches_true_energy_within_bound():
    # 1 Hz plus the sampler's chase after each mark: reads every 10 ms until the counter ticks
    chase = [t + k * 0.01 for t in (3.2, 8.7) for k in range(16)]
    counter = counter_series(LOAD, sorted(list(np.arange(0.05, 12.0, 1.0)) + chase), phase=0.0371)
    power = power_series(LOAD, 0.0, 12.0)
    result = domain_window_energy(counter, power, int(3.2 * NS), int(8.7 * NS), 0.1, 840.0)
    truth = integral(LOAD, 3.2, 8.7)
    assert result.method == "counter+power"
    assert result.coverage == pytest.approx(1.0)
    assert abs(result.energy_j - truth) <= result.error_bound_j
    assert result.error_bound_j < 0.015 * truth  # a 5.5 s window at 690 W: about 1 % (0.3 % at 30 s)


def test_counter_alone_is_linear_between_knots_and_bounded():
    counter = counter_series(LOAD, list(np.arange(0.05, 12.0, 0.5)))
    result = domain_window_energy(counter, None, int(1.0 * NS), int(11.0 * NS), 0.1, 840.0)
    truth = integral(LOAD, 1.0, 11.0)
    assert result.method == "counter"
    assert abs(result.energy_j - truth) <= result.error_bound_j


def test_power_only_uses_zero_order_hold_clipped_to_window():
    # Zeus's PowerMonitor returned 200 J and 0 J for these windows (reference note section 8).
    power = steps([(0.0, 100.0), (1.0, 300.0), (2.0, 100.0)])
    series = power_series(power, 0.0, 3.05, poll_s=0.05)
    full = domain_window_energy(None, series, 0, 3 * NS, 0.05, 400.0)
    inner = domain_window_energy(None, series, int(0.2 * NS), int(2.9 * NS), 0.05, 400.0)
    assert full.method == "power"
    assert full.energy_j == pytest.approx(500.0, rel=0.02)
    assert inner.energy_j == pytest.approx(integral(power, 0.2, 2.9), rel=0.02)


def test_averaged_power_lag_is_in_the_bound():
    """A 1 s trailing average integrated naively reads low at a load step; the bound must cover it."""
    true = steps([(0.0, 100.0), (2.0, 700.0)])
    sensor = Sensor("d/power_average", "d", Signal.POWER_AVERAGE, est_update_s=0.1, avg_window_s=1.0)
    times = np.arange(0.0, 8.0, 0.1)
    avg = [integral(true, max(0.0, t - 1.0), t) / min(1.0, max(t, 1e-9)) if t > 0 else 100.0 for t in times]
    stamps = (times * NS).astype(np.int64)
    series = SensorSeries(sensor, stamps, stamps, np.array(avg))
    result = domain_window_energy(None, series, 2 * NS, 6 * NS, 0.1, 840.0)
    truth = integral(true, 2.0, 6.0)
    assert abs(result.energy_j - truth) <= result.error_bound_j


def test_counter_wrap_is_unwrapped():
    counter = counter_series(LOAD, list(np.arange(0.05, 12.0, 0.25)), wrap_at=2_000.0)
    result = domain_window_energy(counter, None, int(1.0 * NS), int(11.0 * NS), 0.1, 840.0)
    assert abs(result.energy_j - integral(LOAD, 1.0, 11.0)) <= result.error_bound_j


def test_counter_reset_splits_and_power_fills_the_gap():
    reads = list(np.arange(0.05, 12.0, 0.5))
    counter = counter_series(LOAD, reads)
    counter.value[12:] -= counter.value[12] - 10.0  # driver reload: counter restarts near zero
    power = power_series(LOAD, 0.0, 12.0)
    segments, breaks = counter_segments(counter, 0.1)
    assert len(segments) == 2 and [k.kind for k in breaks] == ["counter_backward"]
    result = domain_window_energy(counter, power, int(1.0 * NS), int(11.0 * NS), 0.1, 840.0)
    assert any("went backwards" in w for w in result.warnings)
    assert abs(result.energy_j - integral(LOAD, 1.0, 11.0)) <= result.error_bound_j


def test_missing_data_is_unavailable_not_zero():
    empty = SensorSeries(Sensor("d/power_instant", "d", Signal.POWER_INSTANT), np.array([], dtype=np.int64),
                         np.array([], dtype=np.int64), np.array([]))
    result = domain_window_energy(None, empty, 0, NS, 0.1, 500.0)
    assert result.energy_j is None and result.reason


def test_gap_in_power_lowers_coverage():
    power = power_series(LOAD, 0.0, 12.0)
    keep = (power.t_ns < 4 * NS) | (power.t_ns > 6 * NS)
    holed = SensorSeries(power.sensor, power.t_before_ns[keep], power.t_after_ns[keep], power.value[keep])
    result = domain_window_energy(None, holed, 3 * NS, 8 * NS, 0.1, 840.0)
    assert result.coverage < 0.7
    assert result.error_bound_j >= 1.5 * 840.0  # the hole is charged at full power


def test_aliasing_rule():
    assert aliasing_warning(10.0, 100, 0.1) is not None  # p = 100 ms = T
    assert aliasing_warning(10.0, 50, 0.1) is not None  # p = 200 ms = 2T
    assert aliasing_warning(10.0, 270, 0.1) is None  # p = 37 ms: many steps per period
    assert aliasing_warning(10.3, 100, 0.1) is None  # p = 103 ms: drifts 3 ms/step, 300 ms over the window
    assert aliasing_warning(30.02, 1, 0.1) is None  # one step: nothing repeats
    assert aliasing_warning(60.0, 20, 0.1) is None  # 3 s steps span 30 sensor periods each


def test_aliased_window_widens_bound_and_warns():
    wave = square_wave(120.0, 690.0, period=0.1, on=0.03)
    counter = counter_series(wave, [*list(np.arange(0.05, 10.0, 1.0)), 1.0, 9.0])
    result = domain_window_energy(counter, None, 1 * NS, 9 * NS, 0.1, 840.0, steps=80)
    assert any("aliasing" in w for w in result.warnings)
    assert result.error_bound_j >= ALIASING_RELATIVE_BOUND * result.energy_j


@settings(max_examples=40, deadline=None)
@given(t0=st.floats(0.5, 5.0), length=st.floats(1.0, 6.0), phase=st.floats(0.0, 0.1),
       poll=st.sampled_from([0.25, 0.5, 1.0]))
def test_energy_within_bound_for_any_window_and_phase(t0, length, phase, poll):
    reads = sorted([*list(np.arange(0.03, 12.0, poll)), t0 + 0.001, t0 + length + 0.001])
    counter = counter_series(LOAD, reads, phase=phase)
    power = power_series(LOAD, 0.0, 12.0)
    result = domain_window_energy(counter, power, int(t0 * NS), int((t0 + length) * NS), 0.1, 840.0)
    truth = integral(LOAD, t0, t0 + length)
    assert abs(result.energy_j - truth) <= result.error_bound_j + 1.0  # +1 J: the test's own quadrature


def test_nested_windows_add_up():
    counter = counter_series(LOAD, list(np.arange(0.05, 12.0, 0.5)))
    power = power_series(LOAD, 0.0, 12.0)
    whole = domain_window_energy(counter, power, 1 * NS, 9 * NS, 0.1, 840.0).energy_j
    parts = sum(domain_window_energy(counter, power, a * NS, b * NS, 0.1, 840.0).energy_j
                for a, b in [(1, 4), (4, 7), (7, 9)])
    assert parts == pytest.approx(whole, rel=1e-9)


def test_power_curve_carries_in_last_sample_before_window():
    series = power_series(steps([(0.0, 200.0)]), 0.0, 1.0, poll_s=0.5)  # samples at 0.0 and 0.5
    curve = PowerCurve(series, 0.5)
    energy, covered = curve.integral(0.2 * NS, 0.4 * NS)
    assert energy == pytest.approx(40.0) and covered == pytest.approx(0.2 * NS)


def test_frozen_counter_is_flagged_against_power():
    counter = counter_series(LOAD, list(np.arange(0.05, 12.0, 0.5)))
    counter.value[4:] = counter.value[4]  # the counter stops moving (MI100-style freeze)
    counter.value[-1] += 1.0  # ...but is not constant, so it still forms knots
    power = power_series(LOAD, 0.0, 12.0)
    result = domain_window_energy(counter, power, 3 * NS, 9 * NS, 0.1, 840.0)
    assert any("disagree" in w for w in result.warnings)
