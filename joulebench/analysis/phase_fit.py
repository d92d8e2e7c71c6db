"""The fit estimator: mean power per phase (or kernel class) from the energy counter's segments.

Between two counter knots the energy is exact; what ran in that time is known from the phase marks
(or kernel intervals). With x[i, k] the seconds label k ran in segment i, the segment energies obey
E[i] = sum_k P[k] x[i, k]; the labels plus one column for time in none of them cover every instant, so
no separate constant is needed. P >= 0 by non-negative least squares; intervals from a block bootstrap
(contiguous blocks keep the correlation of neighbouring segments, which share a knot); closure is judged
on the held-out half of the window, since a fit closes on its own data almost by construction. The
generic machinery (segments, NNLS, knot-timing correction, bootstrap, held-out halves) is the core's
joulebench/segment_fit.py; this module turns phase timelines into its columns.

What limits it: a label whose share of each counter period hardly changes from period to period cannot
be told apart from the others (steps much shorter than the counter period, a 20 ms optimizer step in a
850 ms step), and knot times are known only to within their half-widths. Such labels are reported as
below resolution, with the reason, instead of a number.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from joulebench.segment_fit import (
    BLOCK_S,
    Fold,
    Segments,
    blocks_of,
    bootstrap_powers,
    calibrated_fit,
    held_out_halves,
)

MIN_CONTRAST = 0.10  # a label's share of a counter period must vary at least this much (std) between periods
MAX_RELATIVE_INTERVAL = 0.25  # 95 % interval half-width of its mean power, relative to the estimate
MAX_TIMING_NOISE = 0.20  # knot-timing noise in its seconds per period, as a fraction of their variance


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
    own_noise = np.diagonal(noise, axis1=1, axis2=2).mean(axis=0)
    timing = np.where(spread_var > 0, own_noise / np.maximum(spread_var, 1e-300), np.inf)
    half = np.concatenate([segments.half0_ns, segments.half1_ns]) / 1e9
    draws_w = bootstrap_powers(x, segments.energy_j, noise, blocks_of(segments, BLOCK_S), draws, rng)
    return LabelFit(labels, power, draws_w, window_seconds, (x / segments.seconds[:, None]).std(axis=0), timing,
                    np.append(timeline.occurrence_s(), np.nan), len(segments), float(np.median(segments.seconds)),
                    float(np.median(half)))


def knot_rates(timeline: Timeline, segments: Segments) -> tuple[np.ndarray, np.ndarray]:
    """What each column (labels + rest) accrues per second at each segment's start and end knot: one second
    per second for the label running there, nothing for the others."""
    one_hot = np.eye(len(timeline.labels) + 1)
    return one_hot[timeline.label_at(segments.t0_ns)], one_hot[timeline.label_at(segments.t1_ns)]


def calibrated_noise(timeline: Timeline, segments: Segments, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The knot-timing noise scaled to what the residuals show, and the fit corrected with it."""
    return calibrated_fit(x, segments.energy_j, segments, *knot_rates(timeline, segments))


def design(timeline: Timeline, segments: Segments) -> np.ndarray:
    """[segments, labels + 1]: seconds of each label, and of time in none, per segment."""
    x = timeline.seconds(segments.t0_ns, segments.t1_ns)
    rest = np.clip(segments.seconds - x.sum(axis=1), 0.0, None)
    return np.column_stack([x, rest])


def held_out_folds(timeline: Timeline, segments: Segments, draws: int, rng: np.random.Generator) -> list[Fold]:
    """Each contiguous half of the window predicted by a fit on the other (segment_fit.held_out_halves)."""
    x = design(timeline, segments)
    noise, _ = calibrated_noise(timeline, segments, x)
    return held_out_halves(x, noise, segments, draws, rng)
