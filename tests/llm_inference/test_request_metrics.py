"""Per-request latencies, percentiles, MLPerf's counting rule and SLO accounting on hand-made timings (issue 30)."""

from __future__ import annotations

import pytest

from llm_inference.request_metrics import RequestTimes, counted, latency_summary, tpot_s


def times(id: int, arrival: float, admitted: float, first: float, finish: float, output: int,
          warmup: bool = False) -> RequestTimes:
    return RequestTimes(id, arrival, admitted, first, finish, 10, output, warmup)


# Binary-exact times, so that a value at an SLO's limit compares exactly. Queue, TTFT, TPOT, end-to-end (s):
LOAD = [
    times(0, 0.0, 0.0, 0.125, 1.375, 11),  # 0.0, 0.125, 0.125, 1.375
    times(1, 1.0, 1.5, 1.75, 2.75, 5),  # 0.5, 0.75,  0.25,  1.75
    times(2, 2.0, 2.0, 2.25, 2.25, 1),  # 0.0, 0.25,  None,  0.25
    times(3, 3.0, 4.0, 4.5, 8.5, 5),  # 1.0, 1.5,   1.0,   5.5
]


def test_tpot_is_the_pace_after_the_first_token_and_none_for_one_token():
    assert tpot_s(LOAD[1]) == 0.25  # (2.75 - 1.75) / (5 - 1)
    assert tpot_s(LOAD[2]) is None


def test_mlperf_counting_keeps_non_warmup_arrivals_inside_the_half_open_window():
    load = [*LOAD, times(4, 1.5, 1.5, 1.625, 2.0, 3, warmup=True)]
    assert [t.id for t in counted(load, 1.0, 3.0)] == [1, 2]  # 3.0 is outside [1, 3); the warm-up never counts
    assert [t.id for t in counted(load, 0.0, 10.0)] == [0, 1, 2, 3]


def test_percentiles_use_linear_interpolation_and_tpot_skips_one_token_answers():
    summary = latency_summary(LOAD)
    assert summary["count"] == 4
    # TTFTs sorted 0.125, 0.25, 0.75, 1.5: p50 halfway between the 2nd and 3rd, p90 at 0-based rank 2.7.
    assert summary["ttft_p50_s"] == pytest.approx(0.5)
    assert summary["ttft_p90_s"] == pytest.approx(0.75 + 0.7 * 0.75)
    assert summary["ttft_p99_s"] == pytest.approx(0.75 + 0.97 * 0.75)
    assert summary["queue_p50_s"] == pytest.approx(0.25)
    assert summary["queue_p99_s"] == pytest.approx(0.5 + 0.97 * 0.5)
    assert summary["e2e_p50_s"] == pytest.approx((1.375 + 1.75) / 2)
    # TPOT over the three requests that have one: 0.125, 0.25, 1.0 (0-based rank 1.8 for p90).
    assert summary["tpot_p50_s"] == pytest.approx(0.25)
    assert summary["tpot_p90_s"] == pytest.approx(0.25 + 0.8 * 0.75)
    assert summary["slo_attained_share"] is None and summary["goodput_requests_per_s"] is None


def test_goodput_counts_requests_meeting_both_slos_per_second_of_window():
    # TTFT <= 0.75 s: requests 0, 1 (at the limit, which meets it), 2; TPOT <= 0.125 s: request 0 (at the limit),
    # and request 2 trivially (one token, no TPOT). Both: 0 and 2, over a 4 s window.
    summary = latency_summary(LOAD, slo_ttft_s=0.75, slo_tpot_s=0.125, window_s=4.0)
    assert summary["slo_attained_share"] == pytest.approx(0.5)
    assert summary["goodput_requests_per_s"] == pytest.approx(0.5)


@pytest.mark.parametrize(("slos", "met"), [({"slo_ttft_s": 0.25}, 2), ({"slo_tpot_s": 0.25}, 3),
                                           ({"slo_ttft_s": 10.0, "slo_tpot_s": 10.0}, 4)])
def test_a_single_slo_constrains_only_its_own_metric(slos, met):
    summary = latency_summary(LOAD, window_s=2.0, **slos)
    assert summary["slo_attained_share"] == pytest.approx(met / 4)
    assert summary["goodput_requests_per_s"] == pytest.approx(met / 2.0)


def test_missing_values_are_none_not_zero():
    empty = latency_summary([], slo_ttft_s=1.0)
    assert empty["count"] == 0
    assert all(value is None for key, value in empty.items() if key != "count")
    one_token = latency_summary([LOAD[2]], slo_ttft_s=1.0)  # no TPOT at all, goodput without a window
    assert one_token["tpot_p50_s"] is None and one_token["ttft_p50_s"] == 0.25
    assert one_token["slo_attained_share"] == 1.0 and one_token["goodput_requests_per_s"] is None


def test_an_empty_window_gives_no_goodput():
    with pytest.raises(ValueError, match="window_s is 0"):
        latency_summary(LOAD, slo_ttft_s=1.0, window_s=0.0)
