"""Fitting work to the energy counter's segments: the pieces every attribution fit shares.

Between two counter knots the energy is exact; what ran in that time is known from the work's own
timestamps (phase marks, kernel intervals, engine steps). With x[i, k] the amount of regressor k in segment
i (seconds of a phase, tokens of a step), the segment energies obey E[i] = offset[i] + sum_k c[k] x[i, k];
c >= 0 by non-negative least squares, corrected for the knots' timing, with intervals from a block bootstrap
(contiguous blocks keep the correlation of neighbouring segments, which share a knot) and closure judged on
held-out halves of the window, since a fit closes on its own data almost by construction.

It lives in the core (not joulebench.analysis) because drivers fit their own windows with it (the serving
driver's per-request energy, joulebench/request_energy.py); joulebench.analysis.phase_fit builds on it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from jpwr.trace import Domain, Knots, Signal, TraceData, counter_segments

BLOCK_S = 1.0  # bootstrap block: ten 100 ms counter periods
MIN_SEGMENTS = 20
CLOSURE_Z = 2.58  # 99 % two-sided: with two folds a correct fit is called a misfit in about 1 window of 50


@dataclasses.dataclass(frozen=True)
class Segments:
    """Counter segments lying wholly inside a window: [t0, t1] between two knots and the energy in between."""

    t0_ns: np.ndarray
    t1_ns: np.ndarray
    energy_j: np.ndarray
    half0_ns: np.ndarray  # timing half-widths of the two knots
    half1_ns: np.ndarray

    def __len__(self) -> int:
        return len(self.energy_j)

    @property
    def seconds(self) -> np.ndarray:
        return (self.t1_ns - self.t0_ns) / 1e9

    def take(self, rows: np.ndarray) -> Segments:
        return Segments(self.t0_ns[rows], self.t1_ns[rows], self.energy_j[rows], self.half0_ns[rows],
                        self.half1_ns[rows])

    @classmethod
    def joined(cls, parts: Sequence[Segments]) -> Segments:
        """The segments of several windows (of one counter clock) in one, in the order given."""
        return cls(*(np.concatenate([getattr(p, f.name) for p in parts]) for f in dataclasses.fields(cls)))


def counter_knots(trace: TraceData, domain: Domain) -> list[Knots]:
    """The knots of a domain's energy counter in a node's trace (none when it has no counter)."""
    sensor = next((s for s in trace.sensors if s.domain_id == domain.id and s.signal is Signal.ENERGY_COUNTER), None)
    if sensor is None:
        return []
    return counter_segments(trace.series(sensor.id), sensor.est_update_s)[0]


def window_segments(knot_sets: Sequence[Knots], t0_ns: float, t1_ns: float) -> Segments:
    """Consecutive knots of one continuous counter series, both inside [t0, t1]."""
    parts: list[tuple[np.ndarray, ...]] = []
    for knots in knot_sets:
        inside = (knots.tau_ns >= t0_ns) & (knots.tau_ns <= t1_ns)
        tau, energy = knots.tau_ns[inside], knots.energy_j[inside]
        half = (knots.hi_ns[inside] - knots.lo_ns[inside]) / 2
        if len(tau) >= 2:
            parts.append((tau[:-1], tau[1:], np.diff(energy), half[:-1], half[1:]))
    if not parts:
        empty = np.array([], dtype=float)
        return Segments(empty, empty, empty, empty, empty)
    t0, t1, energy, h0, h1 = (np.concatenate(column) for column in zip(*parts, strict=True))
    return Segments(t0.astype(float), t1.astype(float), energy.astype(float), h0.astype(float), h1.astype(float))


def nnls(a: np.ndarray, b: np.ndarray, max_iterations: int = 200) -> np.ndarray:
    """Lawson-Hanson non-negative least squares: argmin ||a x - b|| subject to x >= 0.

    Columns are scaled to unit norm first (the same solution): the active-set tolerances are absolute, and
    columns of very different sizes (tokens and steps per segment) would otherwise drop small coefficients.
    """
    norms = np.linalg.norm(a, axis=0)
    norms[norms == 0] = 1.0
    return _lawson_hanson(a / norms, b, max_iterations) / norms


def _lawson_hanson(a: np.ndarray, b: np.ndarray, max_iterations: int) -> np.ndarray:
    n = a.shape[1]
    x = np.zeros(n)
    passive = np.zeros(n, dtype=bool)
    gradient = a.T @ (b - a @ x)
    tolerance = 1e-10 * max(1.0, float(np.abs(gradient).max(initial=0.0)))
    for _ in range(max_iterations):
        if passive.all() or gradient[~passive].max(initial=-np.inf) <= tolerance:
            break
        passive[np.argmax(np.where(passive, -np.inf, gradient))] = True
        while True:
            z = np.zeros(n)
            z[passive] = np.linalg.lstsq(a[:, passive], b, rcond=None)[0]
            if z[passive].min(initial=np.inf) > 0:
                x = z
                break
            blocking = passive & (z <= 0)
            step = np.min(x[blocking] / np.maximum(x[blocking] - z[blocking], 1e-300))
            x = x + step * (z - x)
            passive &= x > tolerance
            x[~passive] = 0.0
        gradient = a.T @ (b - a @ x)
    return x


def knot_noise(rate0: np.ndarray, rate1: np.ndarray, segments: Segments) -> np.ndarray:
    """[segments, columns, columns]: expected error covariance of the regressors per segment from knot timing.

    A knot off by d (uniform within its half-width h: variance h²/3) moves d seconds of whatever ran at that
    instant into or out of the segment, i.e. rate·d of every regressor at once (`rate0`/`rate1`: what each
    accrues per second at the segment's start/end knot), so the errors of columns that accrue together (steps,
    rows and tokens of one decode step) are correlated. Regressing on amounts that carry this error would pull
    every coefficient towards zero and towards each other (errors in variables); the fit subtracts it.
    """
    return (np.einsum("ij,ik->ijk", rate0, rate0) * ((segments.half0_ns / 1e9) ** 2 / 3)[:, None, None]
            + np.einsum("ij,ik->ijk", rate1, rate1) * ((segments.half1_ns / 1e9) ** 2 / 3)[:, None, None])


def timing_scale(residual: np.ndarray, segments: Segments, knot_power_w: np.ndarray) -> float:
    """How much of the nominal knot-timing variance (uniform within the half-width) is really there.

    A knot off by d adds P·d to one segment's residual and takes it from the next (P: the power at the knot,
    `knot_power_w` at each segment's end knot), so neighbouring residuals covary by −P²·var(d); other noise does
    not alternate like that. The ratio of the observed to the nominal covariance scales the correction (0 when
    none is seen, at most 1.5).
    """
    shared = np.flatnonzero(segments.t1_ns[:-1] == segments.t0_ns[1:])  # segment i and i+1 share a knot
    if len(shared) == 0:
        return 1.0
    nominal = np.sum(knot_power_w[shared] ** 2 * (segments.half1_ns[shared] / 1e9) ** 2 / 3)
    observed = -np.sum(residual[shared] * residual[shared + 1])
    return float(np.clip(observed / nominal, 0.0, 1.5)) if nominal > 0 else 1.0


def corrected_nnls(x: np.ndarray, energy: np.ndarray, noise: np.ndarray) -> np.ndarray:
    """Non-negative least squares on the normal equations with the knot-timing error removed from X'X.

    min P'(X'X − N)P − 2P'X'y, P >= 0, with N the sum of `noise` (knot_noise), solved as NNLS on a Cholesky
    factor; when the error is as large as the signal (X'X − N not positive definite) the plain fit is used
    and the columns concerned cannot be resolved anyway (their timing noise is too high).
    """
    gram = x.T @ x - noise.sum(axis=0)
    try:
        upper = np.linalg.cholesky(gram).T
    except np.linalg.LinAlgError:
        return nnls(x, energy)
    return nnls(upper, np.linalg.solve(upper.T, x.T @ energy))


def calibrated_fit(x: np.ndarray, energy: np.ndarray, segments: Segments, rate0: np.ndarray, rate1: np.ndarray,
                   base_w: float | np.ndarray = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """The knot-timing noise scaled to what the residuals show, and the fit corrected with it (two rounds).

    `energy` is what the columns explain (the segment energy less any known offset); `base_w` the power of
    that offset at the knots (a known idle power; per segment where the segments come from several runs), which
    knot timing moves like the rest.
    """
    nominal = knot_noise(rate0, rate1, segments)
    coef = nnls(x, energy)
    noise = nominal
    for _ in range(2):
        noise = nominal * timing_scale(energy - x @ coef, segments, rate1 @ coef + base_w)
        coef = corrected_nnls(x, energy, noise)
    return noise, coef


def blocks_of(segments: Segments, block_s: float) -> np.ndarray:
    """Contiguous block number of each segment (by its start time)."""
    if not len(segments):
        return np.array([], dtype=int)
    return ((segments.t0_ns - segments.t0_ns.min()) / (block_s * 1e9)).astype(int)


def bootstrap_powers(x: np.ndarray, energy: np.ndarray, noise: np.ndarray, blocks: np.ndarray, draws: int,
                     rng: np.random.Generator, strata: np.ndarray | None = None) -> np.ndarray:
    """[draws, columns]: the fit repeated on blocks drawn with replacement.

    `strata` (per row, optional): blocks are drawn within each stratum, as many as it has, so that every draw
    keeps each stratum's share of the data (segments of several runs fitted together: each run's own blocks).
    """
    ids = np.unique(blocks)
    members = [np.flatnonzero(blocks == b) for b in ids]
    block_stratum = np.zeros(len(ids)) if strata is None else np.array([strata[m[0]] for m in members])
    groups = [np.flatnonzero(block_stratum == s) for s in np.unique(block_stratum)]
    out = np.empty((draws, x.shape[1]))
    for d in range(draws):
        chosen = np.concatenate([group[rng.integers(0, len(group), len(group))] for group in groups])
        rows = np.concatenate([members[i] for i in chosen])
        out[d] = corrected_nnls(x[rows], energy[rows], noise[rows])
    return out


@dataclasses.dataclass(frozen=True)
class Fold:
    """One held-out fold: energy measured by the counter on its blocks, predicted by the other blocks' fit."""

    measured_j: float
    predicted_j: float
    bound_j: float  # prediction interval (bootstrap) + the held-out blocks' edge-knot timing
    t0_ns: float = 0.0  # the held-out segments' span
    t1_ns: float = 0.0

    @property
    def residual_j(self) -> float:
        return self.measured_j - self.predicted_j

    @property
    def closes(self) -> bool:
        return abs(self.residual_j) <= self.bound_j


def held_out_halves(x: np.ndarray, noise: np.ndarray, segments: Segments, draws: int, rng: np.random.Generator,
                    offset_j: np.ndarray | None = None) -> list[Fold]:
    """Fit on one half of the window, predict the other half's counter energy; then the other way round.

    Contiguous halves test the model (constant cost per unit of each column) and the window's steadiness
    together: a drift (clocks, temperature) or work that was not logged shows up as a residual beyond the
    bound. `offset_j`: known energy per segment outside the columns (a given idle power's share).
    """
    offset = np.zeros(len(segments)) if offset_j is None else offset_j
    middle = np.median(segments.t0_ns)
    folds = []
    for test in (segments.t0_ns < middle, segments.t0_ns >= middle):
        train = ~test
        if test.sum() < 2 or train.sum() < x.shape[1]:
            continue
        blocks = np.zeros(len(segments), dtype=int)
        blocks[train] = blocks_of(segments.take(train), BLOCK_S)
        folds.append(held_out_fold(x, noise, segments, offset, train, test, blocks, draws, rng))
    return folds


def held_out_fold(x: np.ndarray, noise: np.ndarray, segments: Segments, offset_j: np.ndarray, train: np.ndarray,
                  test: np.ndarray, blocks: np.ndarray, draws: int, rng: np.random.Generator,
                  strata: np.ndarray | None = None, spread: np.ndarray | None = None) -> Fold:
    """The `test` rows' counter energy predicted by a fit on the `train` rows (masks); `blocks` (per row) the
    bootstrap's blocks of the training rows, `strata` theirs (bootstrap_powers).

    The bound is the prediction's own spread plus the held-out rows' noise (what the model cannot know: power
    varying from one occurrence to the next), taken from the 1 s block residuals of the `spread` rows (default:
    the training rows; where the training rows mix several runs, the held-out run's own training rows).
    """
    energy = segments.energy_j - offset_j
    power = corrected_nnls(x[train], energy[train], noise[train])
    draws_w = bootstrap_powers(x[train], energy[train], noise[train], blocks[train], draws, rng,
                               None if strata is None else strata[train])
    rows = train if spread is None else spread
    noise_blocks = blocks[rows]
    block_sums = np.bincount(noise_blocks - noise_blocks.min(), weights=energy[rows] - x[rows] @ power)
    test_blocks = len(np.unique(blocks_of(segments.take(test), BLOCK_S)))
    sigma = np.sqrt(np.var(draws_w @ x[test].sum(axis=0)) + test_blocks * np.var(block_sums))
    return Fold(float(segments.energy_j[test].sum()), float((x[test] @ power + offset_j[test]).sum()),
                float(CLOSURE_Z * sigma + _edge_timing(segments, test)),
                float(segments.t0_ns[test].min()), float(segments.t1_ns[test].max()))


def _edge_timing(segments: Segments, test: np.ndarray) -> float:
    """Energy that knot timing can move across the edges of the held-out runs of segments.

    Inside a run of contiguous segments a knot's error moves time between two held-out segments and
    cancels in their sum; at a run's edges it moves time (at the neighbouring segment's power) in or out.
    """
    power = segments.energy_j / np.maximum(segments.seconds, 1e-12)
    edges = np.flatnonzero(np.diff(np.concatenate(([False], test, [False])).astype(int)))
    bound = 0.0
    for start, stop in zip(edges[::2], edges[1::2], strict=True):
        bound += power[start] * segments.half0_ns[start] / 1e9 + power[stop - 1] * segments.half1_ns[stop - 1] / 1e9
    return bound
