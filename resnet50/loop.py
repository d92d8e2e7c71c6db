"""The framework-free training loop: warm-up and steady windows, progress lines, early exit.

The loop never waits for the device except at log points (loss read-out) and window edges,
so the steady window measures the device, not Python round trips.
"""

from __future__ import annotations

import dataclasses
import time

from joulebench.runcontrol import StopRequest
from joulebench.sizing import SteadyPlan, StepTimer, fixed_plan, plan_steady, sized_by_time
from jpwr import Window, WindowMeter, fmt
from resnet50.backend import Backend
from resnet50.config import CPU_ITERATIONS, TrainConfig

WORK_UNIT = "images"


@dataclasses.dataclass
class LoopResult:
    losses: list[tuple[int, float]]  # (step number, 1-based; global mean loss) at each log point
    completed: int = 0  # iterations run, warm-up included
    planned: int | None = None  # iterations planned, warm-up included (None: stopped before the plan)
    stop_reason: str | None = None  # why the loop ended before the planned iterations
    plan: SteadyPlan | None = None


class Progress:
    """Rank 0's progress lines: step, window, loss, recent images/s and ETA of the whole loop."""

    def __init__(self, config: TrainConfig, enabled: bool) -> None:
        self.config = config
        self.enabled = enabled
        self._last = (0, time.monotonic())

    def log(self, step: int, loss: float, total: int | None) -> None:
        now = time.monotonic()
        last_step, last_t = self._last
        self._last = (step, now)
        if not self.enabled or step <= last_step:
            return
        per_step = (now - last_t) / (step - last_step)
        phase = "warmup" if step <= self.config.warmup_iterations else "steady"
        rate = self.config.global_batch_size / per_step if per_step > 0 else None
        eta = f"{(total - step) * per_step:.0f} s" if total else "after warm-up"
        print(
            f"[resnet50] step {step}/{total or '?'} ({phase}) loss {loss:.4f} | {fmt(rate, 5)} img/s | "
            f"{per_step:.3f} s/iter | ETA {eta}",
            flush=True,
        )


def steady_plan(config: TrainConfig, device_kind: str) -> SteadyPlan | None:
    """The steady window's length when a count decides it; None when the warm-up is timed first."""
    if config.iterations is not None:
        return fixed_plan(config.iterations, "iterations", f"--iterations {config.iterations}")
    if not sized_by_time(False, config.steady_seconds, device_kind):
        return fixed_plan(CPU_ITERATIONS, "cpu default",
                          f"CPU run: {CPU_ITERATIONS} iterations (pass --steady-seconds or --iterations)")
    return None


def run_loop(backend: Backend, meter: WindowMeter, config: TrainConfig, stop: StopRequest, verbose: bool) -> LoopResult:
    """Run warm-up then steady steps; a stop request ends the loop at the next log point, on all ranks."""
    progress = Progress(config, verbose)
    warmup = config.warmup_iterations
    result = LoopResult(losses=[], plan=steady_plan(config, backend.device_kind))
    total = warmup + result.plan.iterations if result.plan else None
    timer = StepTimer(backend.sync)
    meter.begin("warmup" if warmup else "steady", 0)
    timer.tick()
    step = 0
    while total is None or step < total:
        if step == warmup and warmup:
            _end(meter, "warmup", 0, step, config)
            if result.plan is None:
                step_s = timer.step_s or 0.0  # validation guarantees a timed warm-up step
                result.plan = plan_steady(meter, step_s, config.steady_seconds, backend.gather)
                total = warmup + result.plan.iterations
            if verbose:
                print(f"[resnet50] steady window: {result.plan.reason}", flush=True)
            meter.begin("steady", step)
        handle = backend.train_step()
        step += 1
        if step <= warmup:
            timer.tick()
        if step % config.log_interval and step != warmup and step != total:
            continue
        loss = backend.loss_value(handle)
        result.losses.append((step, loss))
        progress.log(step, loss, total)
        if (total is None or step < total) and backend.any_rank(stop.local_reason() is not None):
            result.stop_reason = stop.local_reason() or "another rank requested the stop"
            break
    result.completed, result.planned = step, total
    if step <= warmup and warmup:  # stopped during warm-up: there is no steady window
        _end(meter, "warmup", 0, step, config, f"stopped during warm-up: {result.stop_reason}")
    else:
        steps = step - warmup
        reason = result.plan.end_reason(steps, result.stop_reason)  # type: ignore[union-attr]
        _end(meter, "steady", warmup, step, config, reason)
    return result


def _end(meter: WindowMeter, name: str, first: int, step: int, config: TrainConfig,
         reason: str | None = None) -> Window:
    """Close a window; its work is every image of every replica in its steps."""
    return meter.end(name, step, work={WORK_UNIT: float((step - first) * config.global_batch_size)}, reason=reason)
