"""Idle baseline and cooldown: settling on live readings, the idle window, the idle/dynamic split.

The sampler and estimator are the production code on the recorded H100 trace (fake pynvml only).
"""

from __future__ import annotations

import pytest

from joulebench.launch import LaunchEnv
from jpwr.clock import VirtualClock
from jpwr.energy import IdleBaseline, Window, WindowEnergy, split_energy
from jpwr.idle import CPU_IDLE, SettleRule, wait_until_settled
from jpwr.meter import NO_SAMPLER_REASON, WindowMeter
from tests.jpwr.synthetic import NS
from tests.jpwr.test_sampler_replay import _dense_counter_energy, _drive, _replay_sampler

SINGLE = LaunchEnv.from_env({})


class DrivenClock:
    """The replay's virtual clock; sleeping polls the sampler every tick, as its thread would."""

    def __init__(self, sampler, clock: VirtualClock) -> None:
        self.sampler, self.clock = sampler, clock

    def monotonic_ns(self) -> int:
        return self.clock.monotonic_ns()

    def wall_ns(self) -> int:
        return self.clock.wall_ns()

    def sleep_until_ns(self, deadline_ns: int, stop=None) -> bool:
        _drive(self.sampler, self.clock, deadline_ns / NS)
        return True


def test_waits_until_power_has_settled_after_a_load(fake_pynvml, h100_trace_dir, tmp_path):
    sampler, clock = _replay_sampler(fake_pynvml, h100_trace_dir, tmp_path)
    _drive(sampler, clock, 9.0)  # inside the recorded 8 s matmul (3-11 s); idle follows at 11-14 s
    rule = SettleRule(max_wait_s=20.0, hold_s=2.0)
    result = wait_until_settled(sampler.live, rule, DrivenClock(sampler, clock))
    assert result.settled and "settled after" in result.note
    assert 11.0 + rule.hold_s - 9.0 <= result.waited_s <= 14.0 - 9.0  # two idle seconds after the load stopped


def test_gives_up_after_the_bounded_wait_and_says_why(fake_pynvml, h100_trace_dir, tmp_path):
    sampler, clock = _replay_sampler(fake_pynvml, h100_trace_dir, tmp_path)
    _drive(sampler, clock, 5.0)
    result = wait_until_settled(sampler.live, SettleRule(max_wait_s=3.0, hold_s=2.0), DrivenClock(sampler, clock))
    assert not result.settled
    assert result.waited_s >= 3.0 and "not settled within 3 s" in result.note and "power moved" in result.note


def test_idle_window_gives_the_baseline_and_every_window_its_split(fake_pynvml, h100_trace_dir, tmp_path):
    replay = fake_pynvml.configure(h100_trace_dir)  # real time: the trace starts with 3 s of idle
    meter = WindowMeter.open(SINGLE, methods="nvml", out_dir=tmp_path)
    try:
        baseline = meter.measure_idle(CPU_IDLE)
        meter.begin("steady", 0)
        meter.clock.sleep_until_ns(meter.clock.monotonic_ns() + NS // 2)
        meter.end("steady", 5)
        meter.attach_energy()
    finally:
        meter.close()
    idle, steady = meter.windows
    assert idle.name == "idle" and idle.end_reason.startswith("idle baseline")
    counter_j = _dense_counter_energy(replay, idle.t_start_ns, idle.t_end_ns)
    assert baseline.devices == 1 and baseline.method == "counter+power" and baseline.unavailable_reason is None
    assert abs(baseline.power_w * idle.duration_s - counter_j) <= baseline.error_bound_w * idle.duration_s + 1e-9
    assert isinstance(baseline.settled, bool) and baseline.settle_note
    split = steady.split
    assert split.idle_power_w == baseline.power_w
    assert split.idle_j == pytest.approx(baseline.power_w * steady.duration_s)
    assert split.dynamic_j == pytest.approx(steady.energy.energy_j - split.idle_j)
    assert split.dynamic_bound_j == pytest.approx(steady.energy.error_bound_j + split.idle_bound_j)


def test_without_a_sampler_the_baseline_is_unavailable_at_once(monkeypatch):
    monkeypatch.delenv("JPWR_ADDR", raising=False)
    meter = WindowMeter.open(SINGLE)
    baseline = meter.measure_idle(CPU_IDLE)
    assert baseline.power_w is None and baseline.unavailable_reason == NO_SAMPLER_REASON
    assert meter.windows == []  # nothing was marked, nothing waited for


def _energy(joules: float | None, devices: int = 1) -> WindowEnergy:
    if joules is None:
        return WindowEnergy.unavailable("sensor lost", devices)
    return WindowEnergy(energy_j=joules, mean_power_w=joules / 10, devices=devices, method="counter+power",
                        coverage=1.0, error_bound_j=20.0)


def test_split_bounds_add_and_unknowns_stay_unknown():
    baseline = IdleBaseline(power_w=120.0, error_bound_w=1.5, devices=1)
    split = split_energy(_energy(7000.0), 10.0, baseline)
    assert (split.idle_j, split.idle_bound_j) == (1200.0, 15.0)
    assert (split.dynamic_j, split.dynamic_bound_j) == (5800.0, 35.0)
    cases = {
        "no idle baseline was measured": split_energy(_energy(7000.0), 10.0, None),
        "skipped": split_energy(_energy(7000.0), 10.0, IdleBaseline.unavailable("skipped (--no-idle-baseline)")),
        "sensor lost": split_energy(_energy(None), 10.0, baseline),
        "covers 1 devices, the window 2": split_energy(_energy(7000.0, devices=2), 10.0, baseline),
    }
    for text, result in cases.items():
        assert result.idle_j is None and result.dynamic_j is None and text in result.unavailable_reason


def test_window_keeps_its_split_and_end_reason_through_json():
    window = Window("steady", 5, 15, 0, 10 * NS, {"tokens": 1.0}, _energy(7000.0), end_reason="planned length")
    baseline = IdleBaseline(power_w=120.0, error_bound_w=1.5, devices=1)
    window.split = split_energy(window.energy, window.duration_s, baseline)
    again = Window.from_dict(window.to_dict())
    assert again.split == window.split and again.end_reason == "planned length"
