"""The counter's aliasing per card: the selftest's modes on a part-time counter (spread -> bound), the table and
its lookup, the estimator and `jpwr info` taking a card's bound, and the grid that locks bursts to the counter."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from jpwr import aliasing_table
from jpwr.aliasing import CONSERVATIVE_BOUND, card_bound, implied_bound
from jpwr.aliasing_table import AliasingRow
from jpwr.backends import create_backend
from jpwr.backends.nvml import UPDATE_S
from jpwr.clock import VirtualClock
from jpwr.counter_phase import fit_grid, probe_updates
from jpwr.domains import Signal
from jpwr.estimator import aliasing_warning, domain_window_energy
from jpwr.info import describe
from jpwr.selftest import Load, RunFacts, WindowResult, mode_rows, planned_loads, table_rows

from .synthetic import NS, counter_series, part_time_counter_series, square_wave

IDLE_W, BUSY_W, PERIOD, ON = 100.0, 600.0, 0.1, 0.03
WINDOW = (0.5, 4.5)  # seconds of each synthetic run's 5 s
READS = np.arange(0.0, 5.0, 0.0093)  # the H100's counter read every ~9 ms


def _window(load: Load, burst_phase_s: float) -> WindowResult:
    """One window of 30 % bursts on the part-time counter: its energy as the estimator reads it, work = bursts."""
    period = load.period_s or PERIOD
    wave = square_wave(IDLE_W, BUSY_W, period, ON, phase=burst_phase_s)
    counter = part_time_counter_series(wave, READS)
    energy = domain_window_energy(counter, None, int(WINDOW[0] * NS), int(WINDOW[1] * NS), 0.02, 1000.0).energy_j
    return WindowResult(load, WINDOW[1] - WINDOW[0], 1000, {Signal.ENERGY_COUNTER.value: energy})


def _idle_power() -> dict[str, float | None]:
    counter = part_time_counter_series(lambda _t: IDLE_W, READS)
    energy = domain_window_energy(counter, None, int(WINDOW[0] * NS), int(WINDOW[1] * NS), 0.02, 1000.0).energy_j
    return {Signal.ENERGY_COUNTER.value: energy / (WINDOW[1] - WINDOW[0])}


FACTS = RunFacts(card="Test GPU", driver="1.0", date="2026-11-27", window_s=WINDOW[1] - WINDOW[0],
                 counter_period_s=PERIOD, nominal_period_s=PERIOD, source="`jpwr selftest` (synthetic)")


@pytest.fixture(scope="module")
def synthetic_run() -> tuple[list[dict], list[AliasingRow]]:
    """Locked at 4 phases, detuned by -3/+1/+3 %, twice the period: two repeats each on the part-time counter."""
    loads = planned_loads(["locked", "detuned", "multiple"], [], PERIOD, 4, [-3.0, 1.0, 3.0], [2])
    windows = [_window(load, (load.phase if load.phase is not None else 0.37 * rep) * PERIOD + 0.011 * rep)
               for rep in range(2) for load in loads if load.mode != "steady"]
    rows = mode_rows(windows, _idle_power())
    return rows, table_rows(rows, FACTS)


def test_locked_bursts_spread_far_more_than_detuned_ones_on_a_part_time_counter(synthetic_run):
    _, table = synthetic_run
    by_mode = {(r.mode, r.period_ms): r for r in table}
    locked = by_mode[("locked", 100.0)]
    assert locked.windows == 8  # 4 phases x 2 repeats, one spread over all of them
    assert locked.spread > 0.5  # a 30 ms burst in or out of the counter's 25 ms sample
    assert by_mode[("detuned", 103.0)].spread < locked.spread / 5  # +3 %: 40 bursts drift through every phase
    assert by_mode[("detuned", 97.0)].spread < locked.spread / 5


def test_each_mode_row_is_its_spread_and_the_bound_it_implies(synthetic_run):
    rows, table = synthetic_run
    counter_rows = {r["load"]: r for r in rows if r["signal"] == Signal.ENERGY_COUNTER.value}
    for row in table:
        values = next(r for r in counter_rows.values() if r["mode"] == row.mode
                      and round(r["period_s"] * 1e3, 3) == row.period_ms)["j_per_matmul_above_idle"]
        assert row.spread == pytest.approx((max(values) - min(values)) / np.mean(values), abs=1e-4)
        assert row.bound == pytest.approx(implied_bound(row.spread), abs=1e-4)
        assert (row.card, row.driver, row.date, row.counter_period_ms) == ("Test GPU", "1.0", "2026-11-27", 100.0)


def test_the_bound_covers_the_true_energy_of_every_aliased_window(synthetic_run):
    """The rule's claim on a counter whose truth is known: every locked window reads within its mode's bound of
    the true energy per unit of work (the exact integral of the bursts above idle)."""
    rows, table = synthetic_run
    locked_row = next(r for r in table if r.mode == "locked")
    values = next(r for r in rows if r["load"] == "locked")["j_per_matmul_above_idle"]
    bursts = int((WINDOW[1] - WINDOW[0]) / PERIOD)
    truth = (BUSY_W - IDLE_W) * ON * bursts / 1000
    assert all(abs(v - truth) <= locked_row.bound * np.mean(values) for v in values)
    # what the rule rests on: the phases evenly spaced over the counter's period average to the truth
    for repeat in (values[:4], values[4:]):
        assert np.mean(repeat) == pytest.approx(truth, rel=0.05)


def test_the_aliasing_rule_decides_which_modes_are_aliased(synthetic_run):
    _, table = synthetic_run
    flagged = {(r.mode, r.period_ms): r.aliased for r in table}
    assert flagged == {("locked", 100.0): True, ("detuned", 97.0): False, ("detuned", 101.0): True,
                       ("detuned", 103.0): False, ("multiple", 200.0): True}


def test_the_shipped_rows_follow_the_rule():
    for row in aliasing_table.ROWS:
        assert row.bound == pytest.approx(implied_bound(row.spread)), row
        period = (row.counter_period_ms or UPDATE_S * 1e3) / 1e3
        bursts = int(row.window_s / (row.period_ms / 1e3))
        expected = aliasing_warning(bursts * row.period_ms / 1e3, bursts, period) is not None
        assert row.aliased == expected, row
        assert row.source.startswith("`jpwr selftest") and row.date and row.driver, row


def _row(**changes) -> AliasingRow:
    base = AliasingRow(card="Test GPU", driver="1.0", date="2026-11-01", mode="locked", period_ms=100.0,
                       counter_period_ms=100.0, windows=8, window_s=4.0, spread=0.12, bound=0.12, aliased=True,
                       source="`jpwr selftest`")
    return dataclasses.replace(base, **changes)


def test_a_card_with_rows_gets_the_largest_aliased_bound_of_its_best_measurement():
    rows = [_row(), _row(mode="detuned", period_ms=103.0, spread=0.5, bound=0.5, aliased=False),
            _row(mode="multiple", period_ms=200.0, spread=0.05, bound=0.05),
            _row(driver="2.0", date="2026-11-20", spread=0.03, bound=0.03)]
    same_driver = card_bound("Test GPU", "1.0", rows)
    assert same_driver.fraction == 0.12  # the not-aliased detuned row does not count
    assert "12.0 % bound, measured for Test GPU, driver 1.0, 2026-11-01" in same_driver.describe()
    newest = card_bound("Test GPU", "3.0", rows)  # no row for this driver: the latest measurement
    assert newest.fraction == 0.03 and "driver 2.0, 2026-11-20" in newest.describe()
    assert "this card runs driver 3.0" in newest.describe()


def test_a_card_without_rows_keeps_the_conservative_bound_and_says_so():
    bound = card_bound("Other GPU", "1.0", [_row()])
    assert bound.fraction == CONSERVATIVE_BOUND and not bound.measured
    assert bound.describe() == "no measured row: conservative 8 % bound"
    only_unaliased = card_bound("Test GPU", "1.0", [_row(aliased=False)])
    assert only_unaliased.fraction == CONSERVATIVE_BOUND


def test_the_estimator_takes_the_metered_cards_bound_from_the_table(monkeypatch):
    monkeypatch.setattr(aliasing_table, "ROWS", (_row(spread=0.3, bound=0.3),))
    wave = square_wave(120.0, 690.0, period=0.1, on=0.03)
    counter = counter_series(wave, list(np.arange(0.0, 10.0, 0.01)))  # dense reads: a tight counter bound
    measured = domain_window_energy(counter, None, 1 * NS, 9 * NS, 0.1, 840.0, steps=80, card="Test GPU")
    assert measured.error_bound_j >= 0.3 * measured.energy_j
    assert any("bound widened to 30.0 %: measured for Test GPU" in w for w in measured.warnings)
    unknown = domain_window_energy(counter, None, 1 * NS, 9 * NS, 0.1, 840.0, steps=80, card="Other GPU")
    assert CONSERVATIVE_BOUND * unknown.energy_j <= unknown.error_bound_j < 0.3 * unknown.energy_j
    assert any("bound widened to 8 %: no measured row for Other GPU" in w for w in unknown.warnings)


@pytest.mark.parametrize(("rows", "expected"), [
    ((_row(card="NVIDIA H100 80GB HBM3", driver="580.159.04", spread=0.2, bound=0.2),),
     "aliasing: 20.0 % bound, measured for NVIDIA H100 80GB HBM3, driver 580.159.04, 2026-11-01"),
    ((), "aliasing: no measured row: conservative 8 % bound"),
])
def test_info_names_the_row_and_bound_for_the_card_in_hand(rows, expected, fake_pynvml, h100_trace_dir, monkeypatch):
    monkeypatch.setattr(aliasing_table, "ROWS", rows)
    fake_pynvml.configure(h100_trace_dir)
    lines = [line.strip() for line in describe(["nvml"], 0.0).splitlines() if "aliasing:" in line]
    assert len(lines) == 1 and lines[0].startswith(expected), lines
    assert "this card runs driver" not in lines[0]  # same driver as the fake H100's


def test_the_grid_finds_period_and_phase_across_probes_far_apart():
    rng = np.random.default_rng(7)
    period, anchor = 0.09993, 12.3456
    cycles = [*range(10), *range(60, 62), *range(130, 132), *range(400, 402)]
    times = [(anchor + n * period + rng.uniform(-0.004, 0.004)) * NS for n in cycles]
    grid = fit_grid(times, 0.1)
    assert grid is not None and grid.period_s == pytest.approx(period, abs=2e-5)
    start = grid.next_at_phase(anchor * NS + 1.01 * NS, 0.25)
    assert start >= anchor * NS + 1.01 * NS and grid.phase_of(start) == pytest.approx(0.25, abs=1e-6)
    true_phase = ((start / NS - anchor) / period) % 1.0
    assert true_phase == pytest.approx(0.25, abs=0.05)  # within 5 ms of the intended phase
    assert fit_grid(times[:2], 0.1) is None


def test_a_probe_of_the_h100s_counter_fits_its_period(fake_pynvml, h100_trace_dir):
    """The fake replays the H100's recorded counter: reads 3.6 ms apart (its read cost) see its 99.99 ms period."""
    clock = VirtualClock()
    fake_pynvml.configure(h100_trace_dir, clock)
    backend = create_backend("nvml", clock)
    counter = next(s for s in backend.discover().sensors if s.signal is Signal.ENERGY_COUNTER)

    def read():
        clock.advance_ns(3_600_000)
        return backend.read([counter])[0]

    times = probe_updates(read, 20, timeout_s=10.0)
    grid = fit_grid(times, 0.1)
    assert len(times) == 20 and grid is not None
    assert grid.period_s == pytest.approx(0.09999, abs=5e-4) and grid.scatter_s < 0.01


def test_a_run_without_its_driver_counts_for_every_driver_and_the_larger_bound_wins():
    """Two runs that may share a driver and disagree (H100, 2026-11-27: 20.2 % and 2.7 % at 100 ms): the larger."""
    rows = [_row(driver=aliasing_table.UNRECORDED, spread=0.2, bound=0.2), _row(date="2026-11-27", spread=0.03,
                                                                              bound=0.03)]
    assert card_bound("Test GPU", "1.0", rows).fraction == 0.2
    assert card_bound("Test GPU", "9.9", rows).fraction == 0.2  # the unrecorded run may have been this driver too
    assert card_bound("Test GPU", "1.0", rows[1:]).fraction == 0.03
