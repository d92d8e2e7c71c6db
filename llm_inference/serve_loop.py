"""The in-process engine as the load loop's executor (llm_inference/load_loop.py): each plan of the scheduler
carried out on the continuous engine as a step, stamped and logged.

* admission: arrived requests take free rows and are prefilled together as one step (prefill and decode interleave
  at step granularity: the running requests wait for that prefill, as in a server without chunked prefill); the
  requests that finished leave their rows;
* advance: the moves that lower the step's row bucket (the scheduler's), one decode step over every occupied row,
  then again the finished requests leave;
* a window edge, and an iteration where nothing ran, sync the device (an anchor for its stamps); with nothing to
  run the host waits for the next arrival (the device idles), asking the stop request at least every
  joulebench.waits.SLICE_S: a very low rate's gaps are long.
The host admits before every decode step. It stays at most LOOKAHEAD steps ahead of the device (it waits for
the end of the step that many steps back), so admission decisions are at most that many steps late.

Every step is stamped at its start and end (CUDA events on GPUs, the monotonic clock on CPUs) and logged with
its work: prefill tokens, decoded rows, the rows it computed (a decode step's row bucket), the requests moved down
before it, attended cache positions, and which requests took part. The stamps become
the node's monotonic time at the end, through synced edges (jpwr.DeviceEventStamps), so steps, request times
and the energy counter share one clock.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch

from joulebench.requests_table import StepKind
from joulebench.waits import StopCheck, wait_until
from jpwr.phases import DeviceEventStamps, HostStamps
from llm_inference.arrivals import Request
from llm_inference.continuous_engine import ContinuousEngine
from llm_inference.load_config import ADMIT_DIVISOR
from llm_inference.load_loop import LoadEnd, run_load
from llm_inference.scheduler import DecodePlan, PrefillPlan, Scheduler
from llm_inference.window_rules import WindowRule

LOOKAHEAD = 8  # decode steps the host may run ahead of the device


@dataclasses.dataclass
class StepEntry:
    kind: StepKind
    begin: int  # index into the stamps
    end: int
    members: list[int]  # request ids
    amounts: list[int]  # per member: prefill tokens (prefill) or attended KV tokens (decode)
    computed_rows: int  # a decode step's row bucket (occupied rows and empty ones below its top); a prefill's requests
    moved: int = 0  # requests moved down (their cache rows copied) right before this step


@dataclasses.dataclass
class ServeLog:
    """What the loop did, on the node's monotonic clock (ns)."""

    step_kind: np.ndarray
    step_t0_ns: np.ndarray
    step_t1_ns: np.ndarray
    step_members: list[list[int]]
    step_amounts: list[list[int]]
    step_computed_rows: np.ndarray
    step_moved: np.ndarray
    arrival_ns: dict[int, int]
    admitted_ns: dict[int, int]
    first_token_ns: dict[int, int]
    finish_ns: dict[int, int]
    start_ns: int  # the load's time zero (arrival_s = 0)
    window: tuple[int, int] | None  # the measured window's edges, when it closed
    window_steps: tuple[int, int] | None  # steps [first, last) inside the window
    window_tokens: int  # output tokens produced inside the window
    produced: dict[int, int]  # output tokens per request
    stop_reason: str | None
    in_flight_at_end: int  # requests still running when the loop ended (a stop request)
    tokens: dict[int, list[int]] | None  # per request, with keep_tokens

    def members(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The steps' members as CSR: offsets (steps + 1), request ids and amounts (a prefill's prompt tokens, a
        decode's attended KV tokens), the form the request table stores and the per-request fit reads."""
        counts = [len(m) for m in self.step_members]
        return (np.cumsum([0, *counts]).astype(np.int64),
                np.array([m for ms in self.step_members for m in ms], dtype=np.int64),
                np.array([a for amounts in self.step_amounts for a in amounts], dtype=np.int64))


class StepClock:
    """The steps' stamps (device events on CUDA, host times on a CPU) and the synced edges that turn them into the
    node's monotonic time."""

    def __init__(self, engine: ContinuousEngine) -> None:
        self.engine = engine
        self.stamps: Any = DeviceEventStamps(torch) if engine.device.type == "cuda" else HostStamps()
        self.raw: list[Any] = []
        self.edges: list[tuple[int, int]] = []

    def stamp(self) -> int:
        self.raw.append(self.stamps.stamp())
        return len(self.raw) - 1

    def synced_edge(self) -> None:
        """Device idle, host time known: an anchor for turning device stamps into host time."""
        index = self.stamp()
        self.engine.sync()
        self.edges.append((index, time.monotonic_ns()))

    def wait_for(self, index: int) -> None:
        """The host waits for the device to pass stamp `index` (on CUDA; a CPU runs in order)."""
        if self.engine.device.type == "cuda":
            self.raw[index].synchronize()

    def host_times(self) -> list[int]:
        """Every stamp on the node's monotonic clock (ns); the device stamps are released."""
        times: list[int] = self.stamps.host_times(self.raw, self.edges)
        self.stamps.release(self.raw)
        return times


class ServeLoop:
    """One load run on the engine: the load loop with this engine as its executor (see the module docstring)."""

    def __init__(self, engine: ContinuousEngine, rows: int, prompt: Callable[[Request], torch.Tensor],
                 keep_tokens: bool = False, log: Callable[[str], None] = print, controlled: bool = False,
                 admit_divisor: int = ADMIT_DIVISOR) -> None:
        """`controlled`: the controlled-split window, where prefill and decode must not interleave (the scheduler's
        rules for it: full-size prefill steps back to back before the first decode step); `admit_divisor`: the
        scheduler's interleave under a backlog."""
        self.engine, self.prompt, self.log = engine, prompt, log
        self.scheduler = Scheduler(rows, controlled=controlled, admit_divisor=admit_divisor)
        self.clock = StepClock(engine)
        self.steps: list[StepEntry] = []
        self.keep_tokens = keep_tokens
        self.tokens: dict[int, list[int]] = {}
        self.first_token_host: dict[int, int] = {}  # host-side TTFT for the progress line only

    def run(self, requests: Iterator[Request], rule: WindowRule, on_begin: Callable[[], None],
            on_end: Callable[[float], None], stop: StopCheck, expected: int | None) -> ServeLog:
        """Serve `requests` with the load loop (llm_inference.load_loop.run_load); the log of its steps."""
        return self._serve_log(run_load(self, requests, rule, on_begin, on_end, stop, expected, self.log))

    # ---- the executor ------------------------------------------------------------------------------------
    def progress(self) -> int:
        return len(self.steps)

    def edge(self) -> None:
        self.clock.synced_edge()

    def admit(self, plan: PrefillPlan) -> None:
        begin = self.clock.stamp()
        self.engine.admit(plan.rows, [self.prompt(r) for r in plan.requests])
        end = self.clock.stamp()
        self.steps.append(StepEntry(StepKind.PREFILL, begin, end, [r.id for r in plan.requests],
                                    [r.input_tokens for r in plan.requests], len(plan.requests)))
        host_now = time.monotonic_ns()
        for request in plan.requests:
            self.first_token_host[request.id] = host_now
        self._collect_tokens(plan.rows, [r.id for r in plan.requests])
        self._release()

    def advance(self) -> bool:
        plan = self.scheduler.decode()
        if plan is None:
            return False
        self._decode(plan)
        return True

    def idle(self, until_s: float | None, stop: StopCheck) -> None:
        self.clock.synced_edge()
        if until_s is not None:
            wait_until(until_s, stop)

    def window_tokens(self, opened: tuple[int, int], end_ns: int) -> float:
        """One output token per member of every step since the window opened (a prefill gives the first)."""
        return sum(len(step.members) for step in self.steps[opened[0]:])

    def first_tokens_ns(self) -> dict[int, int]:
        return self.first_token_host

    # ---- steps -------------------------------------------------------------------------------------------
    def _decode(self, plan: DecodePlan) -> None:
        if plan.moves:
            self.engine.move(plan.moves)
        begin = self.clock.stamp()
        self.engine.step(plan.row_count, plan.attended)
        end = self.clock.stamp()
        self.steps.append(StepEntry(StepKind.DECODE, begin, end, plan.members, plan.amounts, plan.row_count,
                                    len(plan.moves)))
        self._collect_tokens(plan.rows, plan.members)
        self._release()
        if len(self.steps) > LOOKAHEAD:
            self.clock.wait_for(self.steps[-LOOKAHEAD - 1].end)

    def _collect_tokens(self, rows: list[int], members: list[int]) -> None:
        if not self.keep_tokens:
            return
        tokens = self.engine.next_tokens().tolist()  # a device read: only for correctness tests
        for row, member in zip(rows, members, strict=True):
            self.tokens.setdefault(member, []).append(tokens[row])

    def _release(self) -> None:
        finished = self.scheduler.release()
        if finished:
            self.engine.release(finished)

    def leave(self) -> None:
        """The requests still running leave their rows (a load that ended by a stop, such as the controlled window's
        decode part at its length): the engine's rows are free for the next load."""
        if self.scheduler.running:
            self.engine.release(sorted(self.scheduler.running))

    def produced(self) -> dict[int, int]:
        """Output tokens per request so far (one per step it took part in)."""
        counts: dict[int, int] = {}
        for step in self.steps:
            for member in step.members:
                counts[member] = counts.get(member, 0) + 1
        return counts

    def _serve_log(self, end: LoadEnd) -> ServeLog:
        times = self.clock.host_times()
        t0 = np.array([times[s.begin] for s in self.steps], dtype=np.int64)
        t1 = np.array([times[s.end] for s in self.steps], dtype=np.int64)
        admitted: dict[int, int] = {}
        first: dict[int, int] = {}
        finish: dict[int, int] = {}
        for index, step in enumerate(self.steps):
            for member in step.members:
                if step.kind is StepKind.PREFILL:
                    admitted[member], first[member] = int(t0[index]), int(t1[index])
                finish[member] = int(t1[index])
        return ServeLog(
            step_kind=np.array([s.kind for s in self.steps], dtype=np.int8), step_t0_ns=t0, step_t1_ns=t1,
            step_members=[s.members for s in self.steps], step_amounts=[s.amounts for s in self.steps],
            step_computed_rows=np.array([s.computed_rows for s in self.steps], dtype=np.int64),
            step_moved=np.array([s.moved for s in self.steps], dtype=np.int64),
            arrival_ns=end.arrival_ns, admitted_ns=admitted, first_token_ns=first, finish_ns=finish,
            start_ns=end.start_ns, window=end.window, window_steps=end.window_steps,
            window_tokens=int(end.window_tokens), produced=self.produced(), stop_reason=end.stop_reason,
            in_flight_at_end=end.in_flight_at_end, tokens=self.tokens if self.keep_tokens else None)
