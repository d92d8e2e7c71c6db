"""Why one run costs more energy than another: an exact time × power split plus the latent metrics.

Energy is time × mean power, so a difference between two runs splits exactly into a part due to
time and a part due to power (the symmetric, midpoint form leaves no interaction remainder):

    ΔE = Δt·(P̄₁+P̄₂)/2 + ΔP̄·(t₁+t₂)/2

Applied per unit of work (energy per token = time per token × mean power), it says whether a run
is dearer because it is slower or because it draws more power. The latent metrics the meter
records beside power (utilisation, clocks, memory) within the steady window, and the batch size,
then say in plain words what moved with it.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from typing import Any

from joulebench.figures import is_number, number_problem, rejection, work_unit
from joulebench.latents import STEADY
from joulebench.record import RunRecord
from joulebench.savings import relative_bound, saving
from jpwr.output import fmt, readable

# A latent metric "moved" when it changed by more than this fraction (utilisation: points, see _moved).
MOVED_FRACTION = 0.05
MOVED_UTILISATION_POINTS = 0.03


@dataclasses.dataclass(frozen=True)
class Decomposition:
    """ΔE = time_term + power_term, exactly, for E = t·P."""

    t1: float
    p1: float
    t2: float
    p2: float

    @property
    def e1(self) -> float:
        return self.t1 * self.p1

    @property
    def e2(self) -> float:
        return self.t2 * self.p2

    @property
    def delta_e(self) -> float:
        return self.e2 - self.e1

    @property
    def time_term(self) -> float:
        return (self.t2 - self.t1) * (self.p1 + self.p2) / 2

    @property
    def power_term(self) -> float:
        return (self.p2 - self.p1) * (self.t1 + self.t2) / 2


def decompose(t1: float, p1: float, t2: float, p2: float) -> Decomposition:
    return Decomposition(t1, p1, t2, p2)


@dataclasses.dataclass(frozen=True)
class UnitCost:
    """One run's steady window per unit of work: time per unit (s) and mean accelerator power (W, all devices)."""

    label: str
    work_unit: str
    time_per_unit_s: float | None
    mean_power_w: float | None
    devices: int | None
    batch_size: float | None
    reason: str | None = None  # why the figures above are missing
    energy_bound: float | None = None  # the window energy's bound as a fraction of it (so also of energy per unit)

    @property
    def figures(self) -> tuple[float, float] | None:
        """(time per unit, mean power), or None when either is missing."""
        if self.time_per_unit_s is None or self.mean_power_w is None:
            return None
        return self.time_per_unit_s, self.mean_power_w

    @property
    def energy_per_unit_j(self) -> float | None:
        return None if self.figures is None else self.figures[0] * self.figures[1]


def batch_size(record: RunRecord) -> float | None:
    """The global batch size; None when missing or not a positive number (figures.record_problems says why)."""
    value = record.config.get("global_batch_size", record.metrics.get("global_batch_size"))
    return None if value is None or number_problem("batch", value) else float(value)


def device_count(record: RunRecord) -> int | None:
    devices = record.metrics.get("devices", record.config.get("devices", record.hardware.get("devices")))
    return int(devices) if is_number(devices) and number_problem("devices", devices, whole=True) is None else None


def unit_cost(record: RunRecord, label: str) -> UnitCost:
    """Time per unit and mean power of the steady window; None with a reason when either is missing, or when a
    figure of the record cannot be true (joulebench.figures): such a run is never ranked or compared."""
    unit = work_unit(record)
    window = record.window(STEADY)
    cost = functools.partial(UnitCost, label=label, work_unit=unit, devices=device_count(record),
                             batch_size=batch_size(record))
    rejected = rejection(record)
    if rejected:
        return cost(time_per_unit_s=None, mean_power_w=None, reason=rejected)
    if window is None or window.duration_s <= 0:
        return cost(time_per_unit_s=None, mean_power_w=None, reason=f"no {STEADY!r} window")
    work = window.work.get(unit)
    time_per_unit = window.duration_s / work if work else None
    energy = window.energy
    # Mean power over this same window (not the sampler's span, which on several nodes can be a hair longer),
    # so that time per unit × power is exactly the window's energy per unit.
    power = energy.energy_j / window.duration_s if energy is not None and energy.energy_j is not None else None
    reason = None
    if time_per_unit is None:
        reason = f"no {unit} counted in the {STEADY!r} window"
    elif power is None:
        why = energy.unavailable_reason if energy else record.metrics.get("energy_unavailable_reason")
        reason = f"energy n/a: {why or 'not measured'}"
    return cost(time_per_unit_s=time_per_unit, mean_power_w=power, reason=reason,
                energy_bound=relative_bound(energy.energy_j, energy.error_bound_j) if energy is not None else None)


# How each latent metric reads in a sentence: label, scale to display unit, unit text.
LATENT_WORDS: dict[str, tuple[str, float, str]] = {
    "utilization_gpu": ("GPU utilisation", 100.0, "%"),
    "sm_clock_hz": ("SM clock", 1e-6, " MHz"),
    "memory_clock_hz": ("memory clock", 1e-6, " MHz"),
    "memory_used_bytes": ("device memory used", 1 / 1024**3, " GiB"),
    "utilization_memory": ("memory-busy time", 100.0, "%"),
    "temperature_c": ("temperature", 1.0, " °C"),
    "throttled_fraction": ("share of samples with a throttle reason", 100.0, "%"),
    "power_limit_w": ("power limit", 1.0, " W"),
}


def _moved(name: str, a: float, b: float) -> bool:
    if name in ("utilization_gpu", "utilization_memory", "throttled_fraction"):
        return abs(b - a) > MOVED_UTILISATION_POINTS
    scale = max(abs(a), abs(b))
    return scale > 0 and abs(b - a) / scale > MOVED_FRACTION


def _change_words(label: str, a: float, b: float, scale: float, unit: str) -> str:
    verb = "rose" if b > a else "fell"
    return f"{label} {verb} from {readable(a * scale)}{unit} to {readable(b * scale)}{unit}"


def latent_changes(a: Mapping[str, float], b: Mapping[str, float], cost_a: UnitCost,
                   cost_b: UnitCost) -> tuple[list[str], list[str]]:
    """Plain words for what moved between run A and run B, and for what stayed."""
    moved, steady = [], []
    for name, (label, scale, unit) in LATENT_WORDS.items():
        if name not in a or name not in b:
            continue
        if _moved(name, a[name], b[name]):
            moved.append(_change_words(label, a[name], b[name], scale, unit))
        else:
            steady.append(f"{label} {readable(b[name] * scale)}{unit}")
    for label, va, vb in (("batch size", cost_a.batch_size, cost_b.batch_size),
                          ("device count", cost_a.devices, cost_b.devices)):
        if va is not None and vb is not None and va != vb:
            moved.append(_change_words(label, float(va), float(vb), 1.0, ""))
    return moved, steady


def percent(fraction: float | None) -> str:
    """A fraction (energy coverage) as a percentage with 4 digits, 99.95 rather than 0.9995: read by people."""
    return fmt(None if fraction is None else 100 * fraction, 4)


def _seconds(value: float) -> str:
    """Time per unit in s, ms or µs (a token takes microseconds)."""
    for scale, unit in ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs")):
        if abs(value) >= scale:
            return f"{readable(value / scale)} {unit}"
    return f"{readable(value * 1e9)} ns"


def _pct(part: float, whole: float) -> str:
    return "n/a" if whole == 0 else f"{100 * part / whole:.0f}%"


@dataclasses.dataclass
class Diagnosis:
    """The comparison of two runs: the per-unit decomposition (None when energy is missing) and its words."""

    a: UnitCost
    b: UnitCost
    decomposition: Decomposition | None
    latents_a: dict[str, float]
    latents_b: dict[str, float]
    sentences: list[str]

    def text(self) -> str:
        return "\n".join(self.sentences)

    def to_dict(self) -> dict[str, Any]:
        d = self.decomposition
        return {
            "a": dataclasses.asdict(self.a), "b": dataclasses.asdict(self.b),
            "energy_per_unit_j": [self.a.energy_per_unit_j, self.b.energy_per_unit_j],
            "delta_energy_per_unit_j": None if d is None else d.delta_e,
            "time_term_j": None if d is None else d.time_term, "power_term_j": None if d is None else d.power_term,
            "latents_a": self.latents_a, "latents_b": self.latents_b, "sentences": self.sentences,
        }


def diagnose(a: UnitCost, b: UnitCost, latents_a: Mapping[str, float] | None = None,
             latents_b: Mapping[str, float] | None = None) -> Diagnosis:
    """Compare run B with run A per unit of work and say in words where the joules went."""
    la, lb = dict(latents_a or {}), dict(latents_b or {})
    if a.work_unit != b.work_unit:
        sentences = [f"{a.label} counts {a.work_unit} and {b.label} counts {b.work_unit}: "
                     "energy per unit cannot be compared"]
        return Diagnosis(a, b, None, la, lb, sentences)
    figures_a, figures_b = a.figures, b.figures
    if figures_a is None or figures_b is None:
        sentences = [f"{c.label}: energy per {c.work_unit[:-1]} n/a ({c.reason})" for c in (a, b) if c.figures is None]
        return Diagnosis(a, b, None, la, lb, sentences + _latent_sentences(la, lb, a, b))
    d = decompose(*figures_a, *figures_b)
    unit = a.work_unit[:-1]  # "token", "image"
    scale, unit_e = _energy_scale(max(abs(d.e1), abs(d.e2)))
    figures = f"{readable(d.e1 * scale)} → {readable(d.e2 * scale)} {unit_e} per {unit}, {_signed_pct(d.e2, d.e1)}"
    difference = saving(d.e1, a.energy_bound, d.e2, b.energy_bound) if d.e1 > 0 else None
    bound = "bound n/a" if difference is None or difference.bound is None else f"bound ±{100 * difference.bound:.2f}%"
    if difference is not None and difference.beyond_bounds:
        relation = "more" if d.delta_e > 0 else "less"
        head = (f"{b.label} uses {readable(abs(d.delta_e) * scale)} {unit_e} {relation} per {unit} than {a.label} "
                f"({figures}; beyond the runs' combined {bound}).")
    else:  # a difference the meter cannot stand behind is named neither a saving nor a cost
        head = f"{b.label} and {a.label} use the same energy per {unit} within bounds ({figures}; {bound})."
    sentences = [
        head,
        f"Time per {unit} {_words_change(d.t1, d.t2)} ({_seconds(d.t1)} → {_seconds(d.t2)}): "
        f"{_signed(d.time_term * scale)} {unit_e} of the difference.",
        f"Mean accelerator power {_words_change(d.p1, d.p2)} ({fmt(d.p1, 4)} → {fmt(d.p2, 4)} W, all devices): "
        f"{_signed(d.power_term * scale)} {unit_e} of the difference.",
        _dominant(d),
    ]
    return Diagnosis(a, b, d, la, lb, sentences + _latent_sentences(la, lb, a, b))


def _latent_sentences(la: Mapping[str, float], lb: Mapping[str, float], a: UnitCost, b: UnitCost) -> list[str]:
    moved, steady = latent_changes(la, lb, a, b)
    sentences = []
    if moved:
        sentences.append("Moved between the runs: " + "; ".join(moved) + ".")
    if steady:
        sentences.append(f"Stayed about the same (as in {b.label}): " + "; ".join(steady) + ".")
    lacking = [cost.label for cost, latents in ((a, la), (b, lb)) if not latents]
    if lacking:
        sentences.append(f"No trace of the steady window for {' and '.join(lacking)}: latent metrics not compared.")
    return sentences


def _energy_scale(magnitude: float) -> tuple[float, str]:
    """J for per-image figures, mJ for per-token ones: keep the numbers readable."""
    if magnitude >= 1:
        return 1.0, "J"
    if magnitude >= 1e-3:
        return 1e3, "mJ"
    return 1e6, "µJ"


def _signed(value: float) -> str:
    return ("+" if value >= 0 else "−") + readable(abs(value))


def _signed_pct(new: float, old: float) -> str:
    if old == 0:
        return "n/a"
    change = 100 * (new - old) / old
    return f"{'+' if change >= 0 else '−'}{abs(change):.1f}%"


def _words_change(old: float, new: float) -> str:
    if old == new:
        return "did not change"
    return f"{'rose' if new > old else 'fell'} by {_signed_pct(new, old).lstrip('+−')}"


def _dominant(d: Decomposition) -> str:
    if d.delta_e == 0:
        return "The energy per unit is the same."
    time_share, power_share = d.time_term / d.delta_e, d.power_term / d.delta_e
    if time_share >= 0 and power_share >= 0:
        which = "time" if time_share >= power_share else "power"
        return (f"Both time and power push the same way; {which} explains more "
                f"(time {_pct(d.time_term, d.delta_e)}, power {_pct(d.power_term, d.delta_e)}).")
    winner, loser = ("time", "power") if time_share > 0 else ("power", "time")
    return (f"The {winner} change decides it; the {loser} change works against it "
            f"(time {_pct(d.time_term, d.delta_e)}, power {_pct(d.power_term, d.delta_e)} of the difference).")
