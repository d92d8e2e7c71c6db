"""The power-cap term of the per-request model: under the power cap, work costs the capped power times its device time.

Physical form: a card held at its power limit lowers its clocks until its power is the limit's, so while capped it
spends about the same dynamic power per busy second whatever the step does; what a step's work costs there is that
power times the step's device time, not a sum of per-unit costs fitted where the card ran free. A step of capped
share κ (the power-cap reason's share of its counter segment's readings, joulebench.card_state) counts (1 − κ) of
its amounts at the per-unit costs a..e (which then hold where the card is not capped) and κ of its device time at
the capped dynamic power, one for prefill and one for decode (W). Its device time is the step-time law's:
seconds = τ · amounts over COLUMNS (a prefill step: τ_e + τ_a·tokens; a decode step: τ_b + τ_c·rows + τ_d·KV
positions), fitted by non-negative least squares on the device-stamped steps, each weighted by its capped share
(the law the capped clock sets). The law shares a step's time over its requests as the costs share its energy.

Why it does not feed a window's power back into its own prediction (the temperature column's fault): the cap share
only decides which of two fixed costs a step's work gets (both fitted on the data fitted, never on the window
predicted), and a window without work gets nothing from it. Like the clock term (joulebench.clock_term) it is
adopted only where the data fitted determine it (its likelihood ratio against the fit without it over 1 s blocks,
as α's against α = 0) and it predicts a rate it was not fitted on better, by the root mean square of the relative
errors of the held-out rates' window energies (`judged`); held-out halves and the controlled split do not decide it, and
a fit with no other rate to test it on records the term as tried, with its checks, unadopted.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from joulebench.clock_term import HeldOutRate, held_out_verdict, rms_error
from joulebench.record_types import CapTermTrial, HeldOutRateTrial, RequestEnergyBlock
from joulebench.segment_fit import CLOSURE_Z, nnls
from jpwr import ValidationError

if TYPE_CHECKING:
    from joulebench.request_energy import RequestEnergyFit, WorkLog

FORM = ("a step of capped share k counts (1 - k) of its work at the per-unit costs (which hold uncapped) and k of its "
        "device time at the capped dynamic power (prefill's, decode's); device time = the step-time law tau . amounts, "
        "fitted on the device-stamped steps weighted by k")
ADOPTION_RESTS_ON = ("the data fitted determining it (likelihood ratio against the fit without it) and the held-out "
                     "rates' window energies (root mean square relative error with the term against without): held-out "
                     "halves and the controlled split do not decide it")
CAPPED_COLUMNS = ("capped_prefill_s", "capped_decode_s")  # device seconds under the cap; their costs are powers (W)
NO_CAP_STATE = "the work log carries no power-cap share (only NVML reports the power-cap reason)"
NEVER_CAPPED = "the card was never power-capped in the data fitted: the term has nothing to carry"
CLOCK_ADOPTED = "not tried: the clock term was adopted (one card-state term is carried at a time)"


@dataclasses.dataclass(frozen=True)
class CapTerm:
    """The step-time law (seconds per unit of each of request_energy's COLUMNS): a capped step's device time."""

    seconds_per_unit: np.ndarray

    @classmethod
    def of_steps(cls, log: WorkLog, share: np.ndarray) -> CapTerm:
        """The law fitted on `log`'s steps, each weighted by its capped share and by `share` (the share of it in
        the data fitted): NNLS on the steps' device seconds."""
        return cls.of_logs([(log, share)])

    @classmethod
    def of_logs(cls, parts: Sequence[tuple[WorkLog, np.ndarray]]) -> CapTerm:
        """The law fitted on the steps of several logs together (a joint fit's rates), each (log, share) as
        of_steps takes it."""
        if any(log.capped is None for log, _ in parts):
            raise ValidationError(NO_CAP_STATE, "meter through NVML, or fit without the power-cap term")
        weights = [np.sqrt(np.asarray(log.capped) * share) for log, share in parts]
        if not any(np.any(w > 0) for w in weights):
            raise ValidationError(NEVER_CAPPED, "fit without the power-cap term")
        x = np.vstack([log.columns() * w[:, None] for (log, _), w in zip(parts, weights, strict=True)])
        y = np.concatenate([log.seconds * w for (log, _), w in zip(parts, weights, strict=True)])
        return cls(nnls(x, y))

    def expand(self, log: WorkLog, amounts: Callable[[WorkLog], np.ndarray], prefill: slice, decode: slice
               ) -> np.ndarray:
        """[n, columns]: `amounts` (over COLUMNS, linear in the steps' amounts) of the uncapped part of the log,
        with each part's capped device seconds after its columns (prefill's, then decode's)."""
        if log.capped is None:
            raise ValidationError(NO_CAP_STATE, "meter through NVML, or fit without the power-cap term")
        free, capped = amounts(log.scaled(1 - log.capped)), amounts(log.scaled(log.capped))
        tau = self.seconds_per_unit
        return np.column_stack([free[:, prefill], capped[:, prefill] @ tau[prefill], free[:, decode],
                                capped[:, decode] @ tau[decode]])


@dataclasses.dataclass(frozen=True)
class CapTrial:
    """The power-cap term as fitted (None where it could not be), its capped powers, how it predicted the held-out
    rates, and the checks of the fit with it; `reason`: why it was not adopted (None: adopted)."""

    term: CapTerm | None
    powers_w: tuple[float, float] | None  # the capped dynamic power of prefill and of decode
    held_out: tuple[HeldOutRate, ...]
    reason: str | None
    likelihood_ratio: float | None = None  # of the fit with the term against the fit without it, over 1 s blocks
    model: RequestEnergyFit | None = None  # the fit with the term, adopted or not
    checks: tuple[RequestEnergyBlock, RequestEnergyBlock] | None = None  # the checks without and with the term

    @property
    def adopted(self) -> bool:
        return self.reason is None

    @classmethod
    def refused(cls, reason: str) -> CapTrial:
        return cls(None, None, (), reason)

    @property
    def determined(self) -> bool:
        return self.likelihood_ratio is not None and self.likelihood_ratio > CLOSURE_Z ** 2

    def with_checks(self, without: RequestEnergyBlock, with_term: RequestEnergyBlock) -> CapTrial:
        return dataclasses.replace(self, checks=(without, with_term))

    def to_dict(self, columns: Sequence[str]) -> CapTermTrial:
        """The record's `cap_term` (`columns`: request_energy's COLUMNS, the law's units)."""
        held: list[HeldOutRateTrial] = [h.to_dict() for h in self.held_out]
        law = None if self.term is None else {c: float(v) for c, v in
                                              zip(columns, self.term.seconds_per_unit, strict=True)}
        powers = None if self.powers_w is None else {"prefill": self.powers_w[0], "decode": self.powers_w[1]}
        return {"form": FORM, "adopted": self.adopted, "unadopted_reason": self.reason,
                "adoption_rests_on": ADOPTION_RESTS_ON, "step_time_law_s": law, "capped_power_w": powers,
                "likelihood_ratio": self.likelihood_ratio, "determined_above": CLOSURE_Z ** 2,
                "held_out_rates": held, "rms_error_without": rms_error(self.held_out, False),
                "rms_error_with": rms_error(self.held_out, True),
                "checks_without_term": self.checks[0] if self.checks else {},
                "checks_with_term": self.checks[1] if self.checks else {}}


def judged(term: CapTerm, powers_w: tuple[float, float], ratio: float, held_out: Sequence[HeldOutRate],
           model: RequestEnergyFit | None = None) -> CapTrial:
    """The clock term's rule (clock_term.judged): adopt the term where the data fitted determine it (its likelihood
    ratio against the fit without it over 1 s blocks above CLOSURE_Z², 99 %) and the held-out rates' window energies
    come out closer with it (clock_term.held_out_verdict), else say why not with the figures (`model`: the fit
    with the term, where one fit carries it; a joint fit keeps its own, JointFit.cap_fits)."""
    held = tuple(held_out)
    if ratio <= CLOSURE_Z ** 2:
        return CapTrial(term, powers_w, held, f"the term is not determined by the data fitted: its likelihood ratio "
                                              f"against the fit without it over 1 s blocks is {ratio:.1f}, not above "
                                              f"{CLOSURE_Z ** 2:.1f} (99 %)", ratio, model)
    return CapTrial(term, powers_w, held, held_out_verdict(held), ratio, model)
