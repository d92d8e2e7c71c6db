"""The framework-free training loop: warm-up and steady windows, progress lines, early exit.

The loop never waits for the device except at log points (loss read-out) and window edges,
so the steady window measures the device, not Python round trips.
"""

from __future__ import annotations

import dataclasses
import time

from joulebench.runcontrol import StopRequest
from jpwr.energy import Window
from jpwr.meter import WindowMeter
from jpwr.output import fmt
from resnet50.backend import Backend
from resnet50.config import TrainConfig

WORK_UNIT = "images"


@dataclasses.dataclass
class LoopResult:
    losses: list[tuple[int, float]]  # (step number, 1-based; global mean loss) at each log point
    completed: int = 0  # iterations run, warm-up included
    stop_reason: str | None = None  # why the loop ended before config.total_iterations


class Progress:
    """Rank 0's progress lines: step, window, loss, recent images/s and ETA of the whole loop."""

    def __init__(self, config: TrainConfig, enabled: bool) -> None:
        self.config = config
        self.enabled = enabled
        self._last = (0, time.monotonic())

    def log(self, step: int, loss: float) -> None:
        now = time.monotonic()
        last_step, last_t = self._last
        self._last = (step, now)
        if not self.enabled or step <= last_step:
            return
        per_step = (now - last_t) / (step - last_step)
        total = self.config.total_iterations
        phase = "warmup" if step <= self.config.warmup_iterations else "steady"
        rate = self.config.global_batch_size / per_step if per_step > 0 else None
        print(
            f"[resnet50] step {step}/{total} ({phase}) loss {loss:.4f} | {fmt(rate, 5)} img/s | "
            f"{per_step:.3f} s/iter | ETA {(total - step) * per_step:.0f} s",
            flush=True,
        )


def run_loop(backend: Backend, meter: WindowMeter, config: TrainConfig, stop: StopRequest, verbose: bool) -> LoopResult:
    """Run warm-up then steady steps; a stop request ends the loop at the next log point, on all ranks."""
    progress = Progress(config, verbose)
    result = LoopResult(losses=[])
    warmup = config.warmup_iterations
    meter.begin("warmup" if warmup else "steady", 0)
    step = 0
    while step < config.total_iterations:
        if step == warmup and warmup:
            _end(meter, "warmup", 0, step, config)
            meter.begin("steady", step)
        handle = backend.train_step()
        step += 1
        if step % config.log_interval and step != warmup and step != config.total_iterations:
            continue
        loss = backend.loss_value(handle)
        result.losses.append((step, loss))
        progress.log(step, loss)
        if step < config.total_iterations and backend.any_rank(stop.local_reason() is not None):
            result.stop_reason = stop.local_reason() or "another rank requested the stop"
            break
    result.completed = step
    if step <= warmup and warmup:
        _end(meter, "warmup", 0, step, config)  # stopped during warm-up: there is no steady window
    else:
        _end(meter, "steady", warmup, step, config)
    return result


def _end(meter: WindowMeter, name: str, first: int, step: int, config: TrainConfig) -> Window:
    """Close a window; its work is every image of every replica in its steps."""
    return meter.end(name, step, work={WORK_UNIT: float((step - first) * config.global_batch_size)})
