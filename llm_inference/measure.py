"""One (task, batch size) point: warm-up, a prefill-only window, a full-generation window.

A batch's prefill takes milliseconds, far below the ~100 ms update period of GPU energy sensors,
so it cannot be metered call by call. The `prefill` window repeats prefill-only calls over the
point's batches for at least --min-window-s; the `steady` window runs full generations over the
same batches (whole passes) for at least as long. Decode energy is the steady window's energy
minus the prefill energy of the same number of passes (see metrics.py).

Before the windows, `engine.prepare` sets up the point's shapes (the static engine's KV cache and
CUDA-graph capture); its time is reported as `engine_setup_s`, outside every window.

Windows, in order: `warmup` (a prefill of each batch and --warmup-batches generations of up to 8 tokens:
allocator growth, kernel selection for every prompt shape; excluded from every headline figure),
`prefill`, `steady`. Each edge is taken after a device sync by WindowMeter.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

import torch

from joulebench.lifecycle import StopRequested
from jpwr import Window, WindowMeter
from llm_inference.engine import Engine, Timing
from llm_inference.tasks import Batch

# Warm-up generations stop after this many tokens: prefill and decode kernels are all chosen by then.
WARMUP_NEW_TOKENS = 8


@dataclasses.dataclass
class PointWindows:
    """The windows of one point and the per-call timings of its steady window."""

    warmup: Window
    prefill: Window
    steady: Window
    prefill_passes: int
    steady_passes: int
    timings: list[Timing]
    setup_s: float

    def pass_times_s(self) -> list[float]:
        """Each steady pass's generate time (first token and every gap after it, over its calls): the window's step
        times for the disturbance check, since every pass does the same work (a call's length differs by batch)."""
        calls = len(self.timings) // self.steady_passes if self.steady_passes else 0
        return [sum(t.ttft_s + sum(t.inter_token_s) for t in self.timings[i:i + calls])
                for i in range(0, calls * self.steady_passes, calls)] if calls else []


def _work(batches: list[Batch], passes: int, calls: int, generated: bool) -> dict[str, float]:
    """Work of whole passes over the batches; output tokens only for generate windows."""
    work: dict[str, float] = {
        "requests": passes * sum(b.size for b in batches),
        "input_tokens": passes * sum(b.input_tokens for b in batches),
        "calls": calls, "passes": passes,
    }
    if generated:
        work["output_tokens"] = passes * sum(b.output_tokens for b in batches)
        work["decode_tokens"] = passes * sum(b.size * (b.output_length - 1) for b in batches)
    return work


def _check_length(new_tokens: torch.Tensor, batch: Batch) -> None:
    if tuple(new_tokens.shape) != (batch.size, batch.output_length):
        raise RuntimeError(f"generate returned {tuple(new_tokens.shape)} new tokens, expected "
                           f"{(batch.size, batch.output_length)}: the forced output length did not hold")


def _stop_here(meter: WindowMeter, stop: Callable[[], str | None], name: str, step: int,
               work: dict[str, float]) -> None:
    """At a call boundary: when a stop was requested, close the open window there and end the point."""
    reason = stop()
    if reason:
        meter.end(name, step, work, reason=f"stopped after {step} calls: {reason}")
        raise StopRequested(f"{reason}: stopped cleanly in the {name} window after {step} calls")


def own_decision(go_on: bool) -> bool:
    """One process decides for itself whether a window goes on."""
    return go_on


def run_point(engine: Engine, meter: WindowMeter, batches: list[Batch], inputs: list[dict[str, torch.Tensor]],
              warmup_batches: int, min_window_s: float, stop: Callable[[], str | None],
              agree: Callable[[bool], bool] = own_decision) -> PointWindows:
    """Set-up, warm-up, then the prefill window, then the steady (generate) window; each window whole passes.
    `stop` is asked after every pass (and warm-up call): a requested stop ends the point there (StopRequested).
    `agree` turns this process's "the window goes on" into the one every rank acts on (tensor parallelism: rank
    0's, so that every rank runs the same calls; `stop` is then the ranks' common answer too)."""
    setup_s = engine.prepare(batches)
    meter.begin("warmup", 0)
    for item in inputs:
        engine.prefill(item)
    for call in range(warmup_batches):
        index = call % len(batches)
        engine.generate(inputs[index], min(batches[index].output_length, WARMUP_NEW_TOKENS))
        _stop_here(meter, stop, "warmup", call + 1, {"calls": call + 1 + len(inputs)})
    warmup = meter.end("warmup", warmup_batches, {"calls": warmup_batches + len(inputs)})

    meter.begin("prefill", 0)
    started, passes = time.monotonic(), 0
    while passes == 0 or agree(time.monotonic() - started < min_window_s):
        for item in inputs:
            engine.prefill(item)
        engine.sync()
        passes += 1
        calls = passes * len(batches)
        _stop_here(meter, stop, "prefill", calls, _work(batches, passes, calls, False))
    prefill = meter.end("prefill", calls, _work(batches, passes, calls, False))

    meter.begin("steady", 0)
    started, steady_passes, timings = time.monotonic(), 0, []
    while steady_passes == 0 or agree(time.monotonic() - started < min_window_s):
        for batch, item in zip(batches, inputs, strict=True):
            new_tokens = engine.generate(item, batch.output_length)
            engine.sync()  # the step clock's events must be complete before they are read
            _check_length(new_tokens, batch)
            timings.append(engine.timing())
        steady_passes += 1
        calls = steady_passes * len(batches)
        _stop_here(meter, stop, "steady", calls, _work(batches, steady_passes, calls, True))
    steady = meter.end("steady", calls, _work(batches, steady_passes, calls, True))
    return PointWindows(warmup, prefill, steady, passes, steady_passes, timings, setup_s)
