"""The one check of the figures analysis reads from a run record or a clock profile (docs/reports.md, "Figures
that cannot be true").

Why: a damaged or hand-edited file must never become a confident conclusion. A steady energy of 0 J, a negative
time or a NaN rate would be ranked cheapest, put on a Pareto front or planned on. Every verb that reads records
(report, --compare, --pareto, plan, attribute, the JUBE result step) asks here, so that one rule decides what a
figure may be: energy, time, power and work positive and finite, coverage a fraction, window edges ordered, and
the record's Wh and rates consistent with its window's J, work and seconds. A missing figure (None) is not a
problem: it is n/a, and stays so.
"""

from __future__ import annotations

import math
from typing import Any, TypeGuard

from joulebench.latents import STEADY
from joulebench.record import RunRecord, driver_metrics
from joulebench.record_types import LoadMetrics, RequestEnergyBlock
from jpwr import Window
from jpwr.energy import J_PER_WH

# Relative disagreement allowed between a record's derived figures and the window they are derived from: the
# driver computes both from the same numbers, so anything beyond rounding means a unit mix-up or an edit.
CONSISTENCY_TOLERANCE = 1e-6
# metrics keys that are positive where present ({unit} is the record's work unit).
POSITIVE_METRICS = (
    "duration_s", "time_per_iteration_s", "{unit}_per_s", "{unit}_per_s_per_device", "energy_wh", "{unit}_per_wh",
    "mean_power_w_per_device", "partial_mean_power_w_per_device", "partial_{unit}_per_wh", "model_tflops_per_device",
    "mfu", "decode_energy_per_token_j", "energy_per_output_token_j", "energy_per_request_j", "requests_per_s",
    "ttft_median_s", "ttft_p90_s", "per_token_latency_median_s", "per_token_latency_p90_s",
    "energy_j", "prefill_energy_j", "decode_energy_j",  # llm_inference: what attribute's prefill/decode split reads
)
# metrics keys that are zero or positive where present: error bounds.
BOUND_METRICS = ("energy_error_bound_j", "dynamic_energy_error_bound_j", "energy_per_output_token_error_bound_j",
                 "decode_energy_per_token_error_bound_j", "prefill_energy_error_bound_j")
WHOLE_METRICS = ("iterations", "devices", "per_device_batch_size")  # positive whole numbers where present
# config keys that are positive whole numbers where present: the knobs a recommendation prints as a driver option
# (batch_size=-4, "four" or 4.5 would become `--batch-size -4`) and the parallel layout
WHOLE_CONFIG = ("batch_size", "max_concurrency", "micro_batch_size", "tensor_parallel", "pipeline_parallel",
                "num_batches", "world_size")
REJECTED = "rejected"  # what a table shows in place of a figure of a rejected record; the note says why


def work_unit(record: RunRecord) -> str:
    """What the record counts as work (tokens, images, output_tokens): the unit of every per-unit figure."""
    return str(record.metrics.get("work_unit") or ("images" if record.benchmark == "resnet50" else "tokens"))


def unit_figure(record: RunRecord, name: str) -> float | None:
    """The metrics figure `name` with `{unit}` read as the record's work unit (`{unit}_per_s`: tokens_per_s,
    images_per_s ...; record_types.Metrics declares them per unit); None where it is missing or not a number
    (record_problems rejects such a record)."""
    value = record.metrics.get(name.format(unit=work_unit(record)))
    return value if isinstance(value, int | float) and not isinstance(value, bool) else None


def work_devices(record: RunRecord) -> int | None:
    """The devices that did the run's work, as its record names them: what every per-device throughput divides by,
    one rule for every driver and command (`run` and `load` alike; issue 61). The metrics' `devices` where the
    driver wrote them, else the config's (a TensorFlow strategy's devices in one process), else a started server's
    (`--server-devices`), else the job's processes (hardware `devices`: one device each). None where the record
    names none (a load against a server the client knows no devices of): the per-device figure is then n/a. The
    metered devices are not the divisor: a meter may count an idle device beside the job (the record's
    energy_warning says so)."""
    server = record.config.get("server")
    named: tuple[Any, ...] = (record.metrics.get("devices"), record.config.get("devices"),
                              _listed(server.get("devices")) if isinstance(server, dict) else None,
                              record.hardware.get("devices"))
    return next((int(value) for value in named if number_problem("devices", value, whole=True) is None
                 and value is not None), None)


def _listed(devices: Any) -> int | None:
    """How many devices a CUDA_VISIBLE_DEVICES-form list names ("0,1": 2); None for no list."""
    if not isinstance(devices, str):
        return None
    return len([d for d in devices.split(",") if d.strip()]) or None


def is_number(value: Any) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


def number_problem(name: str, value: Any, *, zero_allowed: bool = False, whole: bool = False) -> str | None:
    """Why `value` cannot be the figure `name`, or None when it can (or is missing: None is n/a, not wrong)."""
    if value is None:
        return None
    if not is_number(value):
        return f"{name} {value!r} is not a number"
    if not math.isfinite(value):
        return f"{name} {value} is not finite"
    if value < 0 or (value == 0 and not zero_allowed):
        return f"{name} {value:g} is not {'zero or ' if zero_allowed else ''}positive"
    if whole and not float(value).is_integer():
        return f"{name} {value:g} is not a whole number"
    return None


def fraction_problem(name: str, value: Any) -> str | None:
    """A share (coverage): a number from 0 to 1, or missing."""
    problem = number_problem(name, value, zero_allowed=True)
    if problem is None and value is not None and value > 1:
        return f"{name} {value:g} is above 1"
    return problem


def _mismatch(name: str, value: Any, expected: float | None, unit: str) -> str | None:
    """Say so when a derived figure disagrees with the one it must equal (both present and numbers)."""
    if value is None or expected is None or not is_number(value):
        return None
    if abs(value - expected) > CONSISTENCY_TOLERANCE * max(abs(value), abs(expected)):
        return f"{name} {value:g} is inconsistent with the window's {expected:g} {unit} (units mixed up or edited)"
    return None


def window_problems(window: Window) -> list[str]:
    """Edges ordered and whole, steps counted, and (for any window) its energy's figures."""
    where = f"window {window.name!r}"
    problems = [p for p in (number_problem(f"{where} t_start_ns", window.t_start_ns, zero_allowed=True, whole=True),
                            number_problem(f"{where} t_end_ns", window.t_end_ns, zero_allowed=True, whole=True),
                            number_problem(f"{where} first_step", window.first_step, zero_allowed=True, whole=True),
                            number_problem(f"{where} last_step", window.last_step, zero_allowed=True, whole=True))
                if p]
    if not problems and window.t_end_ns <= window.t_start_ns:
        problems.append(f"{where} ends (t_end_ns {window.t_end_ns}) before it starts (t_start_ns {window.t_start_ns})")
    if not problems and window.last_step < window.first_step:
        problems.append(f"{where} ends at step {window.last_step} before its first step {window.first_step}")
    energy = window.energy
    if energy is not None:
        problems += [p for p in (number_problem(f"{where} energy_j", energy.energy_j),
                                 number_problem(f"{where} mean_power_w", energy.mean_power_w),
                                 number_problem(f"{where} error_bound_j", energy.error_bound_j, zero_allowed=True),
                                 number_problem(f"{where} devices", energy.devices, zero_allowed=True, whole=True),
                                 fraction_problem(f"{where} coverage", energy.coverage)) if p]
    return problems


def record_problems(record: RunRecord) -> list[str]:
    """Every figure of the record that cannot be true, in words; empty when analysis may use it."""
    problems = [p for w in record.windows for p in window_problems(w)]
    metrics = record.metrics
    unit = work_unit(record)
    steady = record.window(STEADY)
    if steady is not None:
        problems += [p for name, value in steady.work.items() if (p := number_problem(f"steady {name}", value))]
    problems += [p for key in POSITIVE_METRICS if (p := number_problem(key.format(unit=unit),
                                                                       metrics.get(key.format(unit=unit))))]
    problems += [p for key in WHOLE_METRICS if (p := number_problem(key, metrics.get(key), whole=True))]
    problems += [p for p in (fraction_problem("energy_coverage", metrics.get("energy_coverage")),) if p]
    problems += [p for key in BOUND_METRICS if (p := number_problem(key, metrics.get(key), zero_allowed=True))]
    problems += [p for p in (rate_problem((driver_metrics(record, LoadMetrics) or {}).get("rate")),) if p]
    problems += evidence_problems(record)
    problems += [p for key in WHOLE_CONFIG if (p := number_problem(f"config {key}", record.config.get(key),
                                                                   whole=True))]
    for name, value, whole in (("config devices", record.config.get("devices"), True),
                               ("hardware devices", record.hardware.get("devices"), True),
                               ("config global_batch_size", record.config.get("global_batch_size"), False),
                               ("config per_device_batch_size", record.config.get("per_device_batch_size"), True),
                               ("global_batch_size", metrics.get("global_batch_size"), False)):
        problems += [p for p in (number_problem(name, value, whole=whole),) if p]
    if not problems:
        problems += _consistency(record, unit)
    return problems


# The J-per-unit figures a record may carry, with the steady work they divide the window's energy by.
J_PER_UNIT_METRICS = (("energy_per_output_token_j", "output_tokens"), ("energy_per_request_j", "requests"))


def _consistency(record: RunRecord, unit: str) -> list[str]:
    """The record's headline figures against the window they were computed from (Wh, J per unit and mean power
    vs J, rates vs work and seconds), and its mean power against its own idle baseline. Without that window a
    headline figure cannot be checked, so it is not believed."""
    metrics = record.metrics
    name = metrics.get("window") or STEADY
    window = record.window(name)
    if window is None:
        shown = [key.format(unit=unit) for key in POSITIVE_METRICS if metrics.get(key.format(unit=unit)) is not None]
        return [f"no {name} window to check {', '.join(shown)} against (unverifiable)"] if shown else []
    energy = window.energy
    energy_j = energy.energy_j if energy is not None else None
    work, seconds, steps = window.work.get(unit), window.duration_s, window.steps
    checks = [("energy_wh", _ratio(energy_j, J_PER_WH), "Wh"), (f"{unit}_per_s", _ratio(work, seconds), f"{unit}/s"),
              (f"{unit}_per_s_per_device", _ratio(_ratio(work, seconds), work_devices(record)),
               f"{unit}/s per device of the {work_devices(record)} named"),
              (f"{unit}_per_wh", _ratio(work, _ratio(energy_j, J_PER_WH)), f"{unit}/Wh"),
              ("mean_power_w_per_device", energy.mean_power_w_per_device if energy is not None else None, "W"),
              ("duration_s", seconds, "s"), ("time_per_iteration_s", _ratio(seconds, steps), "s")]
    checks += [(key, _ratio(energy_j, window.work.get(divisor)), f"J/{divisor}") for key, divisor in J_PER_UNIT_METRICS]
    problems = [p for key, expected, what in checks if (p := _mismatch(key, metrics.get(key), expected, what))]
    return problems + [p for p in (_below_idle(record, window),) if p]


def _ratio(top: float | None, bottom: float | None) -> float | None:
    return None if top is None or not bottom else top / bottom


IDLE_FLOOR = 0.1  # a window below this share of the idle power was not measured (_below_idle)


def _below_idle(record: RunRecord, window: Window) -> str | None:
    """A window drawing under a tenth of the devices' idle power (beyond both bounds) was not measured: a load
    cannot lower a device's power below its idle draw. Only a gap no settling explains is refused: the idle baseline
    may itself be high (a device still hot from the warm-up, a replayed trace), so a window somewhat below it is
    not a sign of an edit."""
    idle, energy = record.meter.get("idle_baseline") or {}, window.energy
    idle_w, idle_bound_w = idle.get("power_w"), idle.get("error_bound_w")
    if (energy is None or energy.energy_j is None or idle_w is None or number_problem("idle power_w", idle_w)
            or idle.get("devices") != energy.devices):
        return None
    idle_bound_w = 0.0 if number_problem("idle error_bound_w", idle_bound_w, zero_allowed=True) else idle_bound_w or 0.0
    power_w, bound_w = energy.energy_j / window.duration_s, (energy.error_bound_j or 0.0) / window.duration_s
    if power_w + bound_w >= IDLE_FLOOR * (idle_w - idle_bound_w):
        return None
    return (f"{window.name} power {power_w:.4g} W below a tenth of the idle baseline {idle_w:.4g} W "
            f"(bounds ±{bound_w:.3g} W, ±{idle_bound_w:.3g} W; energy edited or not measured)")


# Serving figures of an llm_inference load record (joulebench.analysis.serving): positive, zero-or-positive, shares.
SERVING_POSITIVE = ("energy_per_request_p50_j", "energy_per_request_p90_j", "tpot_p90_s", "slo_ttft_ms", "slo_tpot_ms",
                    "offered_requests_per_s")
MAX_RATE = "max"  # a load's `rate` when every request is queued at the start; otherwise requests/s as a number
TRACE_RATE = "trace"  # a load's `rate` when it replayed a trace (its arrivals are its own)
# A window's energy bound is about two energy counter periods' energy: a window shorter than this many counter
# periods has a bound over ~20 % of its energy, too wide for a figure (llm_inference's load flags it short_window).
MIN_COUNTER_PERIODS = 10
SERVING_ZERO_ALLOWED = ("goodput_requests_per_s",)  # no request met the SLO: a measured 0
SERVING_FRACTIONS = ("slo_attained_share",)


def serving_problems(metrics: LoadMetrics, request_energy: RequestEnergyBlock | None = None) -> list[str]:
    """The serving figures of a load record that cannot be true: its latency, goodput and SLO figures, and the
    per-request energy block's J/request and prefill/decode/idle shares. Empty when the serving section may use it."""
    problems = [p for key in SERVING_POSITIVE if (p := number_problem(key, metrics.get(key)))]
    problems += [p for key in SERVING_ZERO_ALLOWED if (p := number_problem(key, metrics.get(key), zero_allowed=True))]
    problems += [p for key in SERVING_FRACTIONS if (p := fraction_problem(key, metrics.get(key)))]
    energy = request_energy or {}
    per_request = energy.get("energy_per_request_j")
    if isinstance(per_request, dict):
        problems += [p for q in ("p50", "p90") if (p := number_problem(f"requests energy_per_request_j {q}",
                                                                       per_request.get(q)))]
    shares = energy.get("shares")
    if isinstance(shares, dict):
        problems += [p for k, v in shares.items() if (p := fraction_problem(f"requests share {k}", v))]
    return problems


def evidence_problems(record: RunRecord) -> list[str]:
    """Where the window holds too little for its figures, whatever they say: a load whose window counted no request
    (its rates, latencies and J per request are of nothing), a window shorter than MIN_COUNTER_PERIODS energy
    counter periods (the record's `window_counter_periods`: its energy figures are within ~20 % at best). Such a
    record is never a figure, OK or not: once a JUBE serving row read OK, 5,151 tokens/s, from a 0.099 s window with
    one decode step and no request counted."""
    metrics: LoadMetrics = driver_metrics(record, LoadMetrics) or {}  # a load's figures: none elsewhere
    found = []
    counted = metrics.get("requests_counted")
    if counted is not None and is_number(counted) and counted < 1:
        found.append("no request was counted in the window (too short for its rates, latencies and energy per "
                     "request): give the load more requests or a longer window")
    periods = metrics.get("window_counter_periods")
    if periods is not None and is_number(periods) and periods < MIN_COUNTER_PERIODS:
        found.append(f"the window spans {periods:.3g} energy counter periods, fewer than {MIN_COUNTER_PERIODS}: too "
                     "short for its energy figures (their bound would exceed ~20 %); run a longer window")
    return found


def rate_problem(rate: Any) -> str | None:
    """A load's offered rate as recorded: `max` or a positive finite number of requests/s (a text, as the driver
    writes it, or a number); anything else would be shown and sorted as if it were a rate."""
    if rate is None or rate in (MAX_RATE, TRACE_RATE):
        return None
    try:
        value = float(rate) if isinstance(rate, str) else rate
    except ValueError:
        return f"rate {rate!r} is neither {MAX_RATE!r}, {TRACE_RATE!r} nor a number of requests/s"
    problem = number_problem("rate", value)
    return None if problem is None else f"{problem} ({MAX_RATE!r} or requests/s)"


def rejection(record: RunRecord) -> str | None:
    """The reason analysis leaves the record's figures out ("figures rejected: ..."), or None to use them."""
    problems = record_problems(record)
    return f"figures rejected: {'; '.join(problems)}" if problems else None
