"""How far a window aliased with the energy counter can be off: the rule from a selftest's spread to a bound,
and the bound that applies to a card (from `jpwr.aliasing_table`, else the conservative one).

The rule. A window whose loop keeps hitting the same phases of the counter's update (the estimator's aliasing
rule) reads the counter's energy at one phase, unknown to the meter; a window that drifts through every phase
reads their average. `jpwr selftest` runs the same work in such windows and takes the spread of the counter's
energy per unit of work above idle across them, spread = (max - min) / mean. Both the aliased window's reading
and the phase average lie within [min, max] of what the run saw, so neither is further from the other than
max - min: the implied bound is the spread itself, as a fraction of the window's energy. That is conservative
twice over: the spread is taken above idle and the bound applied to the whole window's energy, and it contains
the run's own noise between identical windows (a steady load's spread). It is an estimate, not a proof: a run
can miss the worst phase, which is why the locked mode spaces its offsets evenly over the counter's period.

A card's bound is the largest bound of the rows the aliasing rule flags, from the one measurement (driver and
date) that fits best: the same driver where the table has it, else the latest.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from jpwr import aliasing_table
from jpwr.aliasing_table import UNRECORDED, AliasingRow

# The H100's counter spread +/-8 % across four identical runs whose burst period matched its 100 ms update
# (../shared/reference/energy-measurement.md): the bound of a card the table has no measured row for.
CONSERVATIVE_BOUND = 0.08


def spread(values: Sequence[float]) -> float | None:
    """(max - min) / mean of one mode's energies per unit of work; None below two windows or at a zero mean."""
    if len(values) < 2:
        return None
    mean = sum(values) / len(values)
    return (max(values) - min(values)) / mean if mean > 0 else None


def implied_bound(spread_fraction: float) -> float:
    """The relative bound a window aliased like a selftest mode gets from that mode's spread (the rule above)."""
    return spread_fraction


@dataclasses.dataclass(frozen=True)
class CardBound:
    """The aliasing bound for one card, and the table rows it comes from (none: the conservative bound)."""

    fraction: float
    card: str | None
    rows: tuple[AliasingRow, ...] = ()
    driver: str | None = None  # the driver of the card in hand, where known

    @property
    def measured(self) -> bool:
        return bool(self.rows)

    @property
    def percent(self) -> str:
        return f"{self.fraction * 100:.1f} %" if self.rows else f"{self.fraction * 100:g} %"

    def origin(self) -> str:
        """Where the bound comes from: the measured row, or that there is none."""
        if not self.rows:
            return f"no measured row for {self.card or 'this card'} in jpwr's aliasing table, the conservative bound"
        worst = max(self.rows, key=lambda r: r.bound)
        return (f"measured for {worst.card}, driver {worst.driver}, {worst.date}: {worst.mode} bursts at "
                f"{worst.period_ms:g} ms spread {worst.spread * 100:.1f} % over {worst.windows} windows "
                "(jpwr/aliasing_table.py)"
                + (f"; this card runs driver {self.driver}" if self.driver and self.driver != worst.driver else ""))

    def describe(self) -> str:
        """The bound and its origin in one line, as `jpwr info` states it."""
        if not self.rows:
            return f"no measured row: conservative {self.percent} bound"
        return f"{self.percent} bound, {self.origin()}"


def _measurement(rows: Sequence[AliasingRow], driver: str | None) -> list[AliasingRow]:
    """The rows that may describe this driver: every run with the same driver or an unrecorded one (it may have
    been this driver), else the latest run of all. Over several such runs the largest bound wins: two H100 runs
    of the same mode on 2026-11-27 spread 20.2 % and 2.7 % at 100 ms, and nothing tells which one is typical."""
    same = [r for r in rows if r.driver in (driver, UNRECORDED)]
    if same:
        return same
    latest = max(rows, key=lambda r: r.date)
    return [r for r in rows if (r.driver, r.date, r.source) == (latest.driver, latest.date, latest.source)]


def card_bound(card: str | None, driver: str | None = None, rows: Sequence[AliasingRow] | None = None) -> CardBound:
    """The aliasing bound for a card model (and driver): its measured rows' largest aliased bound, else
    CONSERVATIVE_BOUND. `rows` defaults to the table as shipped."""
    table = aliasing_table.ROWS if rows is None else rows
    mine = [r for r in table if card is not None and r.card == card]
    if not mine:
        return CardBound(CONSERVATIVE_BOUND, card, driver=driver)
    aliased = [r for r in _measurement(mine, driver) if r.aliased]
    if not aliased:
        return CardBound(CONSERVATIVE_BOUND, card, driver=driver)
    return CardBound(max(r.bound for r in aliased), card, tuple(aliased), driver)
