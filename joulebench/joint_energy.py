"""Per-request energy fitted jointly over the rates of one sweep (one engine, model and device).

A rate alone shows the work in the mix its load makes: at a few requests per second a decode step runs a few rows,
at `max` all of them, so a fit on one rate cannot tell a decode step's fixed cost from its cost per row (the two
columns move together there) and predicts another rate, or the controlled-split window's full batch, only as far
as that mix reaches. The steps of every rate cost the same per unit of work, so the rates' counter segments are
fitted together with the coefficients of joulebench/request_energy.py's COLUMNS shared; each run keeps its own idle
power (its measured baseline, or a per-second column of its own where it has none). The bootstrap draws each
run's 1 s blocks from that run (stratified), so every draw keeps the rates' shares of the data.

Its checks, per rate, are all out of sample:
(a) cross-rate: a fit on every other rate predicts this rate's window energy (leave one rate out);
(b) held-out halves: a fit on every other rate and one half of this rate's span predicts the other half;
(c) the controlled split with the joint coefficients (the controlled window is never fitted).
The thresholds are request_energy's (CROSS_RATE_SLACK, SPLIT_SLACK, CLOSURE_Z); nothing here is tuned to pass.

The card-state term (joulebench.clock_term) is tried where the rates' logs carry SM clocks that vary: each rate is
predicted by the other rates' fit without it and with it (α and costs fitted on those rates only), and the term is
adopted where it predicts them better (`JointFit.clock` says so, or why not, with both figures). Adopted, every
check stays out of sample: α is fitted again without the held-out half or rate, as the costs are.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from joulebench.card_state import Comparison, Conditions
from joulebench.clock_term import ClockTerm, HeldOutRate, Profile, TermTrial, best_exponent, judged, reference_clock
from joulebench.request_energy import (
    COLUMNS,
    IDLE_COLUMN,
    PERCENTILES,
    PREFILL,
    RequestEnergyFit,
    WorkLog,
    block_inflation,
    measured_energy,
    split_reason,
    variance_inflation,
    work_conditions,
)
from joulebench.segment_fit import (
    BLOCK_S,
    MIN_SEGMENTS,
    Fold,
    Segments,
    blocks_of,
    bootstrap_powers,
    calibrated_fit,
    corrected_nnls,
    held_out_fold,
    window_segments,
)
from jpwr import ValidationError
from jpwr.trace import Knots

MIN_RATES = 2


@dataclasses.dataclass(frozen=True)
class RateWindow:
    """One rate's material: its engine steps, its counter, its idle power (None: fitted), the fitted span (the
    load's first step to its last where the counter covers it) and its measured window (the cross-rate check's)."""

    label: str
    log: WorkLog
    knots: Sequence[Knots]
    idle_w: float | None
    span: tuple[float, float]
    window: tuple[float, float]


@dataclasses.dataclass(frozen=True)
class JointFit:
    """The shared coefficients, their draws, and each rate's view of them (`per_rate`: a RequestEnergyFit that
    request_energy's checks and request_parts take as they are) with the leave-one-rate-out fit viewed for that
    rate (`left_out`, or why there is none); `clock`: the card-state term's trial (adopted or why not)."""

    labels: tuple[str, ...]
    columns: tuple[str, ...]
    coefficients: np.ndarray
    draws: np.ndarray
    vif: np.ndarray
    prefill_vif: float
    reason: str | None
    segment_count: int
    per_rate: dict[str, RequestEnergyFit]
    left_out: dict[str, RequestEnergyFit | str]
    clock: TermTrial

    @property
    def intervals(self) -> np.ndarray:
        return np.percentile(self.draws, PERCENTILES, axis=0).T


def fitted_rates(runs: Sequence[RateWindow]) -> tuple[list[RateWindow], dict[str, str]]:
    """The runs a joint fit can take, and why each other one is left out (too few counter segments in its span)."""
    kept, left = [], {}
    for run in runs:
        count = len(window_segments(run.knots, *run.span))
        if count < MIN_SEGMENTS:
            left[run.label] = f"{count} counter segments inside its span, the fit needs {MIN_SEGMENTS}"
        else:
            kept.append(run)
    return kept, left


def fit_joint(runs: Sequence[RateWindow], draws: int = 200, seed: int = 0, clock: bool = True) -> JointFit:
    """Fit COLUMNS' shared costs on every run's counter segments inside its span (module docstring); `clock`:
    try the card-state term (False: the fit without it, its trial refused as not tried)."""
    labels = [r.label for r in runs]
    if len(runs) < MIN_RATES or len(set(labels)) != len(labels):
        raise ValidationError(f"a joint fit needs at least {MIN_RATES} rates with distinct labels, got {labels}",
                              "fit one rate with joulebench.request_energy.fit_request_energy")
    reference = reference_clock([r.log.sm_clock_hz for r in runs])
    designs = _Designs(runs, None if isinstance(reference, str) else reference)
    base = _fit(designs, runs, None, draws, seed, TermTrial.refused(NOT_TRIED))
    if not clock:
        return base
    if isinstance(reference, str):
        return dataclasses.replace(base, clock=TermTrial.refused(reference))
    trial = _trial(designs, runs, base)
    if trial.term is None or not trial.adopted:
        return dataclasses.replace(base, clock=trial)
    return _fit(designs, runs, trial.term.exponent, draws, seed, trial)


NOT_TRIED = "not tried (the fit was asked without it)"


@dataclasses.dataclass(frozen=True)
class _Design:
    """The rates' segments stacked: shared work columns, then one idle column per run without a baseline."""

    columns: tuple[str, ...]
    x: np.ndarray
    energy: np.ndarray  # segment energy less the given idle power's share
    offset: np.ndarray
    segments: Segments
    run: np.ndarray  # run index of each row
    blocks: np.ndarray  # 1 s block of each row, numbered across runs
    rate0: np.ndarray
    rate1: np.ndarray
    base_w: np.ndarray  # the given idle power at each row (0 where fitted)
    idle_column: dict[int, int]  # run index -> its idle column, for runs without a baseline
    term: ClockTerm | None  # how each step's work was counted

    def calibrated(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The knot noise and the fit of `rows` (request_energy's calibrated fit)."""
        return calibrated_fit(self.x[rows], self.energy[rows], self.segments.take(rows), self.rate0[rows],
                              self.rate1[rows], self.base_w[rows])


class _Designs:
    """The stacked design without the term and at each α tried, each built once."""

    def __init__(self, runs: Sequence[RateWindow], reference_hz: float | None) -> None:
        self.runs, self.reference_hz = runs, reference_hz
        self._built: dict[float | None, _Design] = {}
        self._noise: dict[float | None, tuple[np.ndarray, np.ndarray]] = {}

    def at(self, alpha: float | None) -> _Design:
        if alpha not in self._built:
            term = None if alpha is None or self.reference_hz is None else ClockTerm(alpha, self.reference_hz)
            self._built[alpha] = _design(self.runs, term)
        return self._built[alpha]

    def calibrated(self, alpha: float | None) -> tuple[np.ndarray, np.ndarray]:
        """The knot noise and the fit on every row at α."""
        if alpha not in self._noise:
            design = self.at(alpha)
            self._noise[alpha] = design.calibrated(np.ones(len(design.run), dtype=bool))
        return self._noise[alpha]

    def profile(self, rows: np.ndarray) -> Profile:
        """α fitted on `rows` only (least squares over clock_term.EXPONENTS) and how far they determine it."""
        def residuals(alpha: float) -> np.ndarray:
            design = self.at(alpha)
            _, coef = design.calibrated(rows)
            return design.energy[rows] - design.x[rows] @ coef
        base = self.at(None)
        return best_exponent(residuals, base.blocks[rows], base.x.shape[1])

    def exponent(self, rows: np.ndarray) -> float:
        return self.profile(rows).alpha


def _fit(designs: _Designs, runs: Sequence[RateWindow], alpha: float | None, draws: int, seed: int,
         trial: TermTrial) -> JointFit:
    """The joint fit at α (None: without the term) and each rate's checks' models."""
    design = designs.at(alpha)
    rng = np.random.default_rng(seed)
    noise, coef = designs.calibrated(alpha)
    draws_c = bootstrap_powers(design.x, design.energy, noise, design.blocks, draws, rng, design.run)
    vif = variance_inflation(design.x)
    reason = split_reason(design.x, vif, float(np.median(design.segments.seconds)))
    prefill_vif = block_inflation(design.x, PREFILL)
    fitted = work_conditions([(r.log, *r.span) for r in runs])
    per_rate: dict[str, RequestEnergyFit] = {}
    left_out: dict[str, RequestEnergyFit | str] = {}
    for k, run in enumerate(runs):
        own = design.run == k
        folds, sides = _halves(designs, alpha, runs, k, draws, rng)
        per_rate[run.label] = _view(design, k, run, coef, draws_c, vif, reason, prefill_vif, folds,
                                    _block_var(design, coef, own), fitted, sides)
        left_out[run.label] = _left_out(designs, alpha, k, runs, vif, reason, prefill_vif, draws, rng)
    return JointFit(tuple(r.label for r in runs), design.columns, coef, draws_c, vif, prefill_vif, reason,
                    len(design.run), per_rate, left_out, trial)


def _trial(designs: _Designs, runs: Sequence[RateWindow], base: JointFit) -> TermTrial:
    """The term tried: each rate with an idle baseline predicted by the other rates' fit without the term (the
    base fit's leave-one-out model) and with it (α and costs fitted on the other rates)."""
    reference = designs.reference_hz
    assert reference is not None
    everything = np.ones(len(designs.at(None).run), dtype=bool)
    held = []
    for k, run in enumerate(runs):
        model = base.left_out[run.label]
        if isinstance(model, str):
            continue
        try:
            measured = measured_energy(model.counter, *run.window)[0]
        except ValidationError:
            continue  # its window is not on its counter: its own (a) check says so
        others = designs.at(None).run != k
        alpha = designs.exponent(others)
        coef = _left_out_coefficients(designs, alpha, k)
        seconds = (run.window[1] - run.window[0]) / 1e9
        assert run.idle_w is not None  # a model without a baseline is a reason (str), above
        amounts = run.log.counted(ClockTerm(alpha, reference)).amounts(np.array([run.window[0]]),
                                                                        np.array([run.window[1]]))[0]
        held.append(HeldOutRate(run.label, measured, model.predict(run.log, *run.window)[0],
                                float(run.idle_w * seconds + amounts @ coef[:len(COLUMNS)])))
    return judged(reference, designs.profile(everything), held)


def _design(runs: Sequence[RateWindow], term: ClockTerm | None) -> _Design:
    """Each run's segments inside its span, its amounts (counted with `term`) and knot rates, stacked in run
    order."""
    fitted_idle = [k for k, r in enumerate(runs) if r.idle_w is None]
    idle_column = {k: len(COLUMNS) + n for n, k in enumerate(fitted_idle)}
    columns = (*COLUMNS, *(f"idle_w[{runs[k].label}]" for k in fitted_idle))
    parts, xs, r0s, r1s, offsets, base, run_of, blocks = [], [], [], [], [], [], [], []
    first_block = 0
    for k, run in enumerate(runs):
        segments = window_segments(run.knots, *run.span)
        if len(segments) < MIN_SEGMENTS:
            raise ValidationError(f"rate {run.label}: {len(segments)} counter segments inside its span, the fit "
                                  f"needs {MIN_SEGMENTS}", "meter a longer load, or leave that rate out")
        log = run.log.counted(term)
        extra = np.zeros((len(segments), len(fitted_idle)))
        extra_rate = np.zeros_like(extra)
        if k in idle_column:
            extra[:, idle_column[k] - len(COLUMNS)] = segments.seconds
            extra_rate[:, idle_column[k] - len(COLUMNS)] = 1.0
        xs.append(np.column_stack([log.amounts(segments.t0_ns, segments.t1_ns), extra]))
        r0s.append(np.column_stack([log.rates_at(segments.t0_ns), extra_rate]))
        r1s.append(np.column_stack([log.rates_at(segments.t1_ns), extra_rate]))
        idle = run.idle_w or 0.0
        offsets.append(idle * segments.seconds)
        base.append(np.full(len(segments), idle))
        run_of.append(np.full(len(segments), k))
        own_blocks = np.unique(blocks_of(segments, BLOCK_S), return_inverse=True)[1]
        blocks.append(own_blocks + first_block)
        first_block += int(own_blocks.max()) + 1
        parts.append(segments)
    segments = Segments.joined(parts)
    offset = np.concatenate(offsets)
    return _Design(columns, np.vstack(xs), segments.energy_j - offset, offset, segments, np.concatenate(run_of),
                   np.concatenate(blocks), np.vstack(r0s), np.vstack(r1s), np.concatenate(base), idle_column, term)


def _halves(designs: _Designs, alpha: float | None, runs: Sequence[RateWindow], k: int, draws: int,
            rng: np.random.Generator) -> tuple[list[Fold], tuple[Comparison, ...]]:
    """Test (b) for run k: each contiguous half of its span predicted by a fit on every other run and its other
    half (α too, with the term); the held-out noise from its own training half's block residuals. With each fold
    the conditions of its two sides."""
    design = designs.at(alpha)
    own = design.run == k
    middle = np.median(design.segments.t0_ns[own])
    run = runs[k]
    others = [(r.log, *r.span) for j, r in enumerate(runs) if j != k]
    folds, sides = [], []
    for test in (own & (design.segments.t0_ns < middle), own & (design.segments.t0_ns >= middle)):
        if test.sum() < 2:
            continue
        fold_alpha = None if alpha is None else designs.exponent(~test)
        fold_design = designs.at(fold_alpha)
        noise = designs.calibrated(fold_alpha)[0]
        fold = held_out_fold(fold_design.x, noise, fold_design.segments, fold_design.offset, ~test, test,
                             fold_design.blocks, draws, rng, fold_design.run, own & ~test)
        folds.append(fold)
        sides.append(Comparison(work_conditions([*others, (run.log, run.span[0], fold.t0_ns),
                                                 (run.log, fold.t1_ns, run.span[1])]),
                                work_conditions([(run.log, fold.t0_ns, fold.t1_ns)])))
    return folds, tuple(sides)


def _block_var(design: _Design, coef: np.ndarray, rows: np.ndarray) -> float:
    """Variance of the 1 s block sums of the residuals of `rows` (one run's: the noise its windows carry)."""
    blocks = np.unique(design.blocks[rows], return_inverse=True)[1]
    return float(np.var(np.bincount(blocks, weights=design.energy[rows] - design.x[rows] @ coef)))


def _run_columns(design: _Design, k: int) -> np.ndarray:
    """The columns of run k's own model: the shared work columns and its idle column, if fitted."""
    return np.array([*range(len(COLUMNS)), *([design.idle_column[k]] if k in design.idle_column else [])])


def _view(design: _Design, k: int, run: RateWindow, coef: np.ndarray, draws_c: np.ndarray, vif: np.ndarray,
          reason: str | None, prefill_vif: float, folds: list[Fold], block_var: float, fitted: Conditions,
          sides: tuple[Comparison, ...]) -> RequestEnergyFit:
    """Run k's model as a RequestEnergyFit (its idle column named as request_energy names it)."""
    cols = _run_columns(design, k)
    names = (*COLUMNS, *([IDLE_COLUMN] if k in design.idle_column else []))
    own = design.run == k
    segments = design.segments.take(np.flatnonzero(own))
    counter = window_segments(run.knots, -np.inf, np.inf)
    return RequestEnergyFit(names, coef[cols], draws_c[:, cols], run.idle_w, vif[cols], reason is None, reason,
                            segments, counter, folds, block_var, prefill_vif, design.term, fitted, sides)


def _left_out_coefficients(designs: _Designs, alpha: float | None, k: int) -> np.ndarray:
    """The costs fitted on every run but k at α (its design's knot noise)."""
    design = designs.at(alpha)
    train = design.run != k
    return corrected_nnls(design.x[train], design.energy[train], designs.calibrated(alpha)[0][train])


def _left_out(designs: _Designs, alpha: float | None, k: int, runs: Sequence[RateWindow], vif: np.ndarray,
              reason: str | None, prefill_vif: float, draws: int, rng: np.random.Generator) -> RequestEnergyFit | str:
    """Test (a)'s model for run k: the fit on every other run (α too, with the term; its idle power must be
    given: a left-out run's fitted idle power is unknown to the others)."""
    run = runs[k]
    if run.idle_w is None:
        return "no idle baseline for this rate: a fit on the other rates cannot know its idle power"
    alpha = None if alpha is None else designs.exponent(designs.at(None).run != k)
    design = designs.at(alpha)
    train = design.run != k  # run k has no idle column (its idle power is given)
    x, energy, nz = design.x[train], design.energy[train], designs.calibrated(alpha)[0][train]
    coef = _left_out_coefficients(designs, alpha, k)
    draws_c = bootstrap_powers(x, energy, nz, design.blocks[train], draws, rng, design.run[train])
    blocks = np.unique(design.blocks[train], return_inverse=True)[1]
    block_var = float(np.var(np.bincount(blocks, weights=energy - x @ coef)))
    work = np.arange(len(COLUMNS))
    own = design.run == k
    fitted = work_conditions([(r.log, *r.span) for j, r in enumerate(runs) if j != k])
    return RequestEnergyFit(COLUMNS, coef[work], draws_c[:, work], run.idle_w, vif[work], reason is None, reason,
                            design.segments.take(np.flatnonzero(own)), window_segments(run.knots, -np.inf, np.inf),
                            [], block_var, prefill_vif, design.term, fitted)
