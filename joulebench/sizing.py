"""How many iterations the steady window gets: decided before it opens, from the sensor and the warm-up.

Driver policy, not the meter's job: the meter publishes its live readings (`WindowMeter.live`) and its
estimator's bound terms; this module turns them into a window length every driver uses.

The rule on accelerators (one place, every driver): the window lasts at least

    D = max(30 s, 30 sensor update periods, the length at which the planned bound is ≤ 0.5 % of its energy)

and at most 5 minutes, as a whole number of iterations N = ceil(D / step time). The planned bound is
the estimator's own edge terms (`jpwr.planned_bound_j`: about P_edge·T per edge, two edges),
the energy is P_mean·D, so the bound term asks for D ≥ 2·T·P_edge / (0.005·P_mean): 40 s at T = 100 ms
and a flat power curve. T, P_edge (the highest recent power reading) and P_mean come from the node's
sampler (`WindowMeter.live`) at the end of the warm-up; the step time is the warm-up's (median of its steps
after the first). Rank 0 decides and every rank gets its plan, so all ranks run the same iterations.
If the loop's period could alias with the sensor's, N grows until the loop drifts through every
sensor phase (within the 5 minutes), unless the user asked for the length (--steady-seconds): that length is
kept, and the plan names the risk and its remedy (the estimator then widens the bound of a window that aliases).
The test runs over every step time the steady window may show, not only the warm-up's: the warm-up syncs after
every step on a cooler card, and the steady step differs from it by more than the aliasing test's resolution (T/N,
1.6 ms for 63 steps of 0.8 s). Iteration counts given by the user win over all of this.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

from joulebench.arguments import SameMeaning
from joulebench.record_shape import checked_block
from joulebench.record_types import SteadyPlanBlock, WindowLengthBlock
from jpwr import NodeLive, ValidationError
from jpwr.arguments import SECONDS
from jpwr.estimator import aliasing_warning, planned_bound_j

if TYPE_CHECKING:  # only the type: sizing is imported by the drivers' parsers, before any meter is opened
    from jpwr import WindowMeter

TARGET_BOUND_FRACTION = 0.005
MIN_UPDATE_PERIODS = 30
MIN_SECONDS = 30.0
MAX_SECONDS = 300.0
ASSUMED_UPDATE_S = 0.1  # NVIDIA's and AMD's counters refresh about every 100 ms; used only without a sampler
# How far the steady window's mean step may lie from the warm-up's median, relative. Measured on an H100
# (GPT-800M, two default runs, 2026-11-27): the steady mean 0.45 % and 0.72 % above the warm-up's median,
# its log intervals 1 % apart as the card heated. The aliasing test needs the step to T/N (0.2 % here).
STEP_UNCERTAINTY = 0.01


@dataclasses.dataclass(frozen=True)
class SteadyPlan:
    """The steady window's length in iterations and what decided it."""

    iterations: int
    rule: str  # "iterations", "steady-seconds", "bound", "update periods", "minimum", "maximum", "cpu default"
    reason: str
    seconds: float | None = None  # the length aimed at; None when a count decided
    step_s: float | None = None
    update_period_s: float | None = None
    update_period_source: str | None = None  # "sampler" or "assumed (no sampler)"
    edge_power_w: float | None = None
    mean_power_w: float | None = None
    predicted_bound_fraction: float | None = None
    aliasing: str | None = None  # the estimator's warning for the warm-up's step over the planned count
    # why a steady step near a multiple of the sensor period may still alias (the cap, or a step too regular
    # for any length), and the remedy; None when every step within STEP_UNCERTAINTY of the warm-up's drifts
    aliasing_risk: str | None = None

    def to_dict(self) -> SteadyPlanBlock:
        return checked_block(SteadyPlanBlock, dataclasses.asdict(self), "meter.steady_plan")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SteadyPlan:
        return cls(**dict(data))

    def end_reason(self, steps: int, stopped: str | None = None) -> str:
        """Why the steady window ended: its planned length, or a stop request before it."""
        if stopped:
            return f"stopped after {steps} of {self.iterations} planned iterations: {stopped}"
        return f"planned length reached: {steps} iterations ({self.reason})"


def fixed_plan(iterations: int, rule: str, reason: str) -> SteadyPlan:
    """A count chosen without timing: the user's --iterations, or the CPU default."""
    return SteadyPlan(iterations, rule, reason)


@dataclasses.dataclass(frozen=True)
class WindowLength:
    """The seconds a steady window aims at, the rule that set them and the sensor facts used."""

    seconds: float
    rule: str
    update_period_s: float
    update_period_source: str
    edge_power_w: float | None
    mean_power_w: float | None

    @property
    def power_ratio(self) -> float:
        """P_edge / P_mean: how much more than average the window's edges may cost (1 when unknown)."""
        return self.edge_power_w / self.mean_power_w if self.edge_power_w and self.mean_power_w else 1.0

    def to_dict(self) -> WindowLengthBlock:
        return checked_block(WindowLengthBlock, dataclasses.asdict(self), "meter.steady_seconds")

    def bound_fraction(self, seconds: float) -> float:
        """Planned bound over planned energy for a window of `seconds`."""
        return planned_bound_j(self.power_ratio, self.update_period_s) / seconds

    def describe(self, explicit: float | None = None) -> str:
        return {
            "steady-seconds": f"--steady-seconds {explicit or self.seconds:g}",
            "minimum": f"the {MIN_SECONDS:g} s minimum",
            "update periods": f"{MIN_UPDATE_PERIODS} sensor update periods of {self.update_period_s * 1e3:.0f} ms",
            "bound": f"planned bound <= {TARGET_BOUND_FRACTION:.1%} with a {self.update_period_s * 1e3:.0f} ms sensor",
            "maximum": f"the {MAX_SECONDS:g} s maximum (the bound target needs longer)",
        }[self.rule]


def window_length(live: NodeLive | None, seconds: float | None = None) -> WindowLength:
    """Seconds for the steady window: `seconds` when given, else the bound rule of this module's docstring."""
    update_s = live.update_period_s if live else None
    source = "sampler" if update_s else "assumed (no sampler)"
    update_s = update_s or ASSUMED_UPDATE_S
    edge_w, mean_w = (live.peak_power_w, live.power_w) if live else (None, None)
    facts = (update_s, source, edge_w, mean_w)
    if seconds is not None:
        return WindowLength(seconds, "steady-seconds", *facts)
    ratio = WindowLength(0.0, "", *facts).power_ratio
    candidates = {"minimum": MIN_SECONDS, "update periods": MIN_UPDATE_PERIODS * update_s,
                  "bound": planned_bound_j(ratio, update_s) / TARGET_BOUND_FRACTION}
    rule = max(candidates, key=candidates.__getitem__)
    if candidates[rule] > MAX_SECONDS:
        return WindowLength(MAX_SECONDS, "maximum", *facts)
    return WindowLength(candidates[rule], rule, *facts)


@dataclasses.dataclass(frozen=True)
class DriftLength:
    """The iterations after the aliasing rule, what it added to the reason, and the risk left."""

    iterations: int
    note: str
    risk: str | None


def _rule_covers(multiple: int, update_s: float) -> bool:
    """Whether the estimator's aliasing rule covers a loop of exactly `multiple` sensor periods per step (it
    leaves out steps much shorter than a period and steps spanning many): asked of the rule itself."""
    steps = 1000
    return aliasing_warning(steps * multiple * update_s, steps, update_s) is not None


def _nearest_multiple_gap(step_s: float, update_s: float) -> tuple[int, float] | None:
    """(m, gap): the multiple m·T the aliasing rule covers that lies nearest the steps within
    STEP_UNCERTAINTY of `step_s`, and its distance from them (0 when one of them is m·T); None when none does."""
    low, high = step_s * (1 - STEP_UNCERTAINTY), step_s * (1 + STEP_UNCERTAINTY)
    multiples = [m for m in range(round(low / update_s), round(high / update_s) + 1) if _rule_covers(m, update_s)]
    gaps = [(m, max(0.0, low - m * update_s, m * update_s - high)) for m in multiples]
    return min(gaps, key=lambda pair: pair[1]) if gaps else None


def drift_length(step_s: float, update_s: float, iterations: int, cap_s: float, cap: str) -> DriftLength:
    """Lengthen the window so that any steady step near the warm-up's drifts through every sensor phase.

    A step δ off a multiple of T walks once around the sensor's phases in ⌊T/|δ|⌋+1 steps (the estimator's
    aliasing rule). δ is taken at its smallest over the steps the steady window may show; where that needs
    more than `cap_s`, or δ may be 0, the window takes the longest count within the cap and says which steps
    it still cannot cover. `cap`: why the window may not be longer, for that sentence.
    """
    nearest = _nearest_multiple_gap(step_s, update_s)
    if nearest is None:
        return DriftLength(iterations, "", None)
    multiple, gap = nearest
    needed = math.floor(update_s / gap) + 1 if gap > 1e-9 * update_s else None
    if needed is not None and needed <= iterations:
        return DriftLength(iterations, "", None)
    slowest = step_s * (1 + STEP_UNCERTAINTY)
    near = f"{multiple} × {update_s * 1e3:.0f} ms sensor updates"
    if needed is not None and needed * slowest <= cap_s:
        return DriftLength(needed, f", lengthened to {needed} so that a steady step within {STEP_UNCERTAINTY:.0%} "
                                   f"of the warm-up's drifts through every sensor phase (nearest: {near})", None)
    longest = max(iterations, math.floor(cap_s / slowest))
    blind = f"within {update_s / longest * 1e3:.2g} ms of {near}"
    why = "the step may match them exactly" if needed is None else f"drift needs {needed} steps"
    risk = (f"a steady step {blind} cannot drift through every sensor phase in {longest} steps ({why}; {cap}): "
            "if the steady step lands there, the estimator flags the window and widens its bound for aliasing; "
            "remedy: move the step time off the multiple (e.g. another batch size) or pass a longer --steady-seconds")
    if longest == iterations:
        return DriftLength(iterations, f", not lengthened ({cap}) although a steady step {blind} would not drift "
                                       "through every sensor phase in it", risk)
    return DriftLength(longest, f", lengthened to {longest}, the longest within the cap, so that the loop drifts "
                                f"through every sensor phase unless its step lies {blind}", risk)


def plan_steady_window(step_s: float, live: NodeLive | None, seconds: float | None = None) -> SteadyPlan:
    """Iterations for a steady window of `seconds` (None: sized by the bound rule above), lengthened within the 5
    minutes where the loop could alias with the sensor (`drift_length`). Decision: a length the user asked for is
    kept, never lengthened (a 10 s first look once grew to 5 minutes); the plan's aliasing_risk says what that
    leaves, and the estimator widens the bound of a window that does alias."""
    if step_s <= 0:
        raise ValueError(f"step time {step_s} s is not positive")
    length = window_length(live, seconds)
    update_s = length.update_period_s
    cap_s, cap = ((length.seconds, f"--steady-seconds {length.seconds:g} was asked: the window keeps that length")
                  if seconds is not None else (MAX_SECONDS, f"the window is capped at {MAX_SECONDS:g} s"))
    drift = drift_length(step_s, update_s, max(1, math.ceil(length.seconds / step_s - 1e-9)), cap_s, cap)
    iterations = drift.iterations
    alias = aliasing_warning(iterations * step_s, iterations, update_s)
    fraction = length.bound_fraction(iterations * step_s)
    reason = (f"{iterations} × {step_s:.4g} s = {iterations * step_s:.1f} s for {length.describe(seconds)}"
              f"{drift.note}; planned bound {fraction:.2%} (update period {length.update_period_source})")
    return SteadyPlan(iterations, length.rule, reason, length.seconds, step_s, update_s, length.update_period_source,
                      length.edge_power_w, length.mean_power_w, fraction, alias, drift.risk)


def plan_steady(meter: WindowMeter, step_s: float, seconds: float | None = None,
                gather: Callable[[object], Sequence[object]] | None = None) -> SteadyPlan:
    """Size the steady window before it opens: rank 0 plans from its sampler's live readings and every rank
    gets that plan, so all ranks run the same iterations. Call on every rank (a collective when `gather` is
    given, e.g. torch's all_gather_object, and the run has several ranks)."""
    plan = None
    if meter.launch.rank == 0:
        live = meter.live(span_s=min(30.0, max(2.0, 3 * step_s)))
        plan = plan_steady_window(step_s, live, seconds).to_dict()
    plans = gather(plan) if gather is not None and meter.launch.world_size > 1 else [plan]
    return SteadyPlan.from_dict(cast(Mapping[str, Any], plans[0]))


class StepTimer:
    """Times warm-up steps, each after a device sync; the step time is the median after the first step.

    The first step carries compilation and allocator growth; the median of the rest ignores a later
    recompilation too. Warm-up is not measured, so the syncs cost nothing that is reported.
    """

    def __init__(self, sync: Callable[[], None] | None = None) -> None:
        self.sync = sync
        self._ticks: list[int] = []

    def tick(self) -> None:
        """Call once before the first warm-up step and after every warm-up step."""
        if self.sync is not None:
            self.sync()
        self._ticks.append(time.monotonic_ns())

    @property
    def first_step_s(self) -> float | None:
        """The first step alone (compilation, allocator growth); None before it ended."""
        return (self._ticks[1] - self._ticks[0]) / 1e9 if len(self._ticks) > 1 else None

    @property
    def step_s(self) -> float | None:
        steps = [(b - a) / 1e9 for a, b in itertools.pairwise(self._ticks)]
        if not steps:
            return None
        return statistics.median(steps[1:] or steps)


def steady_seconds_arg(text: str) -> float | None:
    """argparse type of --steady-seconds: 'auto' (None: sized by the bound rule) or positive seconds."""
    if text.strip().lower() == "auto":
        return None
    try:
        return SECONDS(text)
    except argparse.ArgumentTypeError as exc:
        raise argparse.ArgumentTypeError(f"{exc}, or 'auto'") from None


def add_window_arguments(group: argparse._ActionsContainer, cpu_default: str, aliases: tuple[str, ...] = (),
                         idle: bool = True) -> None:
    """--steady-seconds and (idle=True) --idle-baseline/--no-idle-baseline, worded the same in every driver."""
    # SameMeaning: an alias given beside --steady-seconds (llm_inference's --min-window-s) is refused, not dropped
    group.add_argument(
        "--steady-seconds", *aliases, dest="steady_seconds", type=steady_seconds_arg, default=None, metavar="S|auto",
        action=SameMeaning, keep="--steady-seconds alone",
        help=f"length of the steady window in seconds, grown to whole iterations and decided before it opens from "
             f"the warm-up's step time (default auto: on accelerators long enough that the planned energy bound is "
             f"<= {TARGET_BOUND_FRACTION * 100:.1f}%% and >= {MIN_UPDATE_PERIODS} sensor updates, {MIN_SECONDS:g} s to "
             f"{MAX_SECONDS:g} s; {cpu_default}). An explicit iteration count wins [{SECONDS.describe()}, or auto]")
    if not idle:
        return
    group.add_argument(
        "--idle-baseline", action=argparse.BooleanOptionalAction, default=True,
        help="before the first window, wait until the devices have cooled down (bounded) and meter a few seconds "
             "of idle power; every window's energy is then split into idle and dynamic parts (default on)")


def sized_by_time(iterations_given: bool, steady_seconds: float | None, device: str) -> bool:
    """Whether the steady window's length comes from timing the warm-up (not from a count).

    A count decides when the user gave one, and on the CPU unless --steady-seconds was given (CPU runs
    are smoke tests and CI: a fixed, small count keeps them fast). `device` is "cpu", "cuda" or "auto".
    """
    return not iterations_given and not (device == "cpu" and steady_seconds is None)


def check_warmup_for_timing(warmup_iterations: int, iterations_given: bool, steady_seconds: float | None,
                            device: str) -> None:
    """A window sized by time needs at least one warm-up step to time."""
    if sized_by_time(iterations_given, steady_seconds, device) and warmup_iterations < 1:
        raise ValidationError(
            f"--warmup-iterations {warmup_iterations} with a steady window sized by time (the step time is "
            "measured in the warm-up)",
            "pass --warmup-iterations 2 or more, or a fixed iteration count (--iterations N)")
