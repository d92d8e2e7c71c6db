"""Per-request energy of a serving run: the counter-segment fit (joulebench/segment_fit.py) on engine steps.

Continuous batching runs many requests through each step, so no meter sees one request's energy. The engine's
work log says what each step did (prefill tokens, decode rows, attended KV tokens) and for whom; the energy
counter says what each ~100 ms segment cost. Per segment

    E = P_idle·seconds + a·prefill_tokens + e·prefill_steps + b·decode_steps + c·row_steps + d·kv_tokens

(each step's amounts counted by the share of the step inside the segment), a..e >= 0 by NNLS, P_idle from the
run's idle baseline (fitted as a last column when there is none). Every forward pass reads the weights once
whatever its size, so a step's cost per token falls as the step grows: a token column alone cannot be right for
either kind of step. e is a prefill step's fixed cost, shared by its requests in proportion to their prefill
tokens; b a decode step's, shared equally by its rows. A request's energy = its prefill tokens·a + for each of
its prefill steps e·(its tokens / the step's tokens) + for each of its decode steps (b/rows + c + d·its KV
tokens) + its share of idle power: at each instant P_idle is shared equally by the requests in the system
(arrived, not finished); time with none is unattributed idle.

Where prefill and decode come in the same mix in every counter period, any split between them fits equally
well: the split is then None with the reason (the prefill block's variance inflation factor, `prefill_vif`),
never a number.

The card's state: a log may carry each step's SM clock and power-cap share (joulebench.card_state). A fit may then
count each step's work (f / f_ref)^α times (joulebench.clock_term: the term, why α ≥ 0, and why it is adopted only
where it predicts a rate it was not fitted on better, `fit_with_clock_trial`). Every check also records the
conditions of its two sides (card state, step sizes: `Conditions`), and a failing one their difference as its
measured cause.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np

from joulebench.cap_term import CAPPED_COLUMNS, CLOCK_ADOPTED, CapTerm, CapTrial
from joulebench.cap_term import judged as cap_judged
from joulebench.card_state import Comparison, Conditions
from joulebench.clock_term import (
    NO_HELD_OUT,
    ClockTerm,
    HeldOutRate,
    TermTrial,
    best_exponent,
    judged,
    likelihood_ratio,
    reference_clock,
)
from joulebench.segment_fit import (
    BLOCK_S,
    CLOSURE_Z,
    MIN_SEGMENTS,
    Fold,
    Segments,
    blocks_of,
    bootstrap_powers,
    calibrated_fit,
    held_out_halves,
    window_segments,
)
from jpwr import ValidationError
from jpwr.trace import Knots

PREFILL_COLUMNS = ("prefill_tokens", "prefill_steps")  # the prefill part of a request's energy
DECODE_COLUMNS = ("decode_steps", "row_steps", "kv_tokens")  # the decode part
COLUMNS = (*PREFILL_COLUMNS, *DECODE_COLUMNS)
PREFILL = slice(0, len(PREFILL_COLUMNS))  # where each part's columns sit in COLUMNS (and in a fit's columns)
DECODE = slice(PREFILL.stop, PREFILL.stop + len(DECODE_COLUMNS))
CAP_COLUMNS = (*PREFILL_COLUMNS, CAPPED_COLUMNS[0], *DECODE_COLUMNS, CAPPED_COLUMNS[1])  # with the power-cap term
CAP_PREFILL = slice(0, PREFILL.stop + 1)
CAP_DECODE = slice(CAP_PREFILL.stop, len(CAP_COLUMNS))
IDLE_COLUMN = "idle_w"  # the last column (seconds) when no idle power is given
MAX_PREFILL_VIF = 10.0  # above it some prefill work is (nearly) a combination of the other columns: no split
CROSS_RATE_SLACK = 0.03  # test (a): |measured − predicted| ≤ both bounds + 3 % of the measured energy
SPLIT_SLACK = 0.05  # test (c): each part within 5 % of its measured (dynamic) energy
PERCENTILES = (2.5, 97.5)
_FIX = "log one entry per step, in time order, as joulebench/request_energy.py's WorkLog describes"


def _check_offsets(offsets: np.ndarray, steps: int, members: int) -> None:
    if len(offsets) != steps + 1 or offsets[0] != 0 or offsets[-1] != members or np.any(np.diff(offsets) < 0):
        raise ValidationError(f"work log: member_offsets must rise from 0 to {members} over {steps + 1} entries",
                              _FIX)


@dataclasses.dataclass(frozen=True)
class WorkLog:
    """One entry per step on the node's monotonic clock (ns); members say which requests took part and how much.

    Steps never overlap; time between steps is device idle. An engine's log has whole steps (`of_steps`): a
    prefill step (prefill_steps 1) or a decode step (decode_steps 1, one row-step per member). A log rebuilt from
    a client's view of a server (llm_inference/client_estimate.py) has fractional amounts, and a step there may
    hold prefill and decode work at once. Shares: a step's prefill pass is shared by its prefill tokens, its
    decode pass by its row-steps.
    """

    t0_ns: np.ndarray  # (steps,) int64 start of the step on the device
    t1_ns: np.ndarray  # (steps,) end
    prefill_tokens: np.ndarray  # (steps,) tokens prefilled in the step
    prefill_steps: np.ndarray  # (steps,) prefill passes in the step (an engine's: 1 or 0)
    decode_steps: np.ndarray  # (steps,) decode passes in the step (an engine's: 1 or 0)
    row_steps: np.ndarray  # (steps,) rows decoded, summed over the decode passes
    kv_tokens: np.ndarray  # (steps,) attended KV tokens summed over the decoded rows
    member_offsets: np.ndarray  # (steps+1,) CSR into the member arrays
    member_request: np.ndarray  # (m,) request id of each member of a step
    member_prefill_tokens: np.ndarray  # (m,) that request's prefill tokens in the step
    member_row_steps: np.ndarray  # (m,) its decoded rows in the step (an engine's: 1 in a decode step)
    member_kv_tokens: np.ndarray  # (m,) its attended KV tokens in the step
    sm_clock_hz: np.ndarray | None = None  # (steps,) the SM clock the step ran at (its counter segment's median)
    capped: np.ndarray | None = None  # (steps,) the share of its segment's readings with the power cap holding

    def __post_init__(self) -> None:
        self.check()

    @classmethod
    def of_steps(cls, t0_ns: np.ndarray, t1_ns: np.ndarray, prefill_tokens: np.ndarray, decode_rows: np.ndarray,
                 kv_tokens: np.ndarray, member_offsets: np.ndarray, member_request: np.ndarray,
                 member_prefill_tokens: np.ndarray, member_kv_tokens: np.ndarray) -> WorkLog:
        """An engine's log of whole steps: each a prefill step (prefill_tokens > 0) or a decode step of
        `decode_rows` rows, one member per row."""
        _check_offsets(member_offsets, len(t0_ns), len(member_request))
        counts = np.diff(member_offsets)
        decode_rows = np.asarray(decode_rows)
        if len(decode_rows) != len(t0_ns):
            raise ValidationError(f"work log: decode_rows has {len(decode_rows)} entries, t0_ns {len(t0_ns)}", _FIX)
        bad = (decode_rows > 0) & (counts != decode_rows)
        if np.any(bad):
            i = int(np.argmax(bad))
            raise ValidationError(f"work log: step {i} decodes {int(decode_rows[i])} rows, but it has "
                                  f"{int(counts[i])} members", _FIX)
        prefill = np.asarray(prefill_tokens)
        both = (prefill > 0) & (decode_rows > 0)
        if np.any(both):
            raise ValidationError(f"work log: step {int(np.argmax(both))} is both a prefill and a decode step", _FIX)
        return cls(t0_ns, t1_ns, prefill, (prefill > 0).astype(float), (decode_rows > 0).astype(float),
                   decode_rows.astype(float), kv_tokens, member_offsets, member_request, member_prefill_tokens,
                   np.repeat(decode_rows > 0, counts).astype(float), member_kv_tokens)

    def check(self) -> None:
        """Refuse a log the model would silently misread (ValidationError naming the first bad step)."""
        n = len(self.t0_ns)
        for name in ("t1_ns", "prefill_tokens", "prefill_steps", "decode_steps", "row_steps", "kv_tokens",
                     "sm_clock_hz", "capped"):
            if getattr(self, name) is not None and len(getattr(self, name)) != n:
                raise ValidationError(f"work log: {name} has {len(getattr(self, name))} entries, t0_ns {n}", _FIX)
        offsets = self.member_offsets
        m = len(self.member_request)
        _check_offsets(offsets, n, m)
        member_columns = (self.member_prefill_tokens, self.member_row_steps, self.member_kv_tokens)
        if any(len(values) != m for values in member_columns):
            raise ValidationError("work log: the member arrays differ in length", _FIX)
        self._first_bad(self.t1_ns <= self.t0_ns, "ends before it starts")
        self._first_bad(np.append(self.t0_ns[1:] < self.t1_ns[:-1], False), "overlaps the next step")
        for name in ("prefill_tokens", "prefill_steps", "decode_steps", "row_steps", "kv_tokens"):
            self._first_bad(~(getattr(self, name) >= 0), f"has negative (or NaN) {name}")
        if any(np.any(~(values >= 0)) for values in member_columns):
            raise ValidationError("work log: a member has negative (or NaN) amounts", _FIX)
        if self.sm_clock_hz is not None:
            self._first_bad(~(self.sm_clock_hz > 0), "has no positive SM clock")
        self._first_bad((self.prefill_tokens > 0) != (self.prefill_steps > 0), "has prefill tokens without a "
                        "prefill pass, or a pass without tokens")
        self._first_bad((self.row_steps > 0) != (self.decode_steps > 0), "has decoded rows without a decode pass, "
                        "or a pass without rows")
        members = np.diff(offsets)
        starts = offsets[:-1]
        for name, member in (("prefill_tokens", self.member_prefill_tokens), ("row_steps", self.member_row_steps),
                             ("kv_tokens", self.member_kv_tokens)):
            sums = np.add.reduceat(np.append(member, 0), starts) * (members > 0) if n else np.zeros(0)
            total = getattr(self, name)
            self._first_bad(~np.isclose(sums, total, rtol=1e-9, atol=1e-9), f"has {name} other than its members' sum")

    def _first_bad(self, bad: np.ndarray, what: str) -> None:
        if np.any(bad):
            i = int(np.argmax(bad))
            raise ValidationError(f"work log: step {i} (t0 {int(self.t0_ns[i])} ns) {what}", _FIX)

    @property
    def seconds(self) -> np.ndarray:
        return (self.t1_ns - self.t0_ns) / 1e9

    def with_state(self, sm_clock_hz: np.ndarray | None, capped: np.ndarray | None) -> WorkLog:
        """The log with each step's card state (joulebench.card_state.CardState.at_steps)."""
        return dataclasses.replace(self, sm_clock_hz=sm_clock_hz, capped=capped)

    def counted(self, term: ClockTerm | None) -> WorkLog:
        """The log as a fit with `term` counts it: every amount of each step (and of its members) times the
        step's (f / f_ref)^α."""
        return self if term is None else self.scaled(term.multipliers(self.sm_clock_hz))

    def scaled(self, factor: np.ndarray) -> WorkLog:
        """The log with every amount of each step (and of its members) times the step's `factor`."""
        member = np.repeat(factor, np.diff(self.member_offsets))
        return dataclasses.replace(
            self, prefill_tokens=self.prefill_tokens * factor, prefill_steps=self.prefill_steps * factor,
            decode_steps=self.decode_steps * factor, row_steps=self.row_steps * factor,
            kv_tokens=self.kv_tokens * factor, member_prefill_tokens=self.member_prefill_tokens * member,
            member_row_steps=self.member_row_steps * member, member_kv_tokens=self.member_kv_tokens * member)

    def columns(self) -> np.ndarray:
        """[steps, COLUMNS]: each step's amounts of COLUMNS."""
        return np.column_stack([np.asarray(getattr(self, c), dtype=float) for c in COLUMNS]).reshape(-1, len(COLUMNS))

    def amounts(self, a_ns: np.ndarray, b_ns: np.ndarray) -> np.ndarray:
        """[n, COLUMNS]: COLUMNS in each [a, b], every step counted by the fraction of it inside
        (|[a,b] ∩ step| / step)."""
        cumulative = np.vstack([np.zeros((1, len(COLUMNS))), np.cumsum(self.columns(), axis=0)])
        return self._done_by(np.asarray(b_ns, float), cumulative) - self._done_by(np.asarray(a_ns, float), cumulative)

    def _done_by(self, t: np.ndarray, cumulative: np.ndarray) -> np.ndarray:
        j = np.searchsorted(self.t0_ns, t, side="right") - 1  # the step starting at or before t
        k = np.maximum(j, 0)
        t0, t1 = self.t0_ns.astype(float), self.t1_ns.astype(float)
        if not len(t0):
            return np.zeros((len(t), len(COLUMNS)))
        part = np.clip((t - t0[k]) / (t1[k] - t0[k]), 0.0, 1.0)
        return np.where((j >= 0)[:, None], cumulative[k] + self.columns()[k] * part[:, None], 0.0)

    def rates_at(self, t_ns: np.ndarray) -> np.ndarray:
        """[n, COLUMNS]: what each column accrues per second at each instant (0 between steps; a step column
        builds up its one step over the step's duration)."""
        j = np.searchsorted(self.t0_ns, t_ns, side="right") - 1
        k = np.maximum(j, 0)
        if not len(self.t0_ns):
            return np.zeros((len(t_ns), len(COLUMNS)))
        running = (j >= 0) & (t_ns < self.t1_ns[k])
        return np.where(running[:, None], self.columns()[k] / self.seconds[k][:, None], 0.0)

    def fractions(self, t0_ns: float, t1_ns: float) -> np.ndarray:
        """(steps,): the share of each step inside [t0, t1]."""
        inside = np.clip(np.minimum(self.t1_ns, t1_ns) - np.maximum(self.t0_ns, t0_ns), 0, None)
        return inside / (self.t1_ns - self.t0_ns)


@dataclasses.dataclass(frozen=True)
class RequestEnergyFit:
    """Costs per unit of COLUMNS (and idle power), their bootstrap draws, and what the data can separate."""

    columns: tuple[str, ...]  # COLUMNS, plus IDLE_COLUMN when idle power was fitted
    coefficients: np.ndarray
    draws: np.ndarray  # [draws, columns]
    given_idle_w: float | None  # the idle baseline used; None: fitted (the last column)
    vif: np.ndarray  # uncentred variance inflation factor of each column
    separable: bool  # prefill told apart from decode
    reason: str | None  # why not
    segments: Segments  # the counter segments fitted
    counter: Segments  # all segments of the counter series (the window's measured energy, edges included)
    folds: list[Fold]
    block_var_j2: float  # variance of the 1 s block sums of the residuals (noise the model cannot know)
    prefill_vif: float = float("nan")  # the prefill block's VIF against the other columns (what decides the split)
    clock: ClockTerm | None = None  # the card-state term the costs hold with (None: costs whatever the clock)
    fitted: Conditions | None = None  # the conditions of the data fitted
    fold_conditions: tuple[Comparison, ...] = ()  # each fold's: its training data against its held-out data
    cap: CapTerm | None = None  # the power-cap term's step-time law (None: per-unit costs whatever the cap)

    def work(self, log: WorkLog, amounts: Callable[[WorkLog], np.ndarray]) -> np.ndarray:
        """[n, work columns]: `amounts` (over COLUMNS) of `log` as this fit counts its work (the clock term's
        multipliers, or the power-cap term's uncapped amounts and capped seconds)."""
        return counted_work(log, self.clock, self.cap, amounts)

    @property
    def prefill(self) -> slice:
        """Where the prefill part's columns sit in the fit's columns (and decode's, and all the work's, below)."""
        return part_columns(self.cap)[0]

    @property
    def decode(self) -> slice:
        return part_columns(self.cap)[1]

    @property
    def work_columns(self) -> slice:
        return slice(0, self.decode.stop)

    def against(self, log: WorkLog, t0_ns: float, t1_ns: float) -> Comparison | None:
        """The conditions of the data fitted against those of [t0, t1] of `log` (a check's two sides)."""
        return None if self.fitted is None else Comparison(self.fitted, work_conditions([(log, t0_ns, t1_ns)]))

    @property
    def intervals(self) -> np.ndarray:
        """[columns, 2]: 95 % bootstrap interval of each coefficient."""
        return np.percentile(self.draws, PERCENTILES, axis=0).T

    @property
    def segment_count(self) -> int:
        return len(self.segments)

    @property
    def idle_w(self) -> float:
        return float(self.coefficients[-1]) if self.given_idle_w is None else self.given_idle_w

    @property
    def idle_draws_w(self) -> np.ndarray:
        return self.draws[:, -1] if self.given_idle_w is None else np.full(len(self.draws), self.given_idle_w)

    @property
    def notes(self) -> list[str]:
        if self.given_idle_w is not None:
            return []
        return ["no idle baseline: idle power fitted as a per-second column (it separates from the work only "
                "where the device idles between steps for varying shares of each counter period)"]

    def design(self, log: WorkLog, a_ns: np.ndarray, b_ns: np.ndarray) -> np.ndarray:
        """[n, columns]: the fit's columns in each [a, b] (seconds appended when idle power is a column)."""
        x = self.work(log, amounts_in(a_ns, b_ns))
        if self.given_idle_w is not None:
            return x
        return np.column_stack([x, (np.asarray(b_ns, float) - np.asarray(a_ns, float)) / 1e9])

    def residuals(self, log: WorkLog) -> np.ndarray:
        """The fit's residuals on its segments (their energy less the given idle power's and the model's)."""
        offset = (self.given_idle_w or 0.0) * self.segments.seconds
        return self.segments.energy_j - offset - self.design(log, self.segments.t0_ns, self.segments.t1_ns) @ \
            self.coefficients

    def predict(self, log: WorkLog, t0_ns: float, t1_ns: float) -> tuple[float, float]:
        """Energy of [t0, t1] predicted from the log, and its bound (Z·(coefficient spread ⊕ block noise), 99 %)."""
        x = self.design(log, np.array([t0_ns]), np.array([t1_ns]))[0]
        offset = 0.0 if self.given_idle_w is None else self.given_idle_w * (t1_ns - t0_ns) / 1e9
        blocks = max(1.0, (t1_ns - t0_ns) / 1e9 / BLOCK_S)
        sigma = np.sqrt(np.var(self.draws @ x) + blocks * self.block_var_j2)
        return float(offset + x @ self.coefficients), float(CLOSURE_Z * sigma)


def fit_request_energy(log: WorkLog, knots: Sequence[Knots], idle_w: float | None, t0_ns: float, t1_ns: float,
                       draws: int = 200, seed: int = 0, clock: ClockTerm | None = None, cap: CapTerm | None = None
                       ) -> RequestEnergyFit:
    """Fit the per-segment model on the counter segments wholly inside [t0, t1] (with the card-state term
    `clock`, if given: its α fixed, the costs fitted at its reference clock; or with the power-cap term `cap`, its
    step-time law fixed, the uncapped costs and the capped powers fitted)."""
    segments = _fitted_segments(knots, t0_ns, t1_ns)
    rng = np.random.default_rng(seed)
    x, rate0, rate1, columns, offset = _segment_design(log, segments, idle_w, clock, cap)
    energy = segments.energy_j - offset
    noise, coef = calibrated_fit(x, energy, segments, rate0, rate1, idle_w or 0.0)
    blocks = blocks_of(segments, BLOCK_S)
    draws_c = bootstrap_powers(x, energy, noise, blocks, draws, rng)
    folds = held_out_halves(x, noise, segments, draws, rng, offset)
    block_sums = np.bincount(blocks, weights=energy - x @ coef)
    vif = variance_inflation(x)
    prefill, decode = part_columns(cap)
    reason = split_reason(x, vif, float(np.median(segments.seconds)), prefill, decode)
    span = (float(segments.t0_ns.min()), float(segments.t1_ns.max()))
    return RequestEnergyFit(columns, coef, draws_c, idle_w, vif, reason is None, reason, segments,
                            _counter_segments(knots), folds, float(np.var(block_sums)), block_inflation(x, prefill),
                            clock, work_conditions([(log, *span)]),
                            tuple(Comparison(work_conditions([(log, span[0], f.t0_ns), (log, f.t1_ns, span[1])]),
                                             work_conditions([(log, f.t0_ns, f.t1_ns)])) for f in folds), cap)


def part_columns(cap: CapTerm | None) -> tuple[slice, slice]:
    """Where the prefill and the decode part's columns sit in a fit's columns, with or without the power-cap term."""
    return (CAP_PREFILL, CAP_DECODE) if cap else (PREFILL, DECODE)


def capped_powers(coefficients: np.ndarray) -> tuple[float, float]:
    """A fit with the power-cap term: its capped dynamic power of prefill and of decode (W), each the last column
    of its part."""
    return float(coefficients[CAP_PREFILL.stop - 1]), float(coefficients[CAP_DECODE.stop - 1])


def counted_work(log: WorkLog, clock: ClockTerm | None, cap: CapTerm | None,
                 amounts: Callable[[WorkLog], np.ndarray]) -> np.ndarray:
    """`amounts` (over COLUMNS) of `log` counted with the clock term, or expanded by the power-cap term (its
    uncapped amounts and capped device seconds: CAP_COLUMNS)."""
    return amounts(log.counted(clock)) if cap is None else cap.expand(log, amounts, PREFILL, DECODE)


def amounts_in(a_ns: np.ndarray, b_ns: np.ndarray) -> Callable[[WorkLog], np.ndarray]:
    """A log's amounts of COLUMNS in each [a, b] (WorkLog.amounts), as counted_work takes them."""
    return lambda log: log.amounts(a_ns, b_ns)


def _fitted_segments(knots: Sequence[Knots], t0_ns: float, t1_ns: float) -> Segments:
    segments = window_segments(knots, t0_ns, t1_ns)
    if len(segments) < MIN_SEGMENTS:
        raise ValidationError(f"{len(segments)} counter segments inside the window, the fit needs {MIN_SEGMENTS}",
                              "meter a longer window, or read the counter faster (jpwr --counter-interval 20)")
    return segments


def _segment_design(log: WorkLog, segments: Segments, idle_w: float | None, clock: ClockTerm | None = None,
                    cap: CapTerm | None = None
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, tuple[str, ...], np.ndarray]:
    """The amounts of each segment (the log counted with `clock` or `cap`), the columns' rates at its knots, the
    columns, and the given idle energy."""
    x = counted_work(log, clock, cap, amounts_in(segments.t0_ns, segments.t1_ns))
    rate0 = counted_work(log, clock, cap, lambda counted: counted.rates_at(segments.t0_ns))
    rate1 = counted_work(log, clock, cap, lambda counted: counted.rates_at(segments.t1_ns))
    columns: tuple[str, ...] = CAP_COLUMNS if cap else COLUMNS
    if idle_w is None:
        x = np.column_stack([x, segments.seconds])
        rate0, rate1 = (np.column_stack([r, np.ones(len(r))]) for r in (rate0, rate1))
        columns = (*columns, IDLE_COLUMN)
    offset = np.zeros(len(segments)) if idle_w is None else idle_w * segments.seconds
    return x, rate0, rate1, columns, offset


def fit_with_clock_trial(log: WorkLog, knots: Sequence[Knots], idle_w: float | None, t0_ns: float, t1_ns: float,
                         held_out: Sequence[HeldOutWindow], draws: int = 200, seed: int = 0
                         ) -> tuple[RequestEnergyFit, TermTrial]:
    """The fit without the card-state term, and with it (α fitted on this window) where the log carries clocks
    that vary; the term's fit is returned where it predicts the `held_out` windows (other rates, never fitted
    here) better (joulebench.clock_term.judged), else the fit without it; the trial says which and why."""
    fit = fit_request_energy(log, knots, idle_w, t0_ns, t1_ns, draws, seed)
    reference = reference_clock([log.sm_clock_hz])
    if isinstance(reference, str):
        return fit, TermTrial.refused(reference)
    measured = [(w, _measured_or_none(w)) for w in held_out if w.log.sm_clock_hz is not None]
    usable = [(w, m) for w, m in measured if m is not None]
    if not usable:
        return fit, TermTrial.refused(NO_HELD_OUT)
    segments = _fitted_segments(knots, t0_ns, t1_ns)
    profile = best_exponent(lambda alpha: _residuals(log.counted(ClockTerm(alpha, reference)), segments, idle_w),
                            blocks_of(segments, BLOCK_S), len(fit.columns))
    with_term = fit_request_energy(log, knots, idle_w, t0_ns, t1_ns, draws, seed, ClockTerm(profile.alpha, reference))
    trial = judged(reference, profile, _held_out_rates(usable, fit, with_term))
    return (with_term if trial.adopted else fit), trial


def fit_with_cap_trial(log: WorkLog, knots: Sequence[Knots], idle_w: float | None, t0_ns: float, t1_ns: float,
                       held_out: Sequence[HeldOutWindow], fit: RequestEnergyFit, clock: TermTrial, draws: int = 200,
                       seed: int = 0) -> tuple[RequestEnergyFit, CapTrial]:
    """The power-cap term (joulebench.cap_term) tried beside the clock term's trial (`fit`: the fit that trial
    chose): its step-time law fitted on the steps of [t0, t1], the costs and capped powers on its segments; its
    fit is returned where it predicts the `held_out` windows (other rates, never fitted here) better (the clock
    term's rule), else `fit`. The trial holds the fit with the term either way (its checks go into the record)."""
    if clock.adopted:
        return fit, CapTrial.refused(CLOCK_ADOPTED)
    try:
        term = CapTerm.of_steps(log, log.fractions(t0_ns, t1_ns))
    except ValidationError as exc:
        return fit, CapTrial.refused(exc.problem)
    with_term = fit_request_energy(log, knots, idle_w, t0_ns, t1_ns, draws, seed, cap=term)
    powers = capped_powers(with_term.coefficients)
    usable = [(w, _measured_or_none(w)) for w in held_out if w.log.capped is not None]
    ratio = likelihood_ratio(fit.residuals(log), with_term.residuals(log), blocks_of(fit.segments, BLOCK_S),
                             len(with_term.columns))
    trial = cap_judged(term, powers, ratio, _held_out_rates([(w, m) for w, m in usable if m is not None], fit,
                                                            with_term), with_term)
    return (with_term if trial.adopted else fit), trial


@dataclasses.dataclass(frozen=True)
class HeldOutWindow:
    """Another rate's measured window, to test a fit on (its steps carry their clocks)."""

    label: str
    log: WorkLog
    knots: Sequence[Knots]
    t0_ns: float
    t1_ns: float


def _held_out_rates(measured: Sequence[tuple[HeldOutWindow, float]], fit: RequestEnergyFit,
                    with_term: RequestEnergyFit) -> list[HeldOutRate]:
    """Each held-out window's measured energy beside its predictions by the fits without and with a term."""
    return [HeldOutRate(w.label, m, fit.predict(w.log, w.t0_ns, w.t1_ns)[0], with_term.predict(w.log, w.t0_ns,
                                                                                              w.t1_ns)[0])
            for w, m in measured]


def _measured_or_none(window: HeldOutWindow) -> float | None:
    try:
        return measured_energy(_counter_segments(window.knots), window.t0_ns, window.t1_ns)[0]
    except ValidationError:
        return None


def _residuals(log: WorkLog, segments: Segments, idle_w: float | None) -> np.ndarray:
    """The residuals the fit of `log` (as counted) leaves on `segments`."""
    x, rate0, rate1, _, offset = _segment_design(log, segments, idle_w)
    energy = segments.energy_j - offset
    _, coef = calibrated_fit(x, energy, segments, rate0, rate1, idle_w or 0.0)
    return energy - x @ coef


def work_conditions(windows: Sequence[tuple[WorkLog, float, float]]) -> Conditions:
    """The card state and step sizes of the work of the windows (each (log, t0, t1); the steps' in-window
    shares); the card state is n/a where a log carries none."""
    parts = [(log, log.fractions(t0, t1)) for log, t0, t1 in windows]
    parts = [(log, share) for log, share in parts if np.any(share > 0)]

    def joined(name: str) -> np.ndarray | None:
        values = [getattr(log, name) for log, _ in parts]
        return None if any(v is None for v in values) else np.concatenate([*values, np.zeros(0)])

    def scaled(name: str) -> np.ndarray:
        return np.concatenate([np.asarray(getattr(log, name), float) * share for log, share in parts] or [np.zeros(0)])

    return Conditions.of_steps(scaled("seconds"), joined("sm_clock_hz"), joined("capped"), scaled("prefill_tokens"),
                               scaled("prefill_steps"), scaled("row_steps"), scaled("decode_steps"),
                               scaled("kv_tokens"))


def variance_inflation(x: np.ndarray) -> np.ndarray:
    """Uncentred VIF per column: ||x_j||² / (its residual after regression on the other columns).

    Uncentred because the model has no intercept: amounts that add up to a constant segment length are fine,
    a column that is a multiple of another (a constant mix) is not. inf where a column is empty or exactly
    a combination of the others.
    """
    out = np.empty(x.shape[1])
    for j in range(x.shape[1]):
        column, others = x[:, j], np.delete(x, j, axis=1)
        fitted = others @ np.linalg.lstsq(others, column, rcond=None)[0] if others.shape[1] else 0.0
        residual = float(np.sum((column - fitted) ** 2))
        norm = float(column @ column)
        out[j] = np.inf if norm == 0 or residual <= 1e-12 * norm else norm / residual
    return out


def block_inflation(x: np.ndarray, block: slice) -> float:
    """Uncentred VIF of a block of columns against the rest: that of the worst-determined combination of them.

    1 / (1 − ρ²) with ρ the cosine of the smallest angle between the span of the block's columns and the span of
    the other columns (their largest uncentred canonical correlation). For a one-column block it is that column's
    VIF. Collinearity inside the block does not count (the block's own span is used, whatever its rank): the
    prefill part a·tokens + e·steps is as well determined when every prefill step has the same size as when not,
    only a and e are not told apart then. inf where the block is empty or a combination of the others lies in it.
    """
    inside = x[:, block]
    others = np.delete(x, np.arange(x.shape[1])[block], axis=1)
    basis_in, basis_out = _span(inside), _span(others)
    if not basis_in.shape[1]:
        return np.inf
    if not basis_out.shape[1]:
        return 1.0
    rho = float(np.linalg.svd(basis_in.T @ basis_out, compute_uv=False).max(initial=0.0))
    return np.inf if 1 - rho * rho <= 1e-12 else 1 / (1 - rho * rho)


def _span(x: np.ndarray) -> np.ndarray:
    """Orthonormal basis of the column span (columns scaled to unit norm first, so the rank is scale-free)."""
    norms = np.linalg.norm(x, axis=0)
    x = x[:, norms > 0] / norms[norms > 0]
    if not x.shape[1]:
        return x
    u, s, _ = np.linalg.svd(x, full_matrices=False)
    return u[:, s > 1e-9 * s.max()]


def split_reason(x: np.ndarray, vif: np.ndarray, segment_s: float, prefill: slice = PREFILL,
                 decode: slice = DECODE) -> str | None:
    """Why prefill cannot be told from decode in this window (None: it can).

    The test is the prefill block's VIF (`block_inflation`: its worst-determined combination against the decode
    and idle columns), not the largest of the prefill columns' own VIFs, which also count prefill tokens against
    prefill steps (collinear whenever prefill steps are of similar size) and would refuse a split that is there.
    """
    if not np.any(x[:, prefill] > 0):
        return "no prefill in the fitted window"
    if not np.any(x[:, decode] > 0):
        return "no decode in the fitted window"
    block = block_inflation(x, prefill)
    if block > MAX_PREFILL_VIF:
        names = (*PREFILL_COLUMNS, CAPPED_COLUMNS[0])
        own = ", ".join(f"{c} {min(v, 9.99e9):.3g}" for c, v in zip(names, vif[prefill], strict=False))
        return (f"the prefill columns' variance inflation factor (as a block) is {min(block, 9.99e9):.3g} (max "
                f"{MAX_PREFILL_VIF:g}; each column's own: {own}): prefill and decode come in a nearly constant mix "
                f"in every {segment_s * 1e3:.0f} ms counter period, so any split between them fits as well")
    return None


def measured_energy(segments: Segments, t0_ns: float, t1_ns: float) -> tuple[float, float]:
    """Counter energy of [t0, t1] over contiguous segments, interpolated inside the two edge segments.

    Bound per edge: the edge segment's energy times the smaller of the two shares it is cut into (power need
    not be even inside it) plus its mean power times the half-width of the knot nearer the edge.
    """
    segments = segments.take(np.flatnonzero((segments.t1_ns > t0_ns) & (segments.t0_ns < t1_ns)))
    if not len(segments) or t0_ns < segments.t0_ns[0] or t1_ns > segments.t1_ns[-1] or t1_ns <= t0_ns:
        raise ValidationError("the window is not covered by the counter's segments",
                              "choose a window inside the metered (fitted) span")
    if np.any(segments.t0_ns[1:] != segments.t1_ns[:-1]):
        raise ValidationError("the counter restarted inside the window (its segments are not contiguous)",
                              "choose a window on one continuous counter series")
    times = np.append(segments.t0_ns, segments.t1_ns[-1])
    cumulative = np.concatenate(([0.0], np.cumsum(segments.energy_j)))
    energy = float(np.interp(t1_ns, times, cumulative) - np.interp(t0_ns, times, cumulative))
    bound = 0.0
    for t in (t0_ns, t1_ns):
        i = int(np.clip(np.searchsorted(times, t, side="right") - 1, 0, len(segments) - 1))
        share = (t - segments.t0_ns[i]) / (segments.t1_ns[i] - segments.t0_ns[i])
        power = segments.energy_j[i] / segments.seconds[i]
        half = segments.half0_ns[i] if share < 0.5 else segments.half1_ns[i]
        bound += min(share, 1 - share) * segments.energy_j[i] + power * half / 1e9
    return energy, bound


def _counter_segments(knots: Sequence[Knots]) -> Segments:
    return window_segments(knots, -np.inf, np.inf)


@dataclasses.dataclass(frozen=True)
class CrossCheck:
    """Test (a): a fit from one run predicting another run's window energy."""

    measured_j: float
    measured_bound_j: float
    predicted_j: float
    predicted_bound_j: float
    conditions: Comparison | None = None  # the fitted data's against the predicted window's

    @property
    def bound_j(self) -> float:
        return self.measured_bound_j + self.predicted_bound_j + CROSS_RATE_SLACK * abs(self.measured_j)

    @property
    def passes(self) -> bool:
        return abs(self.measured_j - self.predicted_j) <= self.bound_j


def cross_check(fit: RequestEnergyFit, other_log: WorkLog, other_knots: Sequence[Knots], t0_ns: float,
                t1_ns: float) -> CrossCheck:
    measured, measured_bound = measured_energy(_counter_segments(other_knots), t0_ns, t1_ns)
    return CrossCheck(measured, measured_bound, *fit.predict(other_log, t0_ns, t1_ns),
                      fit.against(other_log, t0_ns, t1_ns))


@dataclasses.dataclass(frozen=True)
class RequestParts:
    """Each request's energy in a window, in parts, with 95 % intervals ([n, 2]) from the bootstrap draws.

    prefill_j / decode_j are None where the fit cannot split them (`split_reason`); work_j (their sum) is
    always there. Idle intervals are zero-width when the idle power was given (its own uncertainty is the
    idle baseline's, not the fit's).
    """

    ids: np.ndarray
    work_j: np.ndarray
    work_interval: np.ndarray
    prefill_j: np.ndarray | None
    prefill_interval: np.ndarray | None
    decode_j: np.ndarray | None
    decode_interval: np.ndarray | None
    idle_j: np.ndarray
    idle_interval: np.ndarray
    split_reason: str | None
    unattributed_idle_j: float  # idle power while no request was in the system
    measured_j: float  # the counter's energy of the window
    measured_bound_j: float
    remainder_j: float  # measured − requests' parts − unattributed idle (in-sample diagnostic)
    remainder_bound_j: float

    @property
    def total_j(self) -> np.ndarray:
        return self.work_j + self.idle_j


def request_parts(fit: RequestEnergyFit, log: WorkLog, lifetimes: Sequence[tuple[int, int, int]] | np.ndarray,
                  t0_ns: float, t1_ns: float) -> RequestParts:
    """Split the window [t0, t1] (inside the fitted span) over the requests; `lifetimes`: (id, arrival_ns,
    finish_ns) per request. Only the in-window share of each step and lifetime counts."""
    life = np.asarray(lifetimes, dtype=float).reshape(-1, 3)
    order = np.argsort(life[:, 0], kind="stable")
    life = life[order]
    ids = life[:, 0].astype(np.int64)
    per_request = fit.work(log, lambda counted: _request_amounts(counted, ids, t0_ns, t1_ns))  # [n, work columns]
    cost, own_prefill, own_decode = fit.coefficients[fit.work_columns], fit.prefill, fit.decode
    prefill = per_request[:, own_prefill] @ fit.draws[:, own_prefill].T  # [n, draws]
    decode = per_request[:, own_decode] @ fit.draws[:, own_decode].T
    shared_s, empty_s = _idle_shares(life[:, 1], life[:, 2], t0_ns, t1_ns)
    idle_draws = shared_s[:, None] * fit.idle_draws_w[None, :]
    work_j = per_request @ cost
    idle_j = shared_s * fit.idle_w
    unattributed = empty_s * fit.idle_w
    measured, measured_bound = measured_energy(fit.counter, t0_ns, t1_ns)
    remainder = measured - float(work_j.sum() + idle_j.sum()) - unattributed
    _, predicted_bound = fit.predict(log, t0_ns, t1_ns)
    split = fit.reason is None
    return RequestParts(
        ids, work_j, _interval(prefill + decode),
        per_request[:, own_prefill] @ cost[own_prefill] if split else None, _interval(prefill) if split else None,
        per_request[:, own_decode] @ cost[own_decode] if split else None, _interval(decode) if split else None,
        idle_j, _interval(idle_draws), fit.reason, float(unattributed), measured, measured_bound, float(remainder),
        measured_bound + predicted_bound)


def _interval(draws: np.ndarray) -> np.ndarray:
    return np.percentile(draws, PERCENTILES, axis=1).T if draws.shape[1] else np.zeros((len(draws), 2))


def _request_amounts(log: WorkLog, ids: np.ndarray, t0_ns: float, t1_ns: float) -> np.ndarray:
    """[requests, COLUMNS]: each request's in-window prefill tokens, prefill passes (its tokens / the step's
    tokens of each step's passes), decode passes (its row-steps / the step's row-steps of each step's passes),
    row-steps and attended KV tokens."""
    counts = np.diff(log.member_offsets)
    share = np.repeat(log.fractions(t0_ns, t1_ns), counts)
    where = np.searchsorted(ids, log.member_request)
    known = (where < len(ids)) & (ids[np.minimum(where, len(ids) - 1)] == log.member_request) if len(ids) else \
        np.zeros(len(where), dtype=bool)
    counted = share > 0
    if np.any(counted & ~known):
        missing = int(log.member_request[np.argmax(counted & ~known)])
        raise ValidationError(f"request {missing} ran in the window but has no lifetime",
                              "pass a lifetime (id, arrival_ns, finish_ns) for every request in the work log")
    weights = {"prefill_tokens": log.member_prefill_tokens * share,
               "prefill_steps": _shares(log.member_prefill_tokens, log.prefill_tokens, log.prefill_steps, counts)
               * share,
               "decode_steps": _shares(log.member_row_steps, log.row_steps, log.decode_steps, counts) * share,
               "row_steps": log.member_row_steps * share,
               "kv_tokens": log.member_kv_tokens * share}
    index = where[counted]
    return np.column_stack([np.bincount(index, weights[c][counted], minlength=len(ids)) for c in COLUMNS]
                           ).reshape(len(ids), len(COLUMNS))


def _shares(member: np.ndarray, step_total: np.ndarray, passes: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Each member's part of its step's passes: its amount / the step's amount (0 where the step has none)."""
    total, step_passes = np.repeat(step_total, counts).astype(float), np.repeat(passes, counts).astype(float)
    return np.divide(member * step_passes, total, out=np.zeros(len(member)), where=total > 0)


def _idle_shares(arrival_ns: np.ndarray, finish_ns: np.ndarray, t0_ns: float, t1_ns: float
                 ) -> tuple[np.ndarray, float]:
    """Seconds of idle power each request carries (every instant shared equally by the requests in the system,
    arrived and not finished), and the seconds with none in the system, inside [t0, t1]."""
    a, f = np.clip(arrival_ns, t0_ns, t1_ns), np.clip(finish_ns, t0_ns, t1_ns)
    points = np.unique(np.concatenate([a, f, [t0_ns, t1_ns]]))
    middle = (points[:-1] + points[1:]) / 2
    in_system = (np.searchsorted(np.sort(arrival_ns), middle, side="right")
                 - np.searchsorted(np.sort(finish_ns), middle, side="right"))
    length = np.diff(points) / 1e9
    per_request = np.where(in_system > 0, length / np.maximum(in_system, 1), 0.0)
    cumulative = np.concatenate(([0.0], np.cumsum(per_request)))
    shares = cumulative[np.searchsorted(points, f)] - cumulative[np.searchsorted(points, a)]
    return shares, float(length[in_system == 0].sum())


@dataclasses.dataclass(frozen=True)
class PartCheck:
    """One part of test (c): its fitted energy against the counter's energy of its interval less idle."""

    part: str
    measured_j: float  # counter energy − idle power × seconds
    measured_bound_j: float
    predicted_j: float | None  # None: the fit cannot split prefill from decode
    reason: str | None
    conditions: Comparison | None = None  # the fitted data's against the part's interval's

    @property
    def relative_error(self) -> float | None:
        return None if self.predicted_j is None else (self.predicted_j - self.measured_j) / self.measured_j

    @property
    def passes(self) -> bool:
        return self.relative_error is not None and abs(self.relative_error) <= SPLIT_SLACK


def controlled_split_check(fit: RequestEnergyFit, log: WorkLog, knots: Sequence[Knots], prefill_t0: float,
                           prefill_t1: float, decode_t0: float, decode_t1: float) -> tuple[PartCheck, PartCheck]:
    """Test (c): all slots admitted at once, no refills, so prefill and decode run at separate times; the fitted
    prefill part (decode part) predicts the counter's energy of its interval, less idle, within SPLIT_SLACK."""
    segments = _counter_segments(knots)
    out = []
    for part, t0, t1, own, other in (("prefill", prefill_t0, prefill_t1, fit.prefill, fit.decode),
                                     ("decode", decode_t0, decode_t1, fit.decode, fit.prefill)):
        amounts = fit.work(log, amounts_in(np.array([t0]), np.array([t1])))[0]
        if np.any(amounts[other] > 0):
            raise ValidationError(f"the {part} interval holds {'decode' if part == 'prefill' else 'prefill'} "
                                  "work", "pass intervals where only that part ran (a controlled-split run: all "
                                          "slots admitted at once, no refills)")
        energy, bound = measured_energy(segments, t0, t1)
        dynamic = energy - fit.idle_w * (t1 - t0) / 1e9
        predicted = None if fit.reason else float(amounts[own] @ fit.coefficients[own])
        out.append(PartCheck(part, dynamic, bound, predicted, fit.reason, fit.against(log, t0, t1)))
    return out[0], out[1]
