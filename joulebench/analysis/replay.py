"""The replay estimator (training) and the window split (inference): phase energies measured directly.

Replay: the driver ran each phase alone (`--replay-phases`) in windows `replay/<part>`, so the counter
measures J per invocation with the window estimator's own bound. Backward is forward+backward minus
forward (their bounds add); the sum forward + backward + optimizer is compared with the whole step run the
same way. A phase replayed alone runs back to back without the others around it (clocks, caches and
overlap differ), which is why replay and fit are reported side by side and never mixed.

Inference: prefill and decode are separate windows already (llm_inference.metrics); their split of the
steady window is the same rule as in the record's metrics.
"""

from __future__ import annotations

from typing import Any

from joulebench.phases import BACKWARD, FORWARD, GRAD_REDUCE, OPTIMIZER, REPLAY_PREFIX
from joulebench.record import RunRecord, driver_metrics
from joulebench.record_types import InferenceRunMetrics
from jpwr import Window

REPLAY_PARTS = ("forward", "forward+backward", "optimizer", "step")
MIN_REPLAY_COUNTER_PERIODS = 30
NOT_REPLAYED = "not replayed"  # a row with no figure of its own: its time lies inside another phase
REPLAY_METHOD = ("each phase alone in its own window (--replay-phases), J per invocation = window energy "
                 "(counter-anchored) / invocations; backward = (forward+backward) − forward")
INFERENCE_METHOD = ("the prefill-only window scaled to the steady window's passes; decode = steady − "
                    "prefill (llm_inference.metrics)")


def _measured(window: Window) -> dict[str, Any] | None:
    """J, bound, seconds per invocation of one replay window (None when it has no energy)."""
    energy = window.energy
    count = window.work.get("invocations") or window.steps
    if energy is None or energy.energy_j is None or not count:
        return None
    return {"energy_j": energy.energy_j / count, "error_bound_j": (energy.error_bound_j or 0.0) / count,
            "seconds": window.duration_s / count, "invocations": int(count), "window_s": window.duration_s,
            "method": energy.method}


def _row(phase: str, status: str, part: dict[str, Any], **extra: Any) -> dict[str, Any]:
    seconds = part["seconds"]
    bound = part["error_bound_j"]
    return {"phase": phase, "status": status, "energy_per_step_j": part["energy_j"], "error_bound_j": bound,
            "interval_j": [part["energy_j"] - bound, part["energy_j"] + bound],
            "mean_power_w": part["energy_j"] / seconds if seconds > 0 else None, "seconds_per_step": seconds,
            **extra}


def replay_estimator(record: RunRecord, counter_period_s: float | None, devices: int, replicas: int,
                     idle_power_w: float | None) -> dict[str, Any]:
    """Rows per phase (J per step, i.e. per invocation) and the sum-versus-step check; `devices` metered (idle
    power scales with them), `replicas` data-parallel (gradient reduction exists only with several)."""
    windows = {w.name[len(REPLAY_PREFIX):]: w for w in record.windows if w.name.startswith(REPLAY_PREFIX)}
    if not windows:
        return {"method": REPLAY_METHOD, "unavailable_reason": "the record has no replay/<phase> windows: run the "
                "driver with --replay-phases SECONDS (under a jpwr sampler)"}
    parts = {name: _measured(w) for name, w in windows.items()}
    notes = [f"replay window {REPLAY_PREFIX}{name} missing" for name in REPLAY_PARTS if name not in windows]
    notes += [f"replay window {REPLAY_PREFIX}{name} has no energy ({_reason(windows[name])})"
              for name, part in parts.items() if part is None]
    minimum = MIN_REPLAY_COUNTER_PERIODS * counter_period_s if counter_period_s else None
    notes += [f"replay window {REPLAY_PREFIX}{name} lasted {part['window_s']:.2f} s, under "
              f"{MIN_REPLAY_COUNTER_PERIODS} counter periods ({minimum:.1f} s): its bound is wide"
              for name, part in parts.items() if part and minimum and part["window_s"] < minimum]
    forward, both, optimizer, step = (parts.get(name) for name in REPLAY_PARTS)
    rows = []
    if forward:
        rows.append(_row(FORWARD, "measured", forward))
    if forward and both:
        backward = {"energy_j": both["energy_j"] - forward["energy_j"],
                    "error_bound_j": both["error_bound_j"] + forward["error_bound_j"],
                    "seconds": both["seconds"] - forward["seconds"]}
        rows.append(_row(BACKWARD, "derived", backward, note="(forward+backward) − forward"))
    if optimizer:
        rows.append(_row(OPTIMIZER, "measured", optimizer))
    if replicas > 1:
        rows.append({"phase": GRAD_REDUCE, "status": NOT_REPLAYED, "note": "it needs backward's gradient "
                     "buckets: inside forward+backward"})
    result: dict[str, Any] = {"method": REPLAY_METHOD, "rows": rows, "notes": notes,
                              "windows": {name: part for name, part in parts.items() if part}}
    if step:
        for row in rows:
            if row.get("energy_per_step_j") is not None:
                row["share_of_step"] = row["energy_per_step_j"] / step["energy_j"]
    if both and optimizer and step:
        total = both["energy_j"] + optimizer["energy_j"]
        bound = both["error_bound_j"] + optimizer["error_bound_j"] + step["error_bound_j"]
        residual = total - step["energy_j"]
        result["sum_vs_step"] = {"sum_j": total, "step_j": step["energy_j"], "residual_j": residual,
                                 "bound_j": bound, "status": "closes" if abs(residual) <= bound else "misfit"}
    if idle_power_w is not None:
        add_dynamic(rows, idle_power_w * devices, "energy_per_step_j", "seconds_per_step")
    return result


def _reason(window: Window) -> str:
    return (window.energy.unavailable_reason if window.energy else None) or "not measured"


def add_dynamic(rows: list[dict[str, Any]], idle_w: float, energy_key: str, seconds_key: str) -> None:
    """The idle/dynamic split: dynamic = energy − idle power × time (idle over all devices the energy covers).
    A phase drawing less than the idle power has no dynamic energy to show: a negative one would read as measured,
    so it is null with the reason."""
    for row in rows:
        energy, seconds = row.get(energy_key), row.get(seconds_key)
        if energy is not None and seconds is not None:
            row["idle_j"] = idle_w * seconds
            row["dynamic_j"] = energy - idle_w * seconds
            if row["dynamic_j"] < 0:
                row["dynamic_j"] = None
                row["dynamic_reason"] = (f"idle baseline {idle_w:.4g} W above the phase's mean power "
                                         f"{energy / seconds:.4g} W (baseline not settled, or --idle-power-w too high)")


def inference_estimator(record: RunRecord, idle_power_w: float | None) -> dict[str, Any]:
    """Prefill and decode shares of the steady window (generation), from the driver's own windows and metrics."""
    m: InferenceRunMetrics = driver_metrics(record, InferenceRunMetrics) or {}  # a static-batch run's figures
    steady, prefill = record.window("steady"), record.window("prefill")
    total, decode = m.get("energy_j"), m.get("decode_energy_j")
    prefill_j = m.get("prefill_energy_j")
    if steady is None or prefill is None or total is None or decode is None or not prefill_j:
        return {"method": INFERENCE_METHOD, "unavailable_reason": "the record lacks the prefill/steady windows or "
                "their energies (llm_inference records carry them when metered)"}
    ratio = (total - decode) / prefill_j  # steady passes / prefill passes
    prefill_s = prefill.duration_s * ratio
    decode_bound = (m.get("decode_energy_per_token_error_bound_j") or 0.0) * steady.work.get("decode_tokens", 0.0)
    prefill_bound = (m.get("prefill_energy_error_bound_j") or 0.0) * ratio
    rows = [{"phase": "prefill", "status": "measured", "energy_j": total - decode, "error_bound_j": prefill_bound,
             "seconds": prefill_s, "share": (total - decode) / total},
            {"phase": "decode", "status": "derived", "energy_j": decode, "error_bound_j": decode_bound,
             "seconds": steady.duration_s - prefill_s, "share": decode / total}]
    for row in rows:
        row["mean_power_w"] = row["energy_j"] / row["seconds"] if row["seconds"] > 0 else None
        row["interval_j"] = [row["energy_j"] - row["error_bound_j"], row["energy_j"] + row["error_bound_j"]]
    if idle_power_w is not None:
        add_dynamic(rows, idle_power_w * (steady.energy.devices if steady.energy else 1), "energy_j", "seconds")
    return {"method": INFERENCE_METHOD, "rows": rows, "window_energy_j": total}
