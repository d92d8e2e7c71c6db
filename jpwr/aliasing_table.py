"""The energy counter's aliasing, measured per card model and driver: the rows `jpwr selftest` prints.

Each row is one load mode of one selftest run: bursts of the same work at one period, phased against the
counter's update in one way (random offsets, locked at fixed offsets, detuned from the counter's period, a
multiple of it), and how far the counter's energy per unit of work spread across the run's windows. The
bound a row implies for a window aliased that way follows the rule in `jpwr.aliasing`. The estimator takes
a card's bound from here (`jpwr.aliasing.card_bound`); a card without a row keeps the conservative bound.

Rows are only ever pasted from a real run's output (`jpwr selftest` prints them ready to paste, and writes
them to its `aliasing_rows.json`), with the run's date, driver and command; never typed in by hand.
"""

from __future__ import annotations

import dataclasses

UNRECORDED = "not recorded"  # a row's driver when its run did not note it


@dataclasses.dataclass(frozen=True, kw_only=True)
class AliasingRow:
    """One mode of one selftest run on one card model and driver version."""

    card: str  # the model name as the backend reports it (the domain's name), e.g. "NVIDIA H100 80GB HBM3"
    driver: str  # the driver version the run saw, or UNRECORDED
    date: str  # ISO date of the run
    mode: str  # random | locked | detuned | multiple (see jpwr.selftest)
    period_ms: float  # the bursts' period
    counter_period_ms: float | None  # the counter's update period measured in the run (None: not measured)
    windows: int  # windows the spread is taken over (repeats x offsets)
    window_s: float  # length of each window
    spread: float  # (max - min) / mean of the counter's energy per unit of work above idle over the windows
    bound: float  # the relative bound the spread implies for a window aliased this way (jpwr.aliasing)
    aliased: bool  # whether the estimator's aliasing rule flags a window of this mode
    source: str  # the command, and where the figures were published


# The 2026-11-27 H100 figures were measured with random phase offsets only and without the driver version; they
# are entered exactly as published (spread per period; steady load 2.8 % for reference). Each row's bound follows
# jpwr.aliasing's rule; `aliased` applies the estimator's rule at NVML's stated 100 ms update period.
_H100_2026_11_27 = ("`jpwr selftest --periods-ms 37,100,200,250 --repeats 6 --seconds 4` on one H100 SXM, "
                    "random phase offsets; published in shared/reference/measured-2026-11-27.md (steady load 2.8 %)")

ROWS: tuple[AliasingRow, ...] = tuple(
    AliasingRow(card="NVIDIA H100 80GB HBM3", driver=UNRECORDED, date="2026-11-27", mode="random",
                period_ms=period, counter_period_ms=None, windows=6, window_s=4.0, spread=spread, bound=spread,
                aliased=aliased, source=_H100_2026_11_27)
    for period, spread, aliased in ((37.0, 0.034, False), (100.0, 0.202, True), (200.0, 0.068, True),
                                    (250.0, 0.033, False))
)

# The same card with every selftest mode (random offsets, locked at 4 phases of the counter's update, detuned by
# -3/-1/+1/+3 %, twice the period), from that run's aliasing_rows.json (counter period 100.001 ms, 4 s windows;
# driver 580.159.04). Today's random 100 ms row spread 2.7 % where the run above spread 20.2 %: jpwr.aliasing takes
# the larger of the runs that may share a driver.
_H100_SELFTEST_MODES = ("`jpwr selftest --methods nvml --periods-ms 37,100,250 --repeats 5 --seconds 4 "
                        "--out OUT/selftest` on one H100 SXM (nvidia-h100-x1), every mode; docs/BENCHMARKS.md (wave 4)")
_H100_MODES = (  # mode, burst period ms, windows, spread, flagged by the aliasing rule
    ('random', 37.0, 5, 0.0363, False),
    ('random', 100.0, 5, 0.0268, True),
    ('random', 250.0, 5, 0.0201, False),
    ('locked', 99.636, 20, 0.054, True),
    ('detuned', 96.647, 5, 0.0103, False),
    ('detuned', 98.64, 5, 0.0159, True),
    ('detuned', 100.632, 5, 0.0537, True),
    ('detuned', 102.625, 5, 0.0282, True),
    ('multiple', 199.272, 5, 0.0519, True),
)
ROWS += tuple(
    AliasingRow(card="NVIDIA H100 80GB HBM3", driver="580.159.04", date="2026-11-27", mode=mode, period_ms=period,
                counter_period_ms=100.001, windows=windows, window_s=4.0, spread=spread, bound=spread,
                aliased=aliased, source=_H100_SELFTEST_MODES)
    for mode, period, windows, spread, aliased in _H100_MODES
)
