"""The fit's building blocks: NNLS, labelled time per segment, exclusive kernel timelines."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from joulebench.analysis.phase_fit import Timeline, exclusive_timeline
from joulebench.segment_fit import nnls


def _brute_force_nnls(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The best unconstrained fit over every subset of free columns that stays non-negative."""
    best, best_cost = np.zeros(a.shape[1]), float(b @ b)
    for size in range(1, a.shape[1] + 1):
        for cols in itertools.combinations(range(a.shape[1]), size):
            x = np.zeros(a.shape[1])
            x[list(cols)] = np.linalg.lstsq(a[:, cols], b, rcond=None)[0]
            cost = float(np.sum((a @ x - b) ** 2))
            if x.min() >= 0 and cost < best_cost - 1e-12:
                best, best_cost = x, cost
    return best


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000))
def test_nnls_matches_the_exhaustive_search(seed: int) -> None:
    rng = np.random.default_rng(seed)
    a = rng.uniform(0, 1, (12, 4))
    b = a @ rng.uniform(-1, 2, 4) + rng.normal(0, 0.1, 12)
    assert nnls(a, b) == pytest.approx(_brute_force_nnls(a, b), abs=1e-8)


def _overlap(a0: float, a1: float, b0: float, b1: float) -> float:
    return max(0.0, min(a1, b1) - max(a0, b0))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.floats(0, 50), st.floats(0.1, 5)), min_size=1, max_size=12),
       st.lists(st.tuples(st.floats(0, 60), st.floats(0, 10)), min_size=1, max_size=6))
def test_seconds_per_label_are_the_overlaps(intervals, windows) -> None:
    """Disjoint intervals (laid end to end) against arbitrary windows: seconds = summed overlaps."""
    t, rows = 0.0, []
    for label, gap, length in intervals:
        rows.append((label, t + gap, t + gap + length))
        t += gap + length
    timeline = Timeline(("a", "b", "c"), np.array([r[0] for r in rows]), np.array([r[1] for r in rows]) * 1e9,
                        np.array([r[2] for r in rows]) * 1e9)
    a = np.array([w[0] for w in windows]) * 1e9
    b = a + np.array([w[1] for w in windows]) * 1e9
    got = timeline.seconds(a, b)
    for i, (w0, w1) in enumerate(zip(a / 1e9, b / 1e9, strict=True)):
        for k in range(3):
            expected = sum(_overlap(w0, w1, r[1], r[2]) for r in rows if r[0] == k)
            assert got[i, k] == pytest.approx(expected, abs=1e-6)


def test_concurrent_kernels_count_for_the_class_listed_first() -> None:
    labels = ("attention", "gemm", "communication")
    timeline = exclusive_timeline(labels, np.array([2, 1, 0]), np.array([0.0, 10.0, 30.0]),
                                  np.array([100.0, 40.0, 50.0]))
    total = timeline.total_seconds(0.0, 100.0) * 1e9
    # gemm 10-30 (attention takes 30-40), attention 30-50, communication the rest of 0-100
    assert total == pytest.approx([20.0, 20.0, 60.0])
    assert list(timeline.label_at(np.array([5.0, 20.0, 35.0, 60.0, 150.0]))) == [2, 1, 0, 2, 3]
