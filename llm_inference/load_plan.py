"""What both load targets share (llm_inference/load_run.py runs them): a rate's plan and window rule, the requests
it counts, where its record goes and its figures.

* finite rates and traces, MLPerf's rule: the window runs from the first counted arrival to the last; the
  requests arriving inside it count for latencies (they finish after it if they must: the load drains them);
  a request in flight at an edge contributes only the tokens it produced inside the window;
* `--rate max`: the window starts at the first moment every row is busy (warm-up requests done) and lasts
  the window length; admission stops at its end (the queue "empties") and the running requests drain.
  Counted for latencies: the requests admitted inside it.
J/output token = the window's energy / the output tokens produced inside it; SLO goodput from request_metrics.

Rates: offered = the counted arrivals' rate over their own span, first to last arrival (the intervals between them:
count - 1; at `max` none, every request is offered at once; the window's measured edges come from the loop, which
an overloaded engine visits late);
served (`requests_per_s`) = the requests that finished inside the measured window over its length, the same window
as the energy and the tokens/s (a steady state serves what arrives; an overloaded one only its capacity). The
served window is the time the counted requests take at the served rate (counted / served rate): goodput = the
counted requests meeting every SLO over it, which is the served rate times the SLO share, and equals the old
"meeting the SLO per second of the window" where every arrival was served. The SLO share is over every counted
request (an unfinished one meets none). The overload note says when the queue (requests arrived but not yet
admitted to a row) never emptied in the second half of a finite rate's window (an overload builds its queue up
from the start; a queue that was empty for an instant at the first counted arrival still never drained), and when
the window is shorter than MIN_COUNTER_PERIODS of the energy counter's updates.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from joulebench.figures import MIN_COUNTER_PERIODS
from joulebench.record import RunRecord, driver_metrics, steady_metrics
from joulebench.record_types import LoadMetrics
from jpwr import Window
from llm_inference import request_metrics
from llm_inference.arrivals import Request, arrival_times, draw_requests
from llm_inference.load_config import WARMUP_ARRIVAL_S, LoadConfig, rate_label
from llm_inference.runner import shown
from llm_inference.tasks import TASKS
from llm_inference.window_rules import ArrivalWindow, SaturatedWindow, WindowRule

WORK_UNIT = "output_tokens"
SUMMARY_EXTRA = ("rate", "max_concurrency", "offered_requests_per_s", "requests_per_s", "energy_per_output_token_j",
                 "ttft_p90_s", "tpot_p90_s", "goodput_requests_per_s", "overload")
CPU_WARMUP_ARRIVAL_S = 1.0
# The per-request fit's segments are bounded by the energy counter's updates (H100: ~20-100 ms): an in-process
# sampler reads it at least twice per update (an NVML counter read costs ~4 ms of the sampler's own thread).
COUNTER_READ_S = 0.05
COUNTER_SETTLE_S = 0.3  # idle after the load: the counter's next update (H100: <= 100 ms) covers the last step
MAX_CHUNK = 4096  # `--rate max` draws its endless queue in chunks of this many requests
NO_WINDOW = ("the load ended before its window opened (no moment with every row busy after the warm-up requests, or "
             "no counted arrival): raise --requests or lower --max-concurrency")


@dataclasses.dataclass
class Plan:
    """One rate's requests and window rule; counted requests are the ones that are not warm-up requests."""

    requests: Iterator[Request]
    rule: WindowRule
    expected: int | None  # how many requests, where known (an endless `--rate max` queue: None)
    note: str


def _warmup_count(cfg: LoadConfig, rate: float, device: torch.device) -> int:
    if cfg.warmup_requests is not None:
        return cfg.warmup_requests
    if math.isinf(rate):
        return cfg.max_concurrency
    return math.ceil(rate * (WARMUP_ARRIVAL_S if device.type == "cuda" else CPU_WARMUP_ARRIVAL_S))


def plan_rate(cfg: LoadConfig, rate: float, window_s: float, device: torch.device) -> Plan:
    """Drawn requests at `rate` (warm-up, then counted) and when the window opens and closes."""
    task = TASKS[cfg.task]
    warmup = _warmup_count(cfg, rate, device)
    if math.isinf(rate):
        if cfg.requests is not None:
            items = draw_requests(task, np.zeros(warmup + cfg.requests), cfg.seed, cfg.output_length, warmup)
            return Plan(iter(items), SaturatedWindow(None), len(items), f"{cfg.requests} counted requests queued")
        return Plan(endless_requests(cfg, warmup), SaturatedWindow(window_s), None,
                    f"window of {window_s:.3g} s with every row busy")
    counted = cfg.requests or math.ceil(rate * window_s) + 1
    times = arrival_times(cfg.arrivals, rate, warmup + counted, cfg.seed)
    items = draw_requests(task, times, cfg.seed, cfg.output_length, warmup)
    note = f"{warmup} warm-up and {counted} counted {cfg.arrivals} arrivals at {rate:g}/s"
    return Plan(iter(items), ArrivalWindow(float(times[warmup]), float(times[-1])), len(items), note)


def endless_requests(cfg: LoadConfig, warmup: int) -> Iterator[Request]:
    """`--rate max` without --requests: requests drawn on demand, all arriving at the start."""
    task = TASKS[cfg.task]
    for chunk in itertools.count():
        draw = draw_requests(task, np.zeros(MAX_CHUNK), cfg.seed + chunk, cfg.output_length,
                             min(MAX_CHUNK, max(0, warmup - chunk * MAX_CHUNK)))
        for r in draw:
            yield Request(r.id + chunk * MAX_CHUNK, 0.0, r.input_tokens, r.output_tokens, None, r.warmup)


def plan_trace(requests: list[Request], warmup: int) -> Plan:
    flagged = [Request(r.id, r.arrival_s, r.input_tokens, r.output_tokens, r.prompt_ids, r.id < warmup)
               for r in requests]
    first = flagged[min(warmup, len(flagged) - 1)].arrival_s
    return Plan(iter(flagged), ArrivalWindow(first, flagged[-1].arrival_s), len(flagged),
                f"trace of {len(flagged)} requests ({warmup} warm-up)")


def rate_paths(cfg: LoadConfig, rate: float | None, single: bool) -> tuple[str, Path, str]:
    """A rate's label, record directory and run id: one rate (or a trace) writes to --out-dir itself, a sweep's
    rates to rate_<label>/ with the run id suffixed."""
    label = "trace" if rate is None else rate_label(rate)
    if single:
        return label, Path(cfg.out_dir), cfg.run_id
    return label, Path(cfg.out_dir) / f"rate_{label}", f"{cfg.run_id}-rate{label}"


@dataclasses.dataclass(frozen=True)
class Served:
    """What the rate's figures read beyond the window: the load's time zero (ns, the requests' clock), every
    request's arrival, admission and finish (seconds from it; NaN: never admitted, unfinished) and the counter's
    update period."""

    start_ns: int
    arrival_s: np.ndarray
    admitted_s: np.ndarray
    finish_s: np.ndarray
    update_period_s: float | None


def queue_drained(arrival_s: np.ndarray, admitted_s: np.ndarray, t0_s: float, t1_s: float) -> bool:
    """Whether the queue (requests arrived, not yet admitted) was empty at some moment of [t0, t1]: the waits
    [arrival, admission) do not cover the whole window. A request never admitted waits to the end."""
    waits = sorted((float(a), math.inf if math.isnan(b) else float(b)) for a, b in zip(arrival_s, admitted_s,
                                                                                        strict=True) if not b <= a)
    covered = t0_s
    for begin, end in waits:
        if begin > covered:
            break
        covered = max(covered, end)
    return covered < t1_s


def _rates(steady: Window, counted: set[int], rule: WindowRule, served: Served | None) -> LoadMetrics:
    """Offered and served request rates, the served window and the queue's state (module docstring)."""
    span = rule.arrival_span_s()  # the arrivals' own, not the loop's
    arrivals_window = span is not None and steady.duration_s > 0
    offered = (len(counted) - 1) / span if span and arrivals_window and len(counted) > 1 else None
    if served is None:
        return {"offered_requests_per_s": offered, "requests_per_s": None, "requests_served_in_window": None,
                "served_window_s": None, "queue_drained": None}
    t0 = (steady.t_start_ns - served.start_ns) / 1e9
    t1 = t0 + steady.duration_s
    inside = int(np.count_nonzero((served.finish_s >= t0) & (served.finish_s < t1)))  # NaN: unfinished, never in
    rate = inside / steady.duration_s if inside and steady.duration_s > 0 else None
    drained = queue_drained(served.arrival_s, served.admitted_s, (t0 + t1) / 2, t1) if arrivals_window else None
    return {"offered_requests_per_s": offered, "requests_per_s": rate, "requests_served_in_window": inside,
            "served_window_s": len(counted) / rate if rate and counted else None, "queue_drained": drained}


QUEUE_NEVER_DRAINED, SHORT_WINDOW = "queue_never_drained", "short_window"


def overload_flags(figures: Mapping[str, Any]) -> str | None:
    """The overload in one token for the result line: `queue_never_drained`, `short_window`, both joined by a
    comma, `none`; None (n/a) where neither could be judged."""
    periods, drained = figures.get("window_counter_periods"), figures.get("queue_drained")
    if periods is None and drained is None:
        return None
    flags = [QUEUE_NEVER_DRAINED] * (drained is False) + [SHORT_WINDOW] * (periods is not None
                                                                          and periods < MIN_COUNTER_PERIODS)
    return ",".join(flags) or "none"


def overload_note(figures: Mapping[str, Any], window_s: float, update_period_s: float | None) -> str | None:
    """The rate's overload in words (None: nothing to say): a queue that never drained, a short window."""
    notes = []
    if figures.get("queue_drained") is False:
        offered, served = figures.get("offered_requests_per_s"), figures.get("requests_per_s")
        served_text = (f"served {_g(served)} of {_g(offered)} offered requests/s (the counted requests take "
                       f"{_g(figures.get('served_window_s'))} s at the served rate, against a {_g(window_s)} s "
                       "arrivals' window)") if served else \
            f"no request finished inside the window, {_g(offered)} requests/s offered"
        notes.append(f"overload: the queue never drained in the window's second half; {served_text}")
    periods = figures.get("window_counter_periods")
    if periods is not None and periods < MIN_COUNTER_PERIODS and update_period_s:
        notes.append(f"the window ({_g(window_s)} s) is shorter than {MIN_COUNTER_PERIODS} energy counter periods "
                     f"({_g(update_period_s * 1e3)} ms each): its energy bound is wide")
    return "; ".join(notes) or None


def _g(value: Any) -> str:
    return "n/a" if value is None else f"{value:.3g}"


def load_metrics(cfg: LoadConfig, rate: float | None, steady: Window | None,
                 times: list[request_metrics.RequestTimes], counted: set[int], rule: WindowRule | None,
                 served: Served | None = None, *, devices: int | None) -> LoadMetrics:
    """The record's figures of one rate, for the engine and a server alike. `times`: the counted requests that
    finished (of `counted`, the window's counted requests); `served`: what the served rate and the overload note
    read (None: those figures are n/a); `devices`: the devices that did the work (joulebench.figures.work_devices),
    as `run` divides by them."""
    result: LoadMetrics = {"work_unit": WORK_UNIT, "rate": "trace" if rate is None else rate_label(rate),
                       "max_concurrency": cfg.max_concurrency, "task": cfg.task}
    if steady is None or rule is None:
        return result
    result.update(steady_metrics(steady, work_unit=WORK_UNIT, devices=devices))
    result["devices"] = devices
    slo_ttft = None if cfg.slo_ttft_ms is None else cfg.slo_ttft_ms / 1e3
    slo_tpot = None if cfg.slo_tpot_ms is None else cfg.slo_tpot_ms / 1e3
    rates = _rates(steady, counted, rule, served)
    summary = request_metrics.latency_summary(times, slo_ttft, slo_tpot, rates["served_window_s"], len(counted))
    energy = steady.energy
    joules = energy.energy_j if energy else None
    tokens = steady.work.get(WORK_UNIT)
    period = served.update_period_s if served else None
    result.update(summary)
    result.update(rates)
    result["window_counter_periods"] = steady.duration_s / period if period else None
    result["overload"] = overload_flags(result)
    result["overload_note"] = overload_note(result, steady.duration_s, period)
    result.update({
        "requests_counted": len(counted), "requests_finished": len(times),
        "energy_per_output_token_j": joules / tokens if joules is not None and tokens else None,
        "energy_per_output_token_error_bound_j": (energy.error_bound_j / tokens
                                                  if energy and energy.error_bound_j is not None and tokens else None),
        "slo_ttft_ms": cfg.slo_ttft_ms, "slo_tpot_ms": cfg.slo_tpot_ms,
        "window_rule": rule.description})
    return result


def progress_line(record: RunRecord) -> str:
    m: LoadMetrics = driver_metrics(record, LoadMetrics) or {}  # none: the rate's figures could not be computed
    return (f"rate {m.get('rate')}: {record.status}, {shown(m, 'output_tokens_per_s')} tokens/s, "
            f"{shown(m, 'requests_per_s')} req/s, {shown(m, 'energy_per_output_token_j')} J/token, p90 TTFT "
            f"{shown(m, 'ttft_p90_s', 1e3)} ms, p90 TPOT {shown(m, 'tpot_p90_s', 1e3)} ms, goodput "
            f"{shown(m, 'goodput_requests_per_s')} req/s"
            + (f" (offered {shown(m, 'offered_requests_per_s')} req/s)" if m.get("offered_requests_per_s") else "")
            + (f"; NOTE {m['overload_note']}" if m.get("overload_note") else ""))
