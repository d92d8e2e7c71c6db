"""A serving run with planted per-token costs, metered by the production sampler through the fake pynvml.

A small continuous-batching scheduler (Poisson arrivals, a fixed number of slots; each loop admits the
waiting requests that fit into free slots, up to 8192 tokens, in one prefill step, else decodes every active
row) writes a WorkLog. Each step's dynamic energy is the planted model (e + a·prefill tokens in a prefill step,
b + c·rows + d·KV tokens in a decode step) times (1 + 3 % noise), on top of IDLE_W, which also runs
in the host gaps between steps and while no request is in the system. The schedule of constant-power pieces
becomes a tests/fakes/pynvml trace (counter updated every ~100 ms, jittered ±5 ms, exact integral) that the
real sampler reads every 20 ms; knots come from the trace as a driver gets them: jpwr.trace.load_trace, then
segment_fit.counter_knots.

Magnitudes (H100 SXM, Llama-3.1-8B, chosen to reproduce ML.ENERGY's 0.455 J/output token at 8 concurrent
requests and ~0.077 at 256 with these step times): a decode step reads the weights once (b = 2.5 J, 6 ms),
each row adds its GEMM share (c = 0.03 J, 40 µs) and attention reads 128 KiB of KV cache per attended token
(d = 2e-5 J, 40 ns); a prefill step reads the weights once too (e = 3 J per pass, 6 ms) and costs a = 0.02
J/token at 28.6k tokens/s (35 µs/token, ~640 W in all): 0.035 J/token for one 200-token prompt, 0.0204 for
an 8192-token admission, the bias a token-only prefill column would fit as a rate-dependent a.

A planted SM clock (`serve(clock_hz=..., alpha=...)`) scales each step's work energy by (f / F_MAX)^alpha and
is written into the log as each step's clock (what joulebench.card_state gives a recorded run's steps).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from joulebench.request_energy import WorkLog
from joulebench.segment_fit import counter_knots
from jpwr.clock import VirtualClock
from jpwr.sampler import Sampler, open_backends
from jpwr.trace import Knots, accelerator_domains, load_trace
from tests.analysis.synthetic_run import NS, POLL_S, Schedule, write_fake_trace

IDLE_W = 70.0
COSTS = {"prefill_tokens": 0.02, "prefill_steps": 3.0, "decode_steps": 2.5, "row_steps": 0.03, "kv_tokens": 2e-5}
HOST_GAP_S = 0.0003
NOISE = 0.03
MAX_PREFILL_TOKENS = 8192  # per prefill step (what fits one admission)
F_MAX = 1.98e9  # the planted clock's reference (an H100's highest SM clock)


def _duration(prefill: int, rows: int, kv: int) -> float:
    return 0.006 + 3.5e-5 * prefill if prefill else 0.006 + 4e-5 * rows + 4e-8 * kv


@dataclasses.dataclass
class _Engine:
    costs: dict[str, float]
    rng: np.random.Generator
    schedule: Schedule = dataclasses.field(default_factory=Schedule)
    steps: list[tuple[float, float, int, int, int, list[tuple[int, int, int]]]] = dataclasses.field(
        default_factory=list)
    clock_hz: Callable[[float], float] | None = None  # the planted SM clock at a time (s)
    alpha: float = 0.0

    def idle_until(self, t: float) -> None:
        if t > self.schedule.t:
            self.schedule.add(t - self.schedule.t, IDLE_W, None)

    def step(self, prefill: int, rows: int, kv: int, members: list[tuple[int, int, int]]) -> float:
        self.idle_until(self.schedule.t + HOST_GAP_S)
        seconds = _duration(prefill, rows, kv)
        work = (self.costs["prefill_steps"] + self.costs["prefill_tokens"] * prefill if prefill else
                self.costs["decode_steps"] + self.costs["row_steps"] * rows + self.costs["kv_tokens"] * kv)
        start = self.schedule.t
        if self.clock_hz is not None:
            work *= (self.clock_hz(start) / F_MAX) ** self.alpha
        self.schedule.add(seconds, IDLE_W + work * (1 + NOISE * self.rng.standard_normal()) / seconds, "step")
        self.steps.append((start, self.schedule.t, prefill, rows, kv, members))
        return self.schedule.t

    def log(self) -> WorkLog:
        members = [m for s in self.steps for m in s[5]]
        column = np.array([[s[0] * NS, s[1] * NS, s[2], s[3], s[4]] for s in self.steps])
        offsets = np.concatenate(([0], np.cumsum([len(s[5]) for s in self.steps])))
        log = WorkLog.of_steps(column[:, 0].astype(np.int64), column[:, 1].astype(np.int64), column[:, 2],
                               column[:, 3], column[:, 4], offsets, np.array([m[0] for m in members]),
                               np.array([m[1] for m in members]), np.array([m[2] for m in members]))
        if self.clock_hz is None:
            return log
        return log.with_state(np.array([self.clock_hz(s[0]) for s in self.steps]), None)


def serve(seed: int, rate: float, requests: int, slots: int, costs: dict[str, float] | None = None,
          constant_mix: bool = False, clock_hz: Callable[[float], float] | None = None, alpha: float = 0.0
          ) -> tuple[WorkLog, np.ndarray, Schedule]:
    """Run the scheduler; `rate` requests/s (inf: all queued at the start); `clock_hz`, `alpha`: the planted
    clock and its exponent."""
    rng = np.random.default_rng(seed)
    engine = _Engine(costs or COSTS, rng, clock_hz=clock_hz, alpha=alpha)
    engine.idle_until(1.5)
    start = engine.schedule.t
    gaps = rng.exponential(1 / rate, requests) if np.isfinite(rate) else np.zeros(requests)
    arrival = start + np.cumsum(gaps)
    inputs = rng.integers(64, 1024, requests)
    outputs = rng.integers(16, 256, requests)
    if constant_mix:
        inputs[:], outputs[:] = 64, 4
    finish = np.zeros(requests)
    waiting, active = 0, {}  # active: id -> [length so far, tokens still to decode]
    while waiting < requests or active:
        now = engine.schedule.t
        admit = []
        while (waiting < requests and arrival[waiting] <= now and len(active) + len(admit) < slots
               and (not admit or inputs[admit].sum() + inputs[waiting] <= MAX_PREFILL_TOKENS)):
            admit.append(waiting)
            waiting += 1
        if admit:
            end = engine.step(int(inputs[admit].sum()), 0, 0, [(i, int(inputs[i]), 0) for i in admit])
            active.update({i: [int(inputs[i]), int(outputs[i]) - 1] for i in admit})
            for i in [i for i in admit if active[i][1] == 0]:
                finish[i] = end
                del active[i]
        elif active:
            ids = sorted(active)
            kv = [active[i][0] for i in ids]
            end = engine.step(0, len(ids), sum(kv), [(i, 0, k) for i, k in zip(ids, kv, strict=True)])
            for i in ids:
                active[i][0] += 1
                active[i][1] -= 1
                if active[i][1] == 0:
                    finish[i] = end
                    del active[i]
        else:
            engine.idle_until(arrival[waiting])
    engine.idle_until(engine.schedule.t + 2.0)
    lifetimes = np.column_stack([np.arange(requests), arrival * NS, finish * NS])
    return engine.log(), lifetimes, engine.schedule


def meter(schedule: Schedule, directory: Path, pynvml: Any, seed: int) -> list[Knots]:
    """The schedule through the fake GPU and the real sampler (20 ms reads); the trace's counter knots."""
    clock = VirtualClock()
    pynvml.configure(write_fake_trace(schedule, directory / "fake", seed), clock, call_costs=True, origin_ns=0)
    try:
        backends, discoveries = open_backends(["nvml"], clock, strict=True)
        sampler = Sampler(backends, discoveries, directory / "jpwr", POLL_S, POLL_S, clock=clock, run_id="serving",
                          node="n1", background=False).start()
        end_ns, poll_ns, tick = int(schedule.pieces[-1].t1 * NS), int(POLL_S * NS), 0
        while tick * poll_ns < end_ns:
            if clock.monotonic_ns() <= tick * poll_ns:
                clock.set_ns(tick * poll_ns)
                sampler.poll_once(tick)
            tick += 1
        sampler.stop()
    finally:
        pynvml.reset()
    trace = load_trace(directory / "jpwr" / "n1")
    return counter_knots(trace, accelerator_domains(trace.domains)[0])



def fixed_batches(seed: int, rows: int, prompt: int, decodes: int, seconds: float) -> tuple[WorkLog, Schedule]:
    """Batches of `rows` requests of `prompt` tokens back to back for about `seconds`: each batch prefilled in one
    step, then decoded for `decodes` steps. Every step of a kind has the same size, so each of the run's columns is
    a fixed multiple of its step count (the attended KV tokens nearly): one such run cannot tell any of its costs
    apart, two of different sizes can."""
    engine = _Engine(COSTS, np.random.default_rng(seed))
    engine.idle_until(1.5)
    batch = 0
    while engine.schedule.t < 1.5 + seconds:
        ids = range(batch * rows, (batch + 1) * rows)
        engine.step(rows * prompt, 0, 0, [(i, prompt, 0) for i in ids])
        for j in range(decodes):
            engine.step(0, rows, rows * (prompt + j), [(i, 0, prompt + j) for i in ids])
        batch += 1
    engine.idle_until(engine.schedule.t + 2.0)
    return engine.log(), engine.schedule
