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

Where the clock term is not adopted, the power-cap term (joulebench.cap_term) is tried the same way (one card-state
term at a time): its step-time law is fitted on the steps of the data fitted (every rate's, weighted by its capped
share), the uncapped costs and capped powers on their segments; each check refits the law and the costs without the
rate or half it predicts. It is adopted by the cap term's rule (its likelihood ratio against the fit without it over
1 s blocks above CLOSURE_Z², and each rate's window energy predicted better by the other rates' fit with it than
without it); `JointFit.cap` says so or why not, and `cap_fits` holds both fits, whose checks show its effect.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np

from joulebench.cap_term import CLOCK_ADOPTED, CapTerm, CapTrial
from joulebench.cap_term import judged as cap_judged
from joulebench.card_state import Comparison, Conditions
from joulebench.clock_term import (
    ClockTerm,
    HeldOutRate,
    Profile,
    TermTrial,
    best_exponent,
    judged,
    likelihood_ratio,
    reference_clock,
)
from joulebench.request_energy import (
    CAP_COLUMNS,
    COLUMNS,
    IDLE_COLUMN,
    PERCENTILES,
    RequestEnergyFit,
    WorkLog,
    amounts_in,
    block_inflation,
    capped_powers,
    counted_work,
    measured_energy,
    part_columns,
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
_Term = float | CapTerm | None  # how a design counts the work: α of the clock term, the power-cap law, or neither


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
    rate (`left_out`, or why there is none); `clock`, `cap`: the card-state terms' trials (adopted or why not);
    `cap_fits`: the fits without and with the power-cap term where it was fitted (each check's effect)."""

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
    cap: CapTrial
    cap_fits: tuple[JointFit, JointFit] | None = None

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
    try the card-state terms, the clock term, then the power-cap term where it is not adopted (False: the fit
    without them, their trials refused as not tried)."""
    labels = [r.label for r in runs]
    if len(runs) < MIN_RATES or len(set(labels)) != len(labels):
        raise ValidationError(f"a joint fit needs at least {MIN_RATES} rates with distinct labels, got {labels}",
                              "fit one rate with joulebench.request_energy.fit_request_energy")
    reference = reference_clock([r.log.sm_clock_hz for r in runs])
    designs = _Designs(runs, None if isinstance(reference, str) else reference)
    base = _fit(designs, runs, None, draws, seed, TermTrial.refused(NOT_TRIED), CapTrial.refused(NOT_TRIED))
    if not clock:
        return base
    trial = TermTrial.refused(reference) if isinstance(reference, str) else _trial(designs, runs, base)
    if trial.term is not None and trial.adopted:
        return _fit(designs, runs, trial.term.exponent, draws, seed, trial, CapTrial.refused(CLOCK_ADOPTED))
    base = dataclasses.replace(base, clock=trial)
    try:
        law = designs.cap_law(designs.everything)
    except ValidationError as exc:  # no cap state, or never capped
        return dataclasses.replace(base, cap=CapTrial.refused(exc.problem))
    try:
        with_cap = _fit(designs, runs, law, draws, seed, trial, base.cap)
    except ValidationError as exc:  # the law refitted for a check: its training data never capped
        return dataclasses.replace(base, cap=CapTrial.refused(f"a check's training data (the other rates, or a rate "
                                                              f"but its held-out half): {exc.problem}"))
    cap = _cap_trial(designs, runs, law, base, with_cap)
    chosen = with_cap if cap.adopted else base
    return dataclasses.replace(chosen, cap=cap, cap_fits=(base, with_cap))


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
    term: ClockTerm | None  # how each step's work was counted: with the clock term's multipliers,
    cap: CapTerm | None  # or as uncapped amounts and capped device seconds (CAP_COLUMNS)

    @property
    def work_columns(self) -> tuple[str, ...]:
        return CAP_COLUMNS if self.cap else COLUMNS

    @property
    def parts(self) -> tuple[slice, slice]:
        """Where prefill's and decode's columns sit."""
        return part_columns(self.cap)

    def calibrated(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The knot noise and the fit of `rows` (request_energy's calibrated fit)."""
        return calibrated_fit(self.x[rows], self.energy[rows], self.segments.take(rows), self.rate0[rows],
                              self.rate1[rows], self.base_w[rows])


class _Designs:
    """The stacked design without a term, at each α tried and with each power-cap law fitted, each built once."""

    def __init__(self, runs: Sequence[RateWindow], reference_hz: float | None) -> None:
        self.runs, self.reference_hz = runs, reference_hz
        self._built: dict[float | bytes | None, _Design] = {}
        self._noise: dict[float | bytes | None, tuple[np.ndarray, np.ndarray]] = {}

    @staticmethod
    def _key(term: _Term) -> float | bytes | None:
        return term.seconds_per_unit.tobytes() if isinstance(term, CapTerm) else term

    def at(self, term: _Term) -> _Design:
        key = self._key(term)
        if key not in self._built:
            if isinstance(term, CapTerm):
                self._built[key] = _design(self.runs, None, term)
            else:
                clock = None if term is None or self.reference_hz is None else ClockTerm(term, self.reference_hz)
                self._built[key] = _design(self.runs, clock, None)
        return self._built[key]

    def calibrated(self, term: _Term) -> tuple[np.ndarray, np.ndarray]:
        """The knot noise and the fit on every row with the term."""
        key = self._key(term)
        if key not in self._noise:
            self._noise[key] = self.at(term).calibrated(self.everything)
        return self._noise[key]

    @property
    def everything(self) -> np.ndarray:
        return np.ones(len(self.at(None).run), dtype=bool)

    def refitted(self, term: _Term, rows: np.ndarray) -> _Term:
        """The term of the same kind fitted on `rows` only (α, or the power-cap law on their steps)."""
        if term is None:
            return None
        return self.cap_law(rows) if isinstance(term, CapTerm) else self.exponent(rows)

    def cap_law(self, rows: np.ndarray) -> CapTerm:
        """The power-cap term's step-time law fitted on the steps under `rows` (each run's steps by their share
        inside each contiguous stretch of its rows' segments)."""
        base = self.at(None)
        parts = []
        for k, run in enumerate(self.runs):
            own = np.flatnonzero(rows & (base.run == k))
            share = np.zeros(len(run.log.t0_ns))
            for stretch in np.split(own, np.flatnonzero(np.diff(own) > 1) + 1):
                if len(stretch):
                    share += run.log.fractions(base.segments.t0_ns[stretch[0]], base.segments.t1_ns[stretch[-1]])
            parts.append((run.log, share))
        return CapTerm.of_logs(parts)

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


def _fit(designs: _Designs, runs: Sequence[RateWindow], term: _Term, draws: int, seed: int, trial: TermTrial,
         cap: CapTrial) -> JointFit:
    """The joint fit with the term (α, or the power-cap law; None: without) and each rate's checks' models (the
    term refitted for each)."""
    design = designs.at(term)
    rng = np.random.default_rng(seed)
    noise, coef = designs.calibrated(term)
    draws_c = bootstrap_powers(design.x, design.energy, noise, design.blocks, draws, rng, design.run)
    vif = variance_inflation(design.x)
    reason = split_reason(design.x, vif, float(np.median(design.segments.seconds)), *design.parts)
    prefill_vif = block_inflation(design.x, design.parts[0])
    fitted = work_conditions([(r.log, *r.span) for r in runs])
    per_rate: dict[str, RequestEnergyFit] = {}
    left_out: dict[str, RequestEnergyFit | str] = {}
    for k, run in enumerate(runs):
        own = design.run == k
        folds, sides = _halves(designs, term, runs, k, draws, rng)
        per_rate[run.label] = _view(design, k, run, coef, draws_c, vif, reason, prefill_vif, folds,
                                    _block_var(design, coef, own), fitted, sides)
        left_out[run.label] = _left_out(designs, term, k, runs, vif, reason, prefill_vif, draws, rng)
    return JointFit(tuple(r.label for r in runs), design.columns, coef, draws_c, vif, prefill_vif, reason,
                    len(design.run), per_rate, left_out, trial, cap)


def _trial(designs: _Designs, runs: Sequence[RateWindow], base: JointFit) -> TermTrial:
    """The term tried: each rate with an idle baseline predicted by the other rates' fit without the term (the
    base fit's leave-one-out model) and with it (α and costs fitted on the other rates)."""
    reference = designs.reference_hz
    assert reference is not None
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
    return judged(reference, designs.profile(designs.everything), held)


def _cap_trial(designs: _Designs, runs: Sequence[RateWindow], law: CapTerm, base: JointFit, with_cap: JointFit
               ) -> CapTrial:
    """The power-cap term judged: its likelihood ratio on every row against the fit without it, and each rate with
    an idle baseline predicted by the other rates' fits without it and with it (law, costs and powers fitted on
    those rates only: the fits' leave-one-out models); `law`: the one fitted on every row."""
    without, with_term = designs.at(None), designs.at(law)
    ratio = likelihood_ratio(without.energy - without.x @ designs.calibrated(None)[1],
                             with_term.energy - with_term.x @ designs.calibrated(law)[1], without.blocks,
                             with_term.x.shape[1])
    held = []
    for run in runs:
        plain, capped = base.left_out[run.label], with_cap.left_out[run.label]
        if isinstance(plain, str) or isinstance(capped, str):
            continue
        try:
            measured = measured_energy(plain.counter, *run.window)[0]
        except ValidationError:
            continue  # its window is not on its counter: its own (a) check says so
        held.append(HeldOutRate(run.label, measured, plain.predict(run.log, *run.window)[0],
                                capped.predict(run.log, *run.window)[0]))
    powers = capped_powers(with_cap.coefficients)
    return cap_judged(law, powers, ratio, held)


def _design(runs: Sequence[RateWindow], term: ClockTerm | None, cap: CapTerm | None) -> _Design:
    """Each run's segments inside its span, its amounts (counted with `term`, or expanded by `cap`) and knot
    rates, stacked in run order."""
    work = CAP_COLUMNS if cap else COLUMNS
    fitted_idle = [k for k, r in enumerate(runs) if r.idle_w is None]
    idle_column = {k: len(work) + n for n, k in enumerate(fitted_idle)}
    columns = (*work, *(f"idle_w[{runs[k].label}]" for k in fitted_idle))
    parts, xs, offsets, base, run_of, blocks = [], [], [], [], [], []
    r0s: list[np.ndarray] = []
    r1s: list[np.ndarray] = []
    first_block = 0
    for k, run in enumerate(runs):
        segments = window_segments(run.knots, *run.span)
        if len(segments) < MIN_SEGMENTS:
            raise ValidationError(f"rate {run.label}: {len(segments)} counter segments inside its span, the fit "
                                  f"needs {MIN_SEGMENTS}", "meter a longer load, or leave that rate out")
        extra = np.zeros((len(segments), len(fitted_idle)))
        extra_rate = np.zeros_like(extra)
        if k in idle_column:
            extra[:, idle_column[k] - len(work)] = segments.seconds
            extra_rate[:, idle_column[k] - len(work)] = 1.0
        xs.append(np.column_stack([counted_work(run.log, term, cap, amounts_in(segments.t0_ns, segments.t1_ns)),
                                   extra]))
        for rates, t_ns in ((r0s, segments.t0_ns), (r1s, segments.t1_ns)):
            rates.append(np.column_stack([counted_work(run.log, term, cap, _rates_at(t_ns)), extra_rate]))
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
                   np.concatenate(blocks), np.vstack(r0s), np.vstack(r1s), np.concatenate(base), idle_column, term,
                   cap)


def _rates_at(t_ns: np.ndarray) -> Callable[[WorkLog], np.ndarray]:
    """A log's rates of COLUMNS at each instant (WorkLog.rates_at), as counted_work takes them."""
    return lambda log: log.rates_at(t_ns)


def _halves(designs: _Designs, term: _Term, runs: Sequence[RateWindow], k: int, draws: int,
            rng: np.random.Generator) -> tuple[list[Fold], tuple[Comparison, ...]]:
    """Test (b) for run k: each contiguous half of its span predicted by a fit on every other run and its other
    half (α or the power-cap law too, with a term); the held-out noise from its own training half's block
    residuals. With each fold the conditions of its two sides."""
    design = designs.at(term)
    own = design.run == k
    middle = np.median(design.segments.t0_ns[own])
    run = runs[k]
    others = [(r.log, *r.span) for j, r in enumerate(runs) if j != k]
    folds, sides = [], []
    for test in (own & (design.segments.t0_ns < middle), own & (design.segments.t0_ns >= middle)):
        if test.sum() < 2:
            continue
        fold_term = designs.refitted(term, ~test)
        fold_design = designs.at(fold_term)
        noise = designs.calibrated(fold_term)[0]
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
    return np.array([*range(len(design.work_columns)), *([design.idle_column[k]] if k in design.idle_column else [])])


def _view(design: _Design, k: int, run: RateWindow, coef: np.ndarray, draws_c: np.ndarray, vif: np.ndarray,
          reason: str | None, prefill_vif: float, folds: list[Fold], block_var: float, fitted: Conditions,
          sides: tuple[Comparison, ...]) -> RequestEnergyFit:
    """Run k's model as a RequestEnergyFit (its idle column named as request_energy names it)."""
    cols = _run_columns(design, k)
    names = (*design.work_columns, *([IDLE_COLUMN] if k in design.idle_column else []))
    own = design.run == k
    segments = design.segments.take(np.flatnonzero(own))
    counter = window_segments(run.knots, -np.inf, np.inf)
    return RequestEnergyFit(names, coef[cols], draws_c[:, cols], run.idle_w, vif[cols], reason is None, reason,
                            segments, counter, folds, block_var, prefill_vif, design.term, fitted, sides, design.cap)


def _left_out_coefficients(designs: _Designs, term: _Term, k: int) -> np.ndarray:
    """The costs fitted on every run but k with the term (its design's knot noise)."""
    design = designs.at(term)
    train = design.run != k
    return corrected_nnls(design.x[train], design.energy[train], designs.calibrated(term)[0][train])


def _left_out(designs: _Designs, term: _Term, k: int, runs: Sequence[RateWindow], vif: np.ndarray,
              reason: str | None, prefill_vif: float, draws: int, rng: np.random.Generator) -> RequestEnergyFit | str:
    """Test (a)'s model for run k: the fit on every other run (α or the power-cap law too, with a term; its idle
    power must be given: a left-out run's fitted idle power is unknown to the others)."""
    run = runs[k]
    if run.idle_w is None:
        return "no idle baseline for this rate: a fit on the other rates cannot know its idle power"
    term = designs.refitted(term, designs.at(None).run != k)
    design = designs.at(term)
    train = design.run != k  # run k has no idle column (its idle power is given)
    x, energy, nz = design.x[train], design.energy[train], designs.calibrated(term)[0][train]
    coef = _left_out_coefficients(designs, term, k)
    draws_c = bootstrap_powers(x, energy, nz, design.blocks[train], draws, rng, design.run[train])
    blocks = np.unique(design.blocks[train], return_inverse=True)[1]
    block_var = float(np.var(np.bincount(blocks, weights=energy - x @ coef)))
    work = np.arange(len(design.work_columns))
    own = design.run == k
    fitted = work_conditions([(r.log, *r.span) for j, r in enumerate(runs) if j != k])
    return RequestEnergyFit(design.work_columns, coef[work], draws_c[:, work], run.idle_w, vif[work], reason is None,
                            reason, design.segments.take(np.flatnonzero(own)),
                            window_segments(run.knots, -np.inf, np.inf), [], block_var, prefill_vif, design.term,
                            fitted, cap=design.cap)
