"""The card-state term of the per-request model: energy per unit of work ∝ (f / f_ref)^α, α ≥ 0.

f is the SM clock of the counter segment each step ran in (joulebench.card_state), f_ref the highest such clock of
the data fitted (a unit only: predictions do not depend on it). With the term every amount of work of a step
counts (f / f_ref)^α times, and the costs a..e are those at f_ref. Physical form: the card holds its power limit
by lowering its SM clock, and its core voltage with it; switching energy per operation goes as C·V², and V falls
with f along the card's voltage/frequency curve, so the same work costs less energy at a lower clock: α ≥ 0 (α ≈ 2
where V ∝ f; less where static power, which a slower step carries longer, weighs in). α is fitted by least squares
over a grid (EXPONENTS) with the costs, on the data fitted only, and counts as determined by them only where its
likelihood ratio against α = 0 over the 1 s blocks' residual sums (the fit's noise unit: neighbouring 100 ms
segments share a knot) exceeds CLOSURE_Z² (99 %, one parameter); a clock that barely moves leaves α free.

The circularity: the card reaches its power cap because its power is high, so its state is partly caused by the
energy the model explains. A temperature column was rejected for that (the card warms because of the power it
would explain: free to raise the cost where the card is hot, it fits power with power). Here, three things keep
the term from feeding a window's power back into its own prediction:
- the state only scales work (a window without work gets nothing from it), never a per-second power;
- α ≥ 0: a lower clock can only lower the cost per unit. The card is capped where its power is high, and there the
  term can only predict less energy, never more: it cannot carry "this window drew more power" into a prediction;
- it is adopted only where α is determined and the term predicts a rate it was not fitted on better than the model
  without it (α and the costs from the other rates, that rate's measured clocks), by the root mean square of the
  relative errors of the held-out rates' window energies (`judged`); held-out halves of a rate alone do not
  decide it.
A fit that does not adopt it says why (`TermTrial.reason`), with the held-out comparison's numbers.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

import numpy as np

from joulebench.record_types import ClockTermTrial, HeldOutRateTrial
from joulebench.segment_fit import CLOSURE_Z
from jpwr import ValidationError

FORM = ("energy per unit of work x (f_SM / f_ref)^alpha, alpha >= 0 (f_SM: the SM clock of the counter segment each "
        "step ran in)")
EXPONENTS = tuple(round(0.1 * k, 1) for k in range(41))  # α's grid, 0 … 4
NO_CLOCK = "the work log carries no SM clock (the trace has no SM clock readings of the device)"
ONE_CLOCK = "the SM clock did not vary over the data fitted: alpha cannot be fitted"
NO_HELD_OUT = ("no other rate to test it on: the term is adopted only where it predicts a rate it was not fitted on "
               "better")


@dataclasses.dataclass(frozen=True)
class ClockTerm:
    """α and the reference clock: each step's amounts of work count (f / f_ref)^α times."""

    exponent: float
    reference_hz: float

    def multipliers(self, clock_hz: np.ndarray | None) -> np.ndarray:
        if clock_hz is None:
            raise ValidationError(NO_CLOCK, "meter through NVML (it reads the SM clock), or fit without the term")
        return np.power(np.asarray(clock_hz, float) / self.reference_hz, self.exponent)


@dataclasses.dataclass(frozen=True)
class Profile:
    """α fitted on some data and how far those data determine it (block likelihood ratio against α = 0)."""

    alpha: float
    likelihood_ratio: float

    @property
    def determined(self) -> bool:
        return self.likelihood_ratio > CLOSURE_Z ** 2


@dataclasses.dataclass(frozen=True)
class HeldOutRate:
    """One rate's window energy predicted by fits that never saw it, without and with the term."""

    label: str
    measured_j: float
    without_j: float
    with_j: float

    @property
    def error_without(self) -> float:
        return (self.without_j - self.measured_j) / self.measured_j

    @property
    def error_with(self) -> float:
        return (self.with_j - self.measured_j) / self.measured_j

    def to_dict(self) -> HeldOutRateTrial:
        return {"rate": self.label, "measured_j": self.measured_j, "predicted_without_j": self.without_j,
                "predicted_with_j": self.with_j, "error_without": self.error_without, "error_with": self.error_with}


@dataclasses.dataclass(frozen=True)
class TermTrial:
    """The term as fitted (None where it could not be) and how it predicted the held-out rates; `reason`: why it
    was not adopted (None: adopted)."""

    term: ClockTerm | None
    held_out: tuple[HeldOutRate, ...]
    reason: str | None
    likelihood_ratio: float | None = None  # of the fitted α against α = 0 (Profile)

    @property
    def adopted(self) -> bool:
        return self.reason is None

    @classmethod
    def refused(cls, reason: str) -> TermTrial:
        return cls(None, (), reason)

    def to_dict(self) -> ClockTermTrial:
        held: list[HeldOutRateTrial] = [h.to_dict() for h in self.held_out]
        return {"form": FORM, "adopted": self.adopted, "unadopted_reason": self.reason,
                "alpha": None if self.term is None else self.term.exponent,
                "reference_clock_mhz": None if self.term is None else self.term.reference_hz / 1e6,
                "alpha_likelihood_ratio": self.likelihood_ratio, "alpha_determined_above": CLOSURE_Z ** 2,
                "held_out_rates": held, "rms_error_without": rms_error(self.held_out, False),
                "rms_error_with": rms_error(self.held_out, True)}


def judged(reference_hz: float, profile: Profile, held_out: Sequence[HeldOutRate]) -> TermTrial:
    """Adopt the term where the data fitted determine α and the held-out rates' window energies come out closer
    with it (root mean square of the relative errors), else say why not with the figures."""
    term, held, ratio = ClockTerm(profile.alpha, reference_hz), tuple(held_out), profile.likelihood_ratio
    if not profile.determined:
        return TermTrial(term, held, f"alpha {profile.alpha:.1f} is not determined by the data fitted: its likelihood "
                                     f"ratio against alpha 0 over 1 s blocks is {ratio:.1f}, not above "
                                     f"{CLOSURE_Z ** 2:.1f} (99 %)", ratio)
    verdict = held_out_verdict(held)
    return TermTrial(term, () if verdict == NO_HELD_OUT else held, verdict, ratio)


def held_out_verdict(held_out: Sequence[HeldOutRate]) -> str | None:
    """A card-state term's adoption rule: None (adopt) where the held-out rates' window energies come out closer
    with it (root mean square of the relative errors), else why not with the figures."""
    if not held_out:
        return NO_HELD_OUT
    without, with_term = rms_error(held_out, False), rms_error(held_out, True)
    assert without is not None and with_term is not None
    if with_term < without:
        return None
    return (f"it does not predict the held-out rates better: root mean square relative error {with_term:.2%} with "
            f"it, {without:.2%} without")


def rms_error(held_out: Sequence[HeldOutRate], with_term: bool) -> float | None:
    if not held_out:
        return None
    return math.sqrt(float(np.mean([(h.error_with if with_term else h.error_without) ** 2 for h in held_out])))


def reference_clock(clocks: Sequence[np.ndarray | None]) -> float | str:
    """The highest step clock of the data fitted, or why there is no term to fit (no clock, or only one)."""
    if not clocks or any(c is None or not len(c) for c in clocks):
        return NO_CLOCK
    values = np.concatenate([c for c in clocks if c is not None])
    return ONE_CLOCK if values.min() == values.max() else float(values.max())


def best_exponent(residuals: Callable[[float], np.ndarray], blocks: np.ndarray, parameters: int) -> Profile:
    """The α of EXPONENTS whose fit leaves the least squared residual on the data fitted (the smallest α of
    equals; `residuals(α)`: the fit's segment residuals at α), and its likelihood ratio against α = 0 over the
    residuals' sums per block (`blocks`: each segment's; `parameters`: the fit's columns, α not counted)."""
    fitted = [residuals(alpha) for alpha in EXPONENTS]
    best = int(np.argmin([float(r @ r) for r in fitted]))
    return Profile(EXPONENTS[best], likelihood_ratio(fitted[0], fitted[best], blocks, parameters + 1))


def likelihood_ratio(without: np.ndarray, with_term: np.ndarray, blocks: np.ndarray, parameters: int) -> float:
    """A term's likelihood ratio against the fit without it, over the residuals' sums per 1 s block (`blocks`:
    each segment's; `parameters`: the fit's with the term): the drop in the block error over its variance per
    free block (0 where the term fits no better)."""
    ids = np.unique(blocks, return_inverse=True)[1]

    def block_error(r: np.ndarray) -> float:
        sums = np.bincount(ids, weights=r)
        return float(sums @ sums)

    free = max(int(ids.max()) + 1 - parameters, 1)
    at_term = block_error(with_term)
    ratio = (block_error(without) - at_term) / (at_term / free) if at_term > 0 else 0.0
    return max(ratio, 0.0)
