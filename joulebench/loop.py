"""The warm-up/steady training loop shared by llm_training and resnet50: named steps, two windows, a stop at a
step boundary that every rank agrees on.

    warm-up: --warmup-iterations steps, each timed after a device sync (they size a steady window sized by time)
    steady:  --iterations measured steps (or as many as the bound rule plans), never waiting for the device except
             at log points (the loss read-out) and at the window's edges

`--iterations` means measured steady iterations in every driver; the warm-up comes on top of it. The loop asks
the ranks whether to stop at each log point (one collective there), so a stop request never leaves ranks in
mismatched collectives and the steady window covers whole steps.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

from joulebench.exports.intervals import IntervalLog
from joulebench.lifecycle import StopRequest
from joulebench.sizing import SteadyPlan, StepTimer, fixed_plan, plan_steady, sized_by_time
from jpwr import WindowMeter
from jpwr.output import fmt

Handle = TypeVar("Handle")
STEP_TIMES_BASIS = "log intervals' mean step times"  # what LoopResult.step_times_s are (disturbance check)


@dataclasses.dataclass(frozen=True)
class LoopSpec:
    """What the loop needs to know of the run's configuration."""

    iterations: int | None  # measured steady iterations; None: sized by time (accelerators) or the CPU default
    warmup_iterations: int
    steady_seconds: float | None
    cpu_iterations: int  # the steady iterations of a CPU run without --iterations or --steady-seconds
    log_interval: int
    work_unit: str  # "tokens", "images"
    work_per_step: float  # work units of one step over all replicas


@dataclasses.dataclass
class TrainSteps(Generic[Handle]):
    """The driver's side of the loop: one step, the loss at a log point, a collective OR and gather."""

    step: Callable[[], Handle]  # one global batch; returns what loss() reads (a device tensor, not yet synced)
    loss: Callable[[Handle], float]  # the global mean loss (a collective at log points)
    any_rank: Callable[[bool], bool]  # True on every rank when any rank passes True (collective)
    gather: Callable[[object], Sequence[object]]  # every rank's object, in rank order (collective)
    sync: Callable[[], None] | None  # waits for the device; None on the CPU


@dataclasses.dataclass
class LoopResult:
    losses: list[tuple[int, float]]  # (step number, 1-based; global mean loss) at each log point
    completed: int = 0  # steps run, warm-up included
    planned: int | None = None  # steps planned, warm-up included (None: stopped before the plan)
    stop_reason: str | None = None  # why the loop ended before the planned steps
    plan: SteadyPlan | None = None
    # the steady window's mean step time between consecutive log points (the only synced moments in it), s
    step_times_s: list[float] = dataclasses.field(default_factory=list)
    first_step_s: float | None = None  # the first warm-up step, synced: tracing and compilation (None: no warm-up)


def steady_plan(spec: LoopSpec, device_kind: str) -> SteadyPlan | None:
    """The steady window's length when a count decides it; None when the warm-up is timed first."""
    if spec.iterations is not None:
        return fixed_plan(spec.iterations, "iterations", f"--iterations {spec.iterations}")
    if not sized_by_time(False, spec.steady_seconds, device_kind):
        return fixed_plan(spec.cpu_iterations, "cpu default",
                          f"CPU run: {spec.cpu_iterations} measured iterations (pass --steady-seconds or --iterations)")
    return None


class Progress:
    """Rank 0's progress lines: step, window, loss, recent rate, seconds per step and ETA of the whole loop."""

    def __init__(self, prefix: str, spec: LoopSpec, enabled: bool) -> None:
        self.prefix = prefix
        self.spec = spec
        self.enabled = enabled
        self._last = (0, time.monotonic())

    def log(self, step: int, loss: float, total: int | None) -> None:
        now = time.monotonic()
        last_step, last_t = self._last
        self._last = (step, now)
        if not self.enabled or step <= last_step:
            return
        per_step = (now - last_t) / (step - last_step)
        window = "warmup" if step <= self.spec.warmup_iterations else "steady"
        rate = self.spec.work_per_step / per_step if per_step > 0 else None
        eta = _format_eta(per_step * (total - step)) if total else "after warm-up"
        print(f"[{self.prefix}] step {step}/{total or '?'} ({window}) | loss {loss:.4f} | {fmt(rate, 5)} "
              f"{self.spec.work_unit}/s | {per_step:.3f} s/iter | ETA {eta}", flush=True)


def _format_eta(seconds: float) -> str:
    seconds = max(0, int(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def run_loop(steps: TrainSteps[Handle], meter: WindowMeter, spec: LoopSpec, stop: StopRequest, device_kind: str,
             progress: Progress, intervals: IntervalLog | None = None) -> LoopResult:
    """Warm-up then steady steps in their windows; a stop request ends the loop at the next log point, on all
    ranks. The steady plan (fixed, or sized by jpwr's bound rule from the timed warm-up) is the same everywhere.
    `intervals` (global rank 0 with --log-to): energy per log interval to the tools."""
    warmup = spec.warmup_iterations
    result = LoopResult(losses=[], plan=steady_plan(spec, device_kind))
    total = warmup + result.plan.iterations if result.plan else None
    timer = StepTimer(steps.sync)
    meter.begin("warmup" if warmup else "steady", 0)
    if intervals:
        intervals.begin(0)
    timer.tick()
    step = 0
    synced = (0, time.monotonic())  # the steady window's last synced step and when it was reached
    while total is None or step < total:
        if step == warmup and warmup:
            _end(meter, "warmup", 0, step, spec)
            result.first_step_s = timer.first_step_s
            if result.plan is None:
                step_s = timer.step_s or 0.0  # validation guarantees a timed warm-up step
                result.plan = plan_steady(meter, step_s, spec.steady_seconds, steps.gather)
                total = warmup + result.plan.iterations
            if progress.enabled:
                print(f"[{progress.prefix}] steady window: {result.plan.reason}", flush=True)
            meter.begin("steady", step)
            synced = (step, time.monotonic())
        handle = steps.step()
        step += 1
        if step <= warmup:
            timer.tick()
        if step % spec.log_interval and step != warmup and step != total:
            continue
        loss = steps.loss(handle)
        result.losses.append((step, loss))
        if step > warmup:
            now = time.monotonic()
            result.step_times_s.append((now - synced[1]) / (step - synced[0]))
            synced = (step, now)
        progress.log(step, loss, total)
        if (total is None or step < total) and steps.any_rank(stop.local_reason() is not None):
            result.stop_reason = stop.local_reason() or "another rank requested the stop"
            break
        if intervals and step != total:  # the loop's last interval ends after its window: no query time left out
            intervals.log_point(step)
    result.completed, result.planned = step, total
    if step <= warmup and warmup:  # stopped during warm-up: there is no steady window
        _end(meter, "warmup", 0, step, spec, f"stopped during warm-up: {result.stop_reason}")
    elif result.plan is not None:
        _end(meter, "steady", warmup, step, spec, result.plan.end_reason(step - warmup, result.stop_reason))
    if intervals:
        intervals.log_point(step, last=True)
    return result


def _end(meter: WindowMeter, name: str, first: int, step: int, spec: LoopSpec, reason: str | None = None) -> None:
    """Close a window; its work is every unit of every replica in its steps."""
    meter.end(name, step, work={spec.work_unit: (step - first) * spec.work_per_step}, reason=reason)
