"""Plausibility of the record values analysis computes with beyond the headline figures: one check per outside
source (docs/run-record.md, "What a reader refuses").

Why: a record is a file anyone can edit, and a value read from it becomes a recommendation. A locked clock read
from a record reaches `joulebench plan`'s per-phase clocks; an idle baseline read from a record is subtracted from
every phase (`joulebench attribute`'s dynamic energy). The headline figures are judged by joulebench.figures; these
two are judged here, against what the same record says about the device and the window:

* clocks: the requested and read-back SM clock of `config.device_settings` within the supported range each
  device reported when the clock was set (`devices[].supported_sm_clock_range_mhz`, written by
  `joulebench.device_settings apply`); outside it the run is left out, and without a recorded range the clock is
  used but flagged as unchecked.
* idle power: positive and finite, over a positive whole device count, at least MIN_DEVICE_POWER_W per device, and
  not above the window's mean power per device beyond the two combined bounds (a load never draws less than idle);
  otherwise no dynamic energy is computed (n/a, with the reason). `joulebench plan` holds an attribution's idle
  power and each phase's mean power per device to the same floor.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from joulebench.device_settings.record import RecordedSettings, recorded_settings
from joulebench.figures import is_number, number_problem
from joulebench.record import RunRecord
from jpwr import Window

CLOCK_RANGE_MHZ = (1, 100_000)  # a clock outside it is no clock of any device (H100 SM clocks: 210-1980 MHz)
# No device the meter reads draws less than this while powered (a GPU idles at tens of watts, a CPU package at
# watts): a smaller idle power or phase power per device was never measured (edited, or a unit mix-up).
MIN_DEVICE_POWER_W = 1.0
RANGE_KEY = "supported_sm_clock_range_mhz"  # a device entry's [min, max] SM clock (device_settings apply)


@dataclasses.dataclass(frozen=True)
class ClockCheck:
    """A record's device settings as the plan may use them: the settings, or why not; and a flag where the
    clock could not be checked against the device."""

    settings: RecordedSettings | None
    problem: str | None = None  # the run is left out
    unchecked: str | None = None  # the run is used; the clock is not known to be the device's


def _device_entries(block: Any) -> list[Any]:
    nodes = block.get("nodes") if isinstance(block, dict) else None
    found: list[Any] = []
    for node in nodes if isinstance(nodes, list) else [block]:
        devices = node.get("devices") if isinstance(node, dict) else None
        found += devices if isinstance(devices, list) else []
    return found


def _whole_clock_problem(name: str, value: Any) -> str | None:
    low, high = CLOCK_RANGE_MHZ
    problem = number_problem(name, value, whole=True)
    if problem is None and value is not None and not low <= value <= high:
        problem = f"{name} {int(value)} MHz is outside {low} to {high} MHz"
    return problem


def _range_problem(entry: Any, where: str) -> tuple[tuple[float, float] | None, str | None]:
    """A device entry's recorded clock range, or why it is not one (None, None: not recorded)."""
    span = entry.get(RANGE_KEY) if isinstance(entry, dict) else None
    if span is None:
        return None, None
    if (not isinstance(span, list) or len(span) != 2 or not all(is_number(v) for v in span)
            or not 0 < span[0] <= span[1]):
        return None, f"{where} {RANGE_KEY} {span!r} is not a [min, max] range in MHz"
    return (float(span[0]), float(span[1])), None


def clock_check(record: RunRecord) -> ClockCheck:
    """The record's device settings, its clocks checked against the devices' ranges (see the module docstring)."""
    block = record.config.get("device_settings")
    try:
        settings = recorded_settings(record.config)
    except (AttributeError, TypeError, ValueError, KeyError) as exc:
        return ClockCheck(None, f"config.device_settings cannot be read ({type(exc).__name__}: {exc})")
    requested = settings.requested.sm_clock_mhz
    clocks = [("config.device_settings.requested.sm_clock_mhz", requested)]
    clocks += [("config.device_settings locked_sm_clock_mhz", c) for c in settings.locked_sm_clock_mhz]
    problems = [p for name, value in clocks if (p := _whole_clock_problem(name, value))]
    if problems or requested is None:
        return ClockCheck(None if problems else settings, "; ".join(problems) or None)
    ranges = []
    for i, entry in enumerate(_device_entries(block)):
        span, problem = _range_problem(entry, f"config.device_settings device {i}")
        if problem:
            return ClockCheck(None, problem)
        if span is not None:
            ranges.append(span)
    if not ranges:
        return ClockCheck(settings, unchecked=f"clock {requested} MHz not checked against the device's range (the "
                                              f"record's device settings have no {RANGE_KEY})")
    low, high = max(r[0] for r in ranges), min(r[1] for r in ranges)
    outside = [f"{name.rsplit(' ', 1)[-1]} {value} MHz" for name, value in clocks
               if value is not None and not low <= value <= high]
    if outside:
        return ClockCheck(None, f"{', '.join(outside)} outside the devices' supported SM clocks {low:g}-{high:g} MHz "
                                "(edited, or recorded on another device)")
    return ClockCheck(settings)


def device_power_problem(name: str, watts: Any) -> str | None:
    """Why `watts` cannot be one device's power (not a positive number, or below MIN_DEVICE_POWER_W), or None."""
    problem = number_problem(name, watts)
    if problem is None and watts is not None and watts < MIN_DEVICE_POWER_W:
        problem = (f"{name} {watts:.3g} W is below {MIN_DEVICE_POWER_W:g} W per device, less than any device draws "
                   "while powered (edited, or a unit mix-up)")
    return problem


def idle_power_w(record: RunRecord, window: Window | None) -> tuple[float | None, str]:
    """Idle power per device from the record's idle baseline (meter.idle_baseline) and where it came from; None with
    the reason where it is missing or cannot be true (see the module docstring): then no dynamic energy."""
    baseline: Any = record.meter.get("idle_baseline")
    if not isinstance(baseline, dict) or baseline.get("power_w") is None:
        reason = baseline.get("unavailable_reason") if isinstance(baseline, dict) else None
        return None, f"no idle baseline in the record ({reason or 'not measured'})"
    power_w: Any = baseline.get("power_w")
    bound_w: Any = baseline.get("error_bound_w") or 0.0
    devices: Any = baseline.get("devices")
    problem = (number_problem("meter.idle_baseline.power_w", power_w)
               or number_problem("meter.idle_baseline.error_bound_w", bound_w, zero_allowed=True)
               or number_problem("meter.idle_baseline.devices", devices, whole=True)
               or (None if devices else "meter.idle_baseline.devices is missing"))
    if problem:
        return None, f"no dynamic energy: {problem}"
    idle_w, idle_bound_w = power_w / devices, bound_w / devices
    low = device_power_problem("meter.idle_baseline.power_w per device", idle_w)
    if low:
        return None, f"no dynamic energy: {low}"
    above = _above_window(idle_w, idle_bound_w, window)
    if above:
        return None, f"no dynamic energy: {above}"
    settled = baseline.get("settled")
    state = "settled" if settled is True else "not settled" if settled is False else "settling not checked"
    return idle_w, (f"the record's idle baseline: {power_w:.1f} W over {devices} device(s), "
                    f"{baseline.get('method') or 'method n/a'}, {state}")


def _above_window(idle_w: float, idle_bound_w: float, window: Window | None) -> str | None:
    """Why an idle power per device cannot be below the window's (above its mean power beyond both bounds)."""
    energy = window.energy if window else None
    if (window is None or energy is None or window.duration_s <= 0 or not energy.devices
            or not is_number(energy.energy_j) or not is_number(energy.error_bound_j or 0.0)):
        return None
    mean_w = energy.energy_j / window.duration_s / energy.devices
    bound_w = (energy.error_bound_j or 0.0) / window.duration_s / energy.devices
    if idle_w - idle_bound_w <= mean_w + bound_w:
        return None
    return (f"the idle baseline {idle_w:.4g} W per device is above the {window.name} window's mean power "
            f"{mean_w:.4g} W per device beyond the combined bounds (±{idle_bound_w:.3g} W, ±{bound_w:.3g} W): "
            "a load never draws less than idle (baseline taken hot, or edited)")
