"""Inference figures of one point from its windows: rates, latencies, energy per request and token.

Energy (accelerator total, not above idle) comes with its method, coverage and bound:

* per request / per output token: the `steady` window's energy (prefill and decode of whole
  generations) divided by its requests / output tokens; bound divided likewise;
* prefill per call and per input token: the `prefill` window's energy over its calls / tokens;
* decode per token: E_decode = E_steady − E_prefill · (steady passes / prefill passes), over the
  steady window's decode tokens (output tokens minus the first of each sequence, which prefill
  produces). Bound: b_steady + b_prefill · (steady passes / prefill passes). It assumes a prefill in
  the loop costs what generate's first step costs (same shapes, same kernels), stated in the record.

With an idle baseline (measured once per invocation, before the first point), each of these splits into
an idle part (idle power × time: what the device draws doing nothing) and a dynamic part (the rest):
`steady_idle_share` says how much of a token's cost is the GPU waiting, and the decode figure is also
given above idle (`decode_dynamic_energy_per_token_j`, same subtraction on the dynamic parts).

Latencies come from the steady window's generate calls: time to first token (all requests of a
static batch arrive together, so no queueing is included) and the per-token gaps after it.
"""

from __future__ import annotations

import numpy as np

from joulebench.record_types import InferenceRunMetrics
from jpwr import WindowEnergy
from llm_inference.engine import Timing
from llm_inference.measure import PointWindows

DECODE_NOTE = ("decode = steady window minus the prefill window's energy of the same number of passes; assumes a "
               "prefill call in a loop costs what generate's first step costs")


def _quantiles(values: list[float] | tuple[float, ...]) -> tuple[float | None, float | None]:
    if not values:
        return None, None
    return float(np.median(values)), float(np.quantile(values, 0.9))


def latency_metrics(timings: list[Timing]) -> InferenceRunMetrics:
    ttft_median, ttft_p90 = _quantiles([t.ttft_s for t in timings])
    gap_median, gap_p90 = _quantiles([gap for t in timings for gap in t.inter_token_s])
    return {"ttft_median_s": ttft_median, "ttft_p90_s": ttft_p90,
            "per_token_latency_median_s": gap_median, "per_token_latency_p90_s": gap_p90}


def _divide(value: float | None, by: float | None) -> float | None:
    return value / by if value is not None and by else None


def energy_metrics(point: PointWindows) -> InferenceRunMetrics:
    """Per-request, per-token, prefill and decode energies with bounds; None (n/a) wherever energy is missing."""
    steady, prefill = point.steady, point.prefill
    e_steady: WindowEnergy | None = steady.energy
    e_prefill: WindowEnergy | None = prefill.energy
    joules = e_steady.energy_j if e_steady else None
    bound = e_steady.error_bound_j if e_steady else None
    metrics: InferenceRunMetrics = {
        "energy_j": joules,
        "energy_per_request_j": _divide(joules, steady.work.get("requests")),
        "energy_per_output_token_j": _divide(joules, steady.work.get("output_tokens")),
        "energy_per_output_token_error_bound_j": _divide(bound, steady.work.get("output_tokens")),
        "mean_power_w": _divide(joules, steady.duration_s),
        "prefill_energy_j": e_prefill.energy_j if e_prefill else None,
        "prefill_energy_error_bound_j": e_prefill.error_bound_j if e_prefill else None,
        "prefill_energy_method": e_prefill.method if e_prefill else None,
        "prefill_energy_per_call_j": None, "prefill_energy_per_input_token_j": None,
        "decode_energy_j": None, "decode_energy_per_token_j": None, "decode_energy_per_token_error_bound_j": None,
        "decode_energy_note": DECODE_NOTE,
    }
    if e_prefill is not None and e_prefill.energy_j is not None:
        metrics["prefill_energy_per_call_j"] = _divide(e_prefill.energy_j, prefill.work.get("calls"))
        metrics["prefill_energy_per_input_token_j"] = _divide(e_prefill.energy_j, prefill.work.get("input_tokens"))
        if joules is not None and bound is not None:
            ratio = point.steady_passes / point.prefill_passes
            decode_j = joules - e_prefill.energy_j * ratio
            decode_bound = bound + (e_prefill.error_bound_j or 0.0) * ratio
            tokens = steady.work.get("decode_tokens")
            metrics.update({"decode_energy_j": decode_j, "decode_energy_per_token_j": _divide(decode_j, tokens),
                            "decode_energy_per_token_error_bound_j": _divide(decode_bound, tokens)})
    metrics.update(_idle_split_metrics(point))
    return metrics


def _idle_split_metrics(point: PointWindows) -> InferenceRunMetrics:
    """The steady window's idle share and the prefill and decode energies above idle; None without a baseline."""
    steady, prefill = point.steady.split, point.prefill.split
    reasons = [split.unavailable_reason if split else "no idle baseline" for split in (steady, prefill)]
    reason = next((r for r in reasons if r), None)
    result: InferenceRunMetrics = {
        "steady_idle_energy_j": None, "steady_dynamic_energy_j": None, "steady_idle_share": None,
        "prefill_dynamic_energy_j": None, "decode_dynamic_energy_j": None, "decode_dynamic_energy_per_token_j": None,
        "decode_dynamic_energy_per_token_error_bound_j": None, "idle_split_unavailable_reason": reason}
    if steady is None or steady.dynamic_j is None or steady.idle_j is None:
        return result
    total = steady.idle_j + steady.dynamic_j
    result.update({"steady_idle_energy_j": steady.idle_j, "steady_dynamic_energy_j": steady.dynamic_j,
                   "steady_idle_share": steady.idle_j / total if total > 0 else None,
                   "idle_split_unavailable_reason": None})
    if prefill is None or prefill.dynamic_j is None:
        result["idle_split_unavailable_reason"] = f"prefill window: {reason}"
        return result
    ratio = point.steady_passes / point.prefill_passes
    decode_j = steady.dynamic_j - prefill.dynamic_j * ratio
    bound = (steady.dynamic_bound_j or 0.0) + (prefill.dynamic_bound_j or 0.0) * ratio
    tokens = point.steady.work.get("decode_tokens")
    result.update({"prefill_dynamic_energy_j": prefill.dynamic_j, "decode_dynamic_energy_j": decode_j,
                   "decode_dynamic_energy_per_token_j": _divide(decode_j, tokens),
                   "decode_dynamic_energy_per_token_error_bound_j": _divide(bound, tokens)})
    return result


def rate_metrics(point: PointWindows) -> InferenceRunMetrics:
    steady, prefill = point.steady, point.prefill
    return {
        "requests_per_s": _divide(steady.work.get("requests"), steady.duration_s),
        "input_tokens_per_s": _divide(steady.work.get("input_tokens"), steady.duration_s),
        "prefill_call_s": _divide(prefill.duration_s, prefill.work.get("calls")),
        "prefill_input_tokens_per_s": _divide(prefill.work.get("input_tokens"), prefill.duration_s),
    }
