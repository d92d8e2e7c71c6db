"""Which compiled decode variant a batch shape runs (`--objective speed|energy|edp`): the choice the static engine
makes itself at set-up, from each variant's replayed step time and, where a sensor is metered, its mean power.

Measured on one H100 (docs/BENCHMARKS.md): the faster variant is not always the cheaper one; llama-1b at batch 1
runs 10 % faster with inductor's default variant at 26 % more energy per token than with coordinate-descent tuning.
So the engine ranks the variants by the objective asked for: `speed` the step time (the default, as before),
`energy` the energy per step (time × mean power), `edp` energy × time. A variant's power is the meter's mean over
the last POWER_SPAN_S of POWER_REPLAY_S seconds of back-to-back replays (longer than an H100's one-second power
average, so the span holds that variant alone). Without a sensor (no sampler, or the CPU) every power is n/a and
an energy or edp objective falls back to speed, saying so in the record.

The variants themselves are declared here (DECODE_TUNINGS, torch-free: `--decode-tuning`'s choices come from it):
inductor's options for the compiled pieces, whether a variant runs the fused batch-1 kernels
(llm_inference/fused_decode.py). `auto` times every one (a new variant joins only once measured on an H100).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, Protocol

OBJECTIVES = ("speed", "energy", "edp")


@dataclasses.dataclass(frozen=True)
class DecodeVariant:
    """One `--decode-tuning` variant of the compact engines' decode step (torch-free: the option's choices come from
    here)."""

    options: dict[str, Any]  # inductor options of its compiled pieces (every shape the fused kernels do not cover)
    fused: bool = False  # Llama at batch 1 on one device: the fused Triton kernels (llm_inference/fused_decode.py)


DECODE_TUNINGS: dict[str, DecodeVariant] = {
    "default": DecodeVariant({}),
    "coordinate-descent": DecodeVariant({"coordinate_descent_tuning": True}),
    # timed by `auto` at batch 1 since measured on an H100 (docs/BENCHMARKS.md, issue 59): faster than both others
    # for llama-1b and -8b, and cheaper per token than coordinate-descent, which `auto` picked before
    "fused": DecodeVariant({}, fused=True),
}
DEFAULT_OBJECTIVE = "speed"  # the faster variant, as before --objective existed (docs/llm_inference.md says why)
POWER_REPLAY_S = 2.0  # seconds of replays per variant when its power is metered (set-up time, outside every window)
POWER_SPAN_S = 1.0  # the meter's mean over this last part of them

PowerProbe = Callable[[float], float | None]  # mean accelerator power over the last span_s seconds; None = n/a


class LiveMeter(Protocol):
    """What the probe needs of jpwr's WindowMeter (its live readings)."""

    @property
    def has_sampler(self) -> bool: ...

    def live(self, span_s: float, timeout_s: float = 10.0) -> Any: ...


def meter_probe(meter: LiveMeter) -> PowerProbe | None:
    """The node's mean accelerator power over a recent span from the run's sampler; None without a sampler."""
    if not meter.has_sampler:
        return None

    def probe(span_s: float) -> float | None:
        live = meter.live(span_s)
        return None if live is None else live.power_w

    return probe


@dataclasses.dataclass(frozen=True)
class Choice:
    """One batch shape's decode variant and why: each variant's replayed step (ms) and mean power (W, None = n/a)."""

    variant: str
    step_ms: dict[str, float]
    power_w: dict[str, float | None]
    basis: str  # the objective that decided, or why it could not (e.g. power n/a: by speed)


def energy_per_step_j(step_ms: float, power_w: float | None) -> float | None:
    return None if power_w is None else step_ms * power_w / 1e3


def choose(step_ms: Mapping[str, float], power_w: Mapping[str, float | None], objective: str) -> Choice:
    """The variant that the objective prefers; by speed where a needed power is n/a (the basis says so)."""
    if objective not in OBJECTIVES:
        raise ValueError(f"objective {objective!r} is none of {OBJECTIVES}")
    powers = {name: power_w.get(name) for name in step_ms}
    missing = [name for name, watts in powers.items() if watts is None]
    if objective == "speed" or missing:
        basis = "speed" if objective == "speed" else (
            f"speed ({objective} needs each variant's power; n/a for {', '.join(missing)}: no sensor metered)")
        return Choice(min(step_ms, key=step_ms.__getitem__), dict(step_ms), powers, basis)

    def score(name: str) -> float:
        joules = energy_per_step_j(step_ms[name], powers[name])
        assert joules is not None  # no power is missing here
        return joules if objective == "energy" else joules * step_ms[name]

    return Choice(min(step_ms, key=score), dict(step_ms), powers, objective)
