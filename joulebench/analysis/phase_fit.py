"""The fit estimator: mean power per phase (or kernel class) from the energy counter's segments.

Between two counter knots the energy is exact; what ran in that time is known from the phase marks
(or kernel intervals). With x[i, k] the seconds label k ran in segment i, the segment energies obey
E[i] = sum_k P[k] x[i, k]; the labels plus one column for time in none of them cover every instant, so
no separate constant is needed. P >= 0 by non-negative least squares; intervals from a block bootstrap
(contiguous blocks keep the correlation of neighbouring segments, which share a knot); closure is judged
on the held-out half of the window, since a fit closes on its own data almost by construction.

What limits it: a label whose share of each counter period hardly changes from period to period cannot
be told apart from the others (steps much shorter than the counter period, a 20 ms optimizer step in a
850 ms step), and knot times are known only to within their half-widths. Such labels are reported as
below resolution, with the reason, instead of a number.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from jpwr import Knots

BLOCK_S = 1.0  # bootstrap block: ten 100 ms counter periods
MIN_CONTRAST = 0.10  # a label's share of a counter period must vary at least this much (std) between periods
MAX_RELATIVE_INTERVAL = 0.25  # 95 % interval half-width of its mean power, relative to the estimate
MAX_TIMING_NOISE = 0.20  # knot-timing noise in its seconds per period, as a fraction of their variance
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


@dataclasses.dataclass(frozen=True)
class Timeline:
    """Disjoint labelled intervals (phases of one rank, or kernel classes made exclusive)."""

    labels: tuple[str, ...]
    label: np.ndarray  # index into labels per interval
    t0_ns: np.ndarray
    t1_ns: np.ndarray

    def seconds(self, a_ns: np.ndarray, b_ns: np.ndarray) -> np.ndarray:
        """[n, labels]: seconds of each label inside each [a, b]."""
        out = np.zeros((len(a_ns), len(self.labels)))
        for k in range(len(self.labels)):
            rows = self.label == k
            starts, ends = self.t0_ns[rows], self.t1_ns[rows]
            order = np.argsort(starts, kind="stable")
            starts, ends = starts[order], ends[order]
            out[:, k] = (_covered(starts, ends, b_ns) - _covered(starts, ends, a_ns)) / 1e9
        return out

    def label_at(self, t_ns: np.ndarray) -> np.ndarray:
        """The label running at each instant; len(labels) where none is (the rest column)."""
        out = np.full(len(t_ns), len(self.labels))
        for k in range(len(self.labels)):
            rows = self.label == k
            starts, ends = self.t0_ns[rows], self.t1_ns[rows]
            order = np.argsort(starts, kind="stable")
            starts, ends = starts[order], ends[order]
            i = np.searchsorted(starts, t_ns, side="right") - 1
            inside = (i >= 0) & (t_ns < ends[np.maximum(i, 0)]) if len(starts) else np.zeros(len(t_ns), bool)
            out[inside] = k
        return out

    def total_seconds(self, a_ns: float, b_ns: float) -> np.ndarray:
        return self.seconds(np.array([a_ns]), np.array([b_ns]))[0]

    def occurrence_s(self) -> np.ndarray:
        """Median length of one occurrence of each label (NaN where it never occurs)."""
        lengths = (self.t1_ns - self.t0_ns) / 1e9
        return np.array([np.median(lengths[self.label == k]) if np.any(self.label == k) else np.nan
                         for k in range(len(self.labels))])


def _covered(starts: np.ndarray, ends: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Time covered by disjoint sorted intervals up to each t."""
    if len(starts) == 0:
        return np.zeros(len(t))
    cumulative = np.concatenate(([0.0], np.cumsum(ends - starts)))
    i = np.searchsorted(starts, t, side="right")  # intervals starting at or before t
    last = np.maximum(i - 1, 0)
    partial = np.where(i > 0, np.clip(np.minimum(t, ends[last]) - starts[last], 0.0, None), 0.0)
    return cumulative[last] + partial


def exclusive_timeline(labels: Sequence[str], label: np.ndarray, t0_ns: np.ndarray, t1_ns: np.ndarray) -> Timeline:
    """Overlapping intervals (concurrent kernels) made disjoint: an instant belongs to the active label with
    the lowest index (callers order labels by priority, e.g. kernel_profile's category order)."""
    points = np.unique(np.concatenate([t0_ns, t1_ns]))
    if len(points) < 2:
        return Timeline(tuple(labels), np.array([], dtype=int), np.array([]), np.array([]))
    owner = np.full(len(points) - 1, len(labels), dtype=int)  # len(labels): nothing active
    for k in range(len(labels) - 1, -1, -1):  # lower index wins: paint it last
        rows = label == k
        first = np.searchsorted(points, t0_ns[rows])
        last = np.searchsorted(points, t1_ns[rows])
        active = np.zeros(len(points), dtype=int)
        np.add.at(active, first, 1)
        np.add.at(active, last, -1)
        owner[np.cumsum(active)[:-1] > 0] = k
    change = np.flatnonzero(np.diff(owner)) + 1
    starts = np.concatenate(([0], change))
    ends = np.concatenate((change, [len(owner)]))
    keep = owner[starts] < len(labels)
    return Timeline(tuple(labels), owner[starts][keep], points[starts][keep], points[ends][keep])


def nnls(a: np.ndarray, b: np.ndarray, max_iterations: int = 200) -> np.ndarray:
    """Lawson-Hanson non-negative least squares: argmin ||a x - b|| subject to x >= 0."""
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


def knot_noise(timeline: Timeline, segments: Segments) -> np.ndarray:
    """[segments, labels + 1]: expected squared error of each label's seconds per segment from knot timing.

    A knot off by d (uniform within its half-width h: variance h²/3) moves d seconds of whatever ran at
    that instant into or out of the segment. Regressing on seconds that carry this error would pull every
    mean power towards zero and towards each other (errors in variables); the fit subtracts it.
    """
    out = np.zeros((len(segments), len(timeline.labels) + 1))
    for t, half in ((segments.t0_ns, segments.half0_ns), (segments.t1_ns, segments.half1_ns)):
        label = timeline.label_at(t)
        out[np.arange(len(segments)), label] += (half / 1e9) ** 2 / 3
    return out


def timing_scale(x: np.ndarray, energy: np.ndarray, power: np.ndarray, timeline: Timeline,
                 segments: Segments) -> float:
    """How much of the nominal knot-timing variance (uniform within the half-width) is really there.

    A knot off by d adds P·d to one segment's residual and takes it from the next (P: the power of what ran at
    the knot), so neighbouring residuals covary by −P²·var(d); other noise does not alternate like that. The
    ratio of the observed to the nominal covariance scales the correction (0 when none is seen, at most 1.5).
    """
    residual = energy - x @ power
    shared = np.flatnonzero(segments.t1_ns[:-1] == segments.t0_ns[1:])  # segment i and i+1 share a knot
    if len(shared) == 0:
        return 1.0
    label = timeline.label_at(segments.t1_ns[shared])
    nominal = np.sum(power[label] ** 2 * (segments.half1_ns[shared] / 1e9) ** 2 / 3)
    observed = -np.sum(residual[shared] * residual[shared + 1])
    return float(np.clip(observed / nominal, 0.0, 1.5)) if nominal > 0 else 1.0


def corrected_nnls(x: np.ndarray, energy: np.ndarray, noise: np.ndarray) -> np.ndarray:
    """Non-negative least squares on the normal equations with the knot-timing error removed from X'X.

    min P'(X'X − N)P − 2P'X'y, P >= 0, with N = diag(sum of `noise`), solved as NNLS on a Cholesky
    factor; when the error is as large as the signal (X'X − N not positive definite) the plain fit is used
    and the labels concerned are below resolution anyway (their timing noise is too high).
    """
    gram = x.T @ x - np.diag(noise.sum(axis=0))
    try:
        upper = np.linalg.cholesky(gram).T
    except np.linalg.LinAlgError:
        return nnls(x, energy)
    return nnls(upper, np.linalg.solve(upper.T, x.T @ energy))


def blocks_of(segments: Segments, block_s: float) -> np.ndarray:
    """Contiguous block number of each segment (by its start time)."""
    if not len(segments):
        return np.array([], dtype=int)
    return ((segments.t0_ns - segments.t0_ns.min()) / (block_s * 1e9)).astype(int)


def bootstrap_powers(x: np.ndarray, energy: np.ndarray, noise: np.ndarray, blocks: np.ndarray, draws: int,
                     rng: np.random.Generator) -> np.ndarray:
    """[draws, labels]: the fit repeated on blocks drawn with replacement."""
    ids = np.unique(blocks)
    members = [np.flatnonzero(blocks == b) for b in ids]
    out = np.empty((draws, x.shape[1]))
    for d in range(draws):
        rows = np.concatenate([members[i] for i in rng.integers(0, len(ids), len(ids))])
        out[d] = corrected_nnls(x[rows], energy[rows], noise[rows])
    return out


@dataclasses.dataclass
class LabelFit:
    """One device's fit: mean power per label with bootstrap draws, and what limits each label."""

    labels: tuple[str, ...]
    power_w: np.ndarray
    draws_w: np.ndarray  # [draws, labels]
    window_seconds: np.ndarray  # each label's seconds in the whole window
    contrast: np.ndarray  # std over segments of each label's share of the segment
    timing_noise: np.ndarray  # knot-timing variance of its seconds per segment / their variance
    occurrence_s: np.ndarray
    segments: int
    segment_s: float  # median segment length
    knot_half_s: float  # median knot half-width

    def reason(self, k: int) -> str | None:
        """Why label k is below resolution (None: resolved)."""
        if self.window_seconds[k] <= 0:
            return "no time of its own in this window"
        reasons = []
        if self.contrast[k] < MIN_CONTRAST:
            once = self.occurrence_s[k]
            lasts = "" if np.isnan(once) else f" (one occurrence lasts {once * 1e3:.3g} ms)"
            reasons.append(f"its share of each {self.segment_s * 1e3:.0f} ms counter period varies by only "
                           f"{self.contrast[k]:.0%} (std) between periods, {MIN_CONTRAST:.0%} needed{lasts}")
        if self.timing_noise[k] > MAX_TIMING_NOISE:
            reasons.append(f"the knot times (±{self.knot_half_s * 1e3:.0f} ms) blur its seconds per period by "
                           f"{self.timing_noise[k]:.0%} of their spread (max {MAX_TIMING_NOISE:.0%})")
        low, high = np.percentile(self.draws_w[:, k], [2.5, 97.5])
        relative = (high - low) / 2 / self.power_w[k] if self.power_w[k] > 0 else np.inf
        if relative > MAX_RELATIVE_INTERVAL:
            reasons.append(f"its mean power is known only to ±{min(relative, 9.99):.0%} (95 % bootstrap; "
                           f"needs ±{MAX_RELATIVE_INTERVAL:.0%})")
        return "; ".join(reasons) or None


def fit_labels(timeline: Timeline, segments: Segments, t0_ns: float, t1_ns: float, draws: int,
               rng: np.random.Generator, rest_label: str) -> LabelFit:
    """Fit one device: the timeline's labels plus `rest_label` (time in none of them)."""
    labels = (*timeline.labels, rest_label)
    x = design(timeline, segments)
    noise, power = calibrated_noise(timeline, segments, x)
    window_seconds = np.append(timeline.total_seconds(t0_ns, t1_ns), 0.0)
    window_seconds[-1] = (t1_ns - t0_ns) / 1e9 - window_seconds[:-1].sum()
    spread_var = x.var(axis=0)
    timing = np.where(spread_var > 0, noise.mean(axis=0) / np.maximum(spread_var, 1e-300), np.inf)
    half = np.concatenate([segments.half0_ns, segments.half1_ns]) / 1e9
    draws_w = bootstrap_powers(x, segments.energy_j, noise, blocks_of(segments, BLOCK_S), draws, rng)
    return LabelFit(labels, power, draws_w, window_seconds, (x / segments.seconds[:, None]).std(axis=0), timing,
                    np.append(timeline.occurrence_s(), np.nan), len(segments), float(np.median(segments.seconds)),
                    float(np.median(half)))


def calibrated_noise(timeline: Timeline, segments: Segments, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The knot-timing noise scaled to what the residuals show, and the fit corrected with it (two rounds)."""
    nominal = knot_noise(timeline, segments)
    power = nnls(x, segments.energy_j)
    noise = nominal
    for _ in range(2):
        noise = nominal * timing_scale(x, segments.energy_j, power, timeline, segments)
        power = corrected_nnls(x, segments.energy_j, noise)
    return noise, power


def design(timeline: Timeline, segments: Segments) -> np.ndarray:
    """[segments, labels + 1]: seconds of each label, and of time in none, per segment."""
    x = timeline.seconds(segments.t0_ns, segments.t1_ns)
    rest = np.clip(segments.seconds - x.sum(axis=1), 0.0, None)
    return np.column_stack([x, rest])


@dataclasses.dataclass(frozen=True)
class Fold:
    """One held-out fold: energy measured by the counter on its blocks, predicted by the other blocks' fit."""

    measured_j: float
    predicted_j: float
    bound_j: float  # prediction interval (bootstrap) + the held-out blocks' edge-knot timing

    @property
    def residual_j(self) -> float:
        return self.measured_j - self.predicted_j

    @property
    def closes(self) -> bool:
        return abs(self.residual_j) <= self.bound_j


def held_out_folds(timeline: Timeline, segments: Segments, draws: int, rng: np.random.Generator) -> list[Fold]:
    """Fit on one half of the window, predict the other half's counter energy; then the other way round.

    Contiguous halves test the model (constant mean power per label) and the window's steadiness together:
    a drift (clocks, temperature) or work that was not marked shows up as a residual beyond the bound.
    """
    x = design(timeline, segments)
    noise, _ = calibrated_noise(timeline, segments, x)
    middle = np.median(segments.t0_ns)
    folds = []
    for test in (segments.t0_ns < middle, segments.t0_ns >= middle):
        train = ~test
        if test.sum() < 2 or train.sum() < x.shape[1]:
            continue
        blocks = blocks_of(segments.take(train), BLOCK_S)
        power = corrected_nnls(x[train], segments.energy_j[train], noise[train])
        draws_w = bootstrap_powers(x[train], segments.energy_j[train], noise[train], blocks, draws, rng)
        # The prediction's own spread, plus the held-out half's noise (what the model cannot know: power varying
        # within a phase from one occurrence to the next), taken from the training half's 1 s block residuals.
        residual = segments.energy_j[train] - x[train] @ power
        block_sums = np.bincount(blocks - blocks.min(), weights=residual)
        test_blocks = len(np.unique(blocks_of(segments.take(test), BLOCK_S)))
        sigma = np.sqrt(np.var(draws_w @ x[test].sum(axis=0)) + test_blocks * np.var(block_sums))
        folds.append(Fold(float(segments.energy_j[test].sum()), float((x[test] @ power).sum()),
                          float(CLOSURE_Z * sigma + _edge_timing(segments, test))))
    return folds


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
