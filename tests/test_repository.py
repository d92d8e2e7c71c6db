"""What the repository keeps: results as traces and summaries, never the sampler's raw segments."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_results_hold_no_raw_sampler_segments():
    """Raw JSONL segments are the sampler's crash-safe scratch; a result is its trace.h5 (or CSV) and summary."""
    segments = sorted(p.relative_to(REPO).as_posix() for p in (REPO / "benchmarks" / "results").rglob("segments"))
    assert segments == []

