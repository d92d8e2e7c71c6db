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
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from joulebench.request_energy import (
    COLUMNS,
    IDLE_COLUMN,
    PERCENTILES,
    PREFILL,
    RequestEnergyFit,
    WorkLog,
    block_inflation,
    split_reason,
    variance_inflation,
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


@dataclasses.dataclass(frozen=True)
class JointFit:
    """The shared coefficients, their draws, and each rate's view of them (`per_rate`: a RequestEnergyFit that
    request_energy's checks and request_parts take as they are) with the leave-one-rate-out fit viewed for that
    rate (`left_out`, or why there is none)."""

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

    @property
    def intervals(self) -> np.ndarray:
        return np.percentile(self.draws, PERCENTILES, axis=0).T


def fit_joint(runs: Sequence[RateWindow], draws: int = 200, seed: int = 0) -> JointFit:
    """Fit COLUMNS' shared costs on every run's counter segments inside its span (module docstring)."""
    labels = [r.label for r in runs]
    if len(runs) < MIN_RATES or len(set(labels)) != len(labels):
        raise ValidationError(f"a joint fit needs at least {MIN_RATES} rates with distinct labels, got {labels}",
                              "fit one rate with joulebench.request_energy.fit_request_energy")
    design = _design(runs)
    rng = np.random.default_rng(seed)
    noise, coef = calibrated_fit(design.x, design.energy, design.segments, design.rate0, design.rate1,
                                 design.base_w)
    draws_c = bootstrap_powers(design.x, design.energy, noise, design.blocks, draws, rng, design.run)
    vif = variance_inflation(design.x)
    reason = split_reason(design.x, vif, float(np.median(design.segments.seconds)))
    prefill_vif = block_inflation(design.x, PREFILL)
    per_rate: dict[str, RequestEnergyFit] = {}
    left_out: dict[str, RequestEnergyFit | str] = {}
    for k, run in enumerate(runs):
        own = design.run == k
        folds = _halves(design, noise, own, draws, rng)
        per_rate[run.label] = _view(design, k, run, coef, draws_c, vif, reason, prefill_vif, folds,
                                    _block_var(design, coef, own))
        left_out[run.label] = _left_out(design, noise, k, run, vif, reason, prefill_vif, draws, rng)
    return JointFit(tuple(labels), design.columns, coef, draws_c, vif, prefill_vif, reason, len(design.run),
                    per_rate, left_out)


def _design(runs: Sequence[RateWindow]) -> _Design:
    """Each run's segments inside its span, its amounts and knot rates, stacked in run order."""
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
        extra = np.zeros((len(segments), len(fitted_idle)))
        extra_rate = np.zeros_like(extra)
        if k in idle_column:
            extra[:, idle_column[k] - len(COLUMNS)] = segments.seconds
            extra_rate[:, idle_column[k] - len(COLUMNS)] = 1.0
        xs.append(np.column_stack([run.log.amounts(segments.t0_ns, segments.t1_ns), extra]))
        r0s.append(np.column_stack([run.log.rates_at(segments.t0_ns), extra_rate]))
        r1s.append(np.column_stack([run.log.rates_at(segments.t1_ns), extra_rate]))
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
                   np.concatenate(blocks), np.vstack(r0s), np.vstack(r1s), np.concatenate(base), idle_column)


def _halves(design: _Design, noise: np.ndarray, own: np.ndarray, draws: int, rng: np.random.Generator
            ) -> list[Fold]:
    """Test (b) for one run: each contiguous half of its span predicted by a fit on every other run and its other
    half; the held-out noise from its own training half's block residuals."""
    middle = np.median(design.segments.t0_ns[own])
    folds = []
    for test in (own & (design.segments.t0_ns < middle), own & (design.segments.t0_ns >= middle)):
        if test.sum() < 2:
            continue
        folds.append(held_out_fold(design.x, noise, design.segments, design.offset, ~test, test, design.blocks,
                                   draws, rng, design.run, own & ~test))
    return folds


def _block_var(design: _Design, coef: np.ndarray, rows: np.ndarray) -> float:
    """Variance of the 1 s block sums of the residuals of `rows` (one run's: the noise its windows carry)."""
    blocks = np.unique(design.blocks[rows], return_inverse=True)[1]
    return float(np.var(np.bincount(blocks, weights=design.energy[rows] - design.x[rows] @ coef)))


def _run_columns(design: _Design, k: int) -> np.ndarray:
    """The columns of run k's own model: the shared work columns and its idle column, if fitted."""
    return np.array([*range(len(COLUMNS)), *([design.idle_column[k]] if k in design.idle_column else [])])


def _view(design: _Design, k: int, run: RateWindow, coef: np.ndarray, draws_c: np.ndarray, vif: np.ndarray,
          reason: str | None, prefill_vif: float, folds: list[Fold], block_var: float) -> RequestEnergyFit:
    """Run k's model as a RequestEnergyFit (its idle column named as request_energy names it)."""
    cols = _run_columns(design, k)
    names = (*COLUMNS, *([IDLE_COLUMN] if k in design.idle_column else []))
    own = design.run == k
    segments = design.segments.take(np.flatnonzero(own))
    counter = window_segments(run.knots, -np.inf, np.inf)
    return RequestEnergyFit(names, coef[cols], draws_c[:, cols], run.idle_w, vif[cols], reason is None, reason,
                            segments, counter, folds, block_var, prefill_vif)


def _left_out(design: _Design, noise: np.ndarray, k: int, run: RateWindow, vif: np.ndarray, reason: str | None,
              prefill_vif: float, draws: int, rng: np.random.Generator) -> RequestEnergyFit | str:
    """Test (a)'s model for run k: the fit on every other run (its idle power must be given: a left-out run's
    fitted idle power is unknown to the others)."""
    if run.idle_w is None:
        return "no idle baseline for this rate: a fit on the other rates cannot know its idle power"
    train = design.run != k  # run k has no idle column (its idle power is given)
    x, energy, nz = design.x[train], design.energy[train], noise[train]
    coef = corrected_nnls(x, energy, nz)
    draws_c = bootstrap_powers(x, energy, nz, design.blocks[train], draws, rng, design.run[train])
    blocks = np.unique(design.blocks[train], return_inverse=True)[1]
    block_var = float(np.var(np.bincount(blocks, weights=energy - x @ coef)))
    work = np.arange(len(COLUMNS))
    own = design.run == k
    return RequestEnergyFit(COLUMNS, coef[work], draws_c[:, work], run.idle_w, vif[work], reason is None, reason,
                            design.segments.take(np.flatnonzero(own)), window_segments(run.knots, -np.inf, np.inf),
                            [], block_var, prefill_vif)
