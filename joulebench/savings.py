"""When a difference in energy per unit of work may be called a saving: only beyond the two runs' combined bounds.

Combination rule: the relative bounds add (|Δ| must exceed r_base + r_new). The meter's bounds are interval
arithmetic, worst cases rather than standard deviations (docs/jpwr.md, "Bound"), and worst cases of a ratio add to
first order; root-sum-square is the rule for independent random errors and would call a difference inside the two
intervals a saving. Shared by `report --pareto`, `report --compare` and anything that recommends a setting.
"""

from __future__ import annotations

import dataclasses

WITHIN_BOUNDS = "within bounds"


@dataclasses.dataclass(frozen=True)
class Saving:
    """B against A per unit of work: the saving (1 − E_B/E_A, negative when B costs more) and the combined relative
    bound; `beyond_bounds` is None when either bound is unknown (nothing can then be named a saving)."""

    fraction: float
    bound: float | None

    @property
    def beyond_bounds(self) -> bool | None:
        return None if self.bound is None else abs(self.fraction) > self.bound

    def words(self) -> str:
        """'+3.10 % (bound ±0.40 %)' beyond the bounds; 'within bounds (+0.20 %, bound ±0.40 %)' inside them or with
        a bound n/a: a difference the meter cannot stand behind is never shown as a bare number."""
        figure = f"{100 * self.fraction:+.2f} %"
        bound = "bound n/a" if self.bound is None else f"bound ±{100 * self.bound:.2f} %"
        return f"{figure} ({bound})" if self.beyond_bounds else f"{WITHIN_BOUNDS} ({figure}, {bound})"


def relative_bound(energy_j: float | None, bound_j: float | None) -> float | None:
    """A bound as a fraction of its energy; None (n/a) when either is missing or the energy is not positive."""
    if energy_j is None or bound_j is None or energy_j <= 0 or bound_j < 0:
        return None
    return bound_j / energy_j


def saving(base_j: float, base_bound: float | None, new_j: float, new_bound: float | None) -> Saving:
    """The saving of `new` against `base` (energies per unit of work, relative bounds as fractions)."""
    if base_j <= 0:
        raise ValueError(f"base energy per unit {base_j!r} is not positive")
    combined = None if base_bound is None or new_bound is None else base_bound + new_bound
    return Saving(1 - new_j / base_j, combined)
