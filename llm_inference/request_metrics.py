"""Per-request latencies of a load, their percentiles, and goodput under latency limits (SLOs).

Definitions (all from one clock, the load's start = 0):
- queueing delay = admitted - arrival (waiting for a request row),
- TTFT (time to first token) = first_token - arrival (queueing included, as users see it),
- TPOT (time per output token) = (finish - first_token) / (output_tokens - 1): the decode pace after the first
  token; a 1-token answer has none (None, never 0),
- end-to-end = finish - arrival.
Percentiles are numpy's 'linear' method (the default: interpolation between the closest ranks).
A request meets an SLO when its value is at most the limit; a request without a TPOT (1 output token) meets
the TPOT SLO trivially (it has no decode phase to be slow in); a counted request that never finished (failed, timed
out, cut by a stop) meets none. The SLO share is over every counted request, finished or not. Goodput = requests
meeting every given SLO per second of the window given (DistServe's definition, as `--slo-ttft-ms` /
`--slo-tpot-ms` ask; a load passes its served window, llm_inference/load_plan.py, not the arrivals').
"""

from __future__ import annotations

import dataclasses

import numpy as np

from joulebench.record_shape import checked_block
from joulebench.record_types import LoadMetrics

PERCENTILES = (50, 90, 99)
METRICS = ("queue", "ttft", "tpot", "e2e")  # summary keys: f"{metric}_p{q}_s"


@dataclasses.dataclass(frozen=True)
class RequestTimes:
    id: int
    arrival_s: float  # all times: seconds on one clock, the load's start = 0
    admitted_s: float  # prefill started
    first_token_s: float  # first output token ready (end of its prefill)
    finish_s: float  # last output token ready
    input_tokens: int
    output_tokens: int
    warmup: bool


def tpot_s(t: RequestTimes) -> float | None:
    """Time per output token after the first; None for a 1-token answer (no decode step to time)."""
    if t.output_tokens < 2:
        return None
    return (t.finish_s - t.first_token_s) / (t.output_tokens - 1)


def counted(times: list[RequestTimes], t0_s: float, t1_s: float) -> list[RequestTimes]:
    """MLPerf's rule: the requests that count for a window [t0, t1) are the non-warm-up ones arriving in it."""
    return [t for t in times if not t.warmup and t0_s <= t.arrival_s < t1_s]


def _values(times: list[RequestTimes]) -> dict[str, list[float]]:
    tpots = [tpot_s(t) for t in times]
    return {"queue": [t.admitted_s - t.arrival_s for t in times],
            "ttft": [t.first_token_s - t.arrival_s for t in times],
            "tpot": [v for v in tpots if v is not None],
            "e2e": [t.finish_s - t.arrival_s for t in times]}


def _meets(t: RequestTimes, slo_ttft_s: float | None, slo_tpot_s: float | None) -> bool:
    tpot = tpot_s(t)
    return ((slo_ttft_s is None or t.first_token_s - t.arrival_s <= slo_ttft_s)
            and (slo_tpot_s is None or tpot is None or tpot <= slo_tpot_s))


def latency_summary(times: list[RequestTimes], slo_ttft_s: float | None = None, slo_tpot_s: float | None = None,
                    window_s: float | None = None, counted_total: int | None = None) -> LoadMetrics:
    """p50/p90/p99 of each latency over `times` (pass the counted requests that finished: see `counted`), and with
    SLOs the share of requests meeting all of them (over `counted_total`, every counted request: the unfinished
    ones meet none; default len(times)) and goodput (requests/s over `window_s`). None where a value has no sample
    or no SLO/window was given: a missing figure must not read as a perfect 0."""
    total = len(times) if counted_total is None else counted_total
    if total < len(times):
        raise ValueError(f"counted_total {total} is below the {len(times)} finished requests given")
    summary: dict[str, float | int | None] = {"count": len(times)}
    for metric, values in _values(times).items():
        for q in PERCENTILES:
            summary[f"{metric}_p{q}_s"] = float(np.percentile(values, q, method="linear")) if values else None
    summary["slo_attained_share"] = summary["goodput_requests_per_s"] = None
    if slo_ttft_s is not None or slo_tpot_s is not None:
        met = sum(_meets(t, slo_ttft_s, slo_tpot_s) for t in times)
        if total:
            summary["slo_attained_share"] = met / total
        if window_s is not None:
            if not window_s > 0:
                raise ValueError(f"window_s is {window_s}; goodput needs a window longer than 0 s")
            summary["goodput_requests_per_s"] = met / window_s
    return checked_block(LoadMetrics, summary, "metrics")  # the percentiles' keys are built from PERCENTILES
