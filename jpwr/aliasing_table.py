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


@dataclasses.dataclass(frozen=True, kw_only=True)
class AliasingRow:
    """One mode of one selftest run on one card model and driver version."""

    card: str  # the model name as the backend reports it (the domain's name), e.g. "NVIDIA H100 80GB HBM3"
    driver: str  # the driver version the run saw, or "not recorded"
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
    AliasingRow(card="NVIDIA H100 80GB HBM3", driver="not recorded", date="2026-11-27", mode="random",
                period_ms=period, counter_period_ms=None, windows=6, window_s=4.0, spread=spread, bound=spread,
                aliased=aliased, source=_H100_2026_11_27)
    for period, spread, aliased in ((37.0, 0.034, False), (100.0, 0.202, True), (200.0, 0.068, True),
                                    (250.0, 0.033, False))
)
