"""The load loop: requests arrive on the host's clock, wait for a request row, are prefilled, decode until done.

One iteration of the loop, on the host, each decision the scheduler's (llm_inference/scheduler.py: rows, admission,
compaction), each plan carried out on the engine here:
1. admission: arrived requests take free rows and are prefilled together as one step (prefill and decode
   interleave at step granularity: the running requests wait for that prefill, as in a server without chunked
   prefill); the requests that finished leave their rows and the highest running ones move down;
2. the measured window opens or closes (`WindowRecorder`, at a synced device edge);
3. one decode step over every occupied row, then again the finished requests leave;
4. with nothing to run, the host waits for the next arrival (the device idles), asking the stop request at least
   every joulebench.waits.SLICE_S: a very low rate's gaps are long.
The host admits before every decode step. It stays at most LOOKAHEAD steps ahead of the device (it waits for
the end of the step that many steps back), so admission decisions are at most that many steps late.

Every step is stamped at its start and end (CUDA events on GPUs, the monotonic clock on CPUs) and logged with
its work: prefill tokens, decoded rows, attended cache positions, and which requests took part. The stamps become
the node's monotonic time at the end, through synced edges (jpwr.DeviceEventStamps), so steps, request times
and the energy counter share one clock.
"""

from __future__ import annotations

import dataclasses
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import numpy as np
import torch

from joulebench.requests_table import STEP_KINDS
from joulebench.waits import StopCheck, wait_until
from jpwr.phases import DeviceEventStamps, HostStamps
from llm_inference.arrivals import Request
from llm_inference.continuous_engine import ContinuousEngine
from llm_inference.scheduler import DecodePlan, PrefillPlan, Scheduler

LOOKAHEAD = 8  # decode steps the host may run ahead of the device
PROGRESS_EVERY_S = 10.0
QUEUE_ROWS = 2  # the queue holds at most this many times the rows; later arrivals wait in the source (their
# arrival times are the scheduled ones either way), and an endless `--rate max` source is read only as needed
PREFILL = STEP_KINDS.index("prefill")  # a step's kind, as the request table stores it
DECODE = STEP_KINDS.index("decode")


@dataclasses.dataclass
class StepEntry:
    kind: int  # PREFILL or DECODE
    begin: int  # index into the stamps
    end: int
    members: list[int]  # request ids
    amounts: list[int]  # per member: prefill tokens (prefill) or attended KV tokens (decode)


@dataclasses.dataclass
class ServeLog:
    """What the loop did, on the node's monotonic clock (ns)."""

    step_kind: np.ndarray
    step_t0_ns: np.ndarray
    step_t1_ns: np.ndarray
    step_members: list[list[int]]
    step_amounts: list[list[int]]
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
    tokens: dict[int, list[int]] | None  # per request, with keep_tokens

    def members(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The steps' members as CSR: offsets (steps + 1), request ids and amounts (a prefill's prompt tokens, a
        decode's attended KV tokens), the form the request table stores and the per-request fit reads."""
        counts = [len(m) for m in self.step_members]
        return (np.cumsum([0, *counts]).astype(np.int64),
                np.array([m for ms in self.step_members for m in ms], dtype=np.int64),
                np.array([a for amounts in self.step_amounts for a in amounts], dtype=np.int64))


class ArrivalFeed:
    """A load's requests entering its queue once their arrival time has passed, on both load targets (the engine's
    loop and the HTTP client): at most QUEUE_ROWS times the rows wait in the queue, later ones in the source."""

    def __init__(self, requests: Iterator[Request], start_ns: int, rows: int) -> None:
        self.pending = iter(requests)
        self.upcoming = next(self.pending, None)
        self.start_ns, self.limit = start_ns, QUEUE_ROWS * rows
        self.arrival_ns: dict[int, int] = {}

    @property
    def exhausted(self) -> bool:
        """Every request of the source has arrived (or the feed was closed)."""
        return self.upcoming is None

    def move_due(self, queue: deque[Request], now_s: float) -> int:
        """Move the requests due by `now_s` into `queue`; returns how many of them are warm-up requests."""
        warmups = 0
        while self.upcoming is not None and self.upcoming.arrival_s <= now_s and len(queue) < self.limit:
            queue.append(self.upcoming)
            self.arrival_ns[self.upcoming.id] = self.start_ns + round(self.upcoming.arrival_s * 1e9)
            warmups += self.upcoming.warmup
            self.upcoming = next(self.pending, None)
        return warmups

    def close(self) -> None:
        """Nothing more arrives (the queue "empties" at the end of a `--rate max` window)."""
        self.upcoming = None


class LoadState(Protocol):
    """What a window rule reads of a load, the engine's (its scheduler) or a server's client (http_load.HttpLoad):
    a row is one request in flight."""

    queue: deque[Request]
    exhausted: bool

    @property
    def free_rows(self) -> int: ...

    @property
    def warming_up(self) -> bool: ...


class WindowRule:
    """When the measured window begins and ends; the driver's meter calls go in `on_begin` / `on_end`."""

    def begin_now(self, load: LoadState, now_s: float) -> bool:
        raise NotImplementedError

    def end_now(self, load: LoadState, now_s: float) -> bool:
        raise NotImplementedError


@dataclasses.dataclass
class ArrivalWindow(WindowRule):
    """Finite rates (MLPerf's rule): from the first counted arrival to the last one."""

    first_s: float
    last_s: float

    def begin_now(self, load: LoadState, now_s: float) -> bool:
        return now_s >= self.first_s

    def end_now(self, load: LoadState, now_s: float) -> bool:
        return now_s >= self.last_s


@dataclasses.dataclass
class SaturatedWindow(WindowRule):
    """`--rate max`: from the first moment every row is busy, for `seconds` (None: until the queue empties);
    admission stops at its end."""

    seconds: float | None
    began_s: float | None = None

    def begin_now(self, load: LoadState, now_s: float) -> bool:
        if load.free_rows == 0 and not load.warming_up:
            self.began_s = now_s
            return True
        return False

    def end_now(self, load: LoadState, now_s: float) -> bool:
        if self.seconds is None:
            return load.exhausted and not load.queue
        return self.began_s is not None and now_s - self.began_s >= self.seconds


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


@dataclasses.dataclass
class WindowRecorder:
    """The measured window's edges as the loop marks them: host times, step indices, tokens produced inside."""

    clock: StepClock
    times: list[int] = dataclasses.field(default_factory=list)
    steps: list[int] = dataclasses.field(default_factory=list)
    tokens: int = 0

    @property
    def edges(self) -> int:
        return len(self.times)

    def mark(self, step_count: int, meter_call: Callable[[], None]) -> None:
        """An edge after `step_count` steps: the device synced, then the meter's call (its window edge)."""
        self.clock.synced_edge()
        meter_call()
        self.times.append(time.monotonic_ns())
        self.steps.append(step_count)

    def count(self, steps: list[StepEntry]) -> None:
        """Output tokens of steps run while the window is open: one per member (a prefill gives the first)."""
        if self.edges == 1:
            self.tokens += sum(len(s.members) for s in steps)

    @staticmethod
    def span(values: list[int]) -> tuple[int, int] | None:
        return (values[0], values[1]) if len(values) == 2 else None


class ServeLoop:
    """One load run on the engine: the scheduler's plans carried out as steps, stamped and logged, the measured
    window marked between them; see the module docstring."""

    def __init__(self, engine: ContinuousEngine, rows: int, prompt: Callable[[Request], torch.Tensor],
                 keep_tokens: bool = False, log: Callable[[str], None] = print, admit_all: bool = False) -> None:
        """`admit_all`: every arrived request that finds a row is prefilled before the next decode step (no token
        budget, no batching rule): the controlled-split window, where prefill and decode must not interleave."""
        self.engine, self.prompt, self.log = engine, prompt, log
        self.scheduler = Scheduler(rows, admit_all)
        self.clock = StepClock(engine)
        self.steps: list[StepEntry] = []
        self.keep_tokens = keep_tokens
        self.tokens: dict[int, list[int]] = {}
        self.first_token_host: dict[int, float] = {}  # host-side TTFT for the progress line only

    # ---- steps -------------------------------------------------------------------------------------------
    def _prefill(self, plan: PrefillPlan) -> None:
        begin = self.clock.stamp()
        self.engine.admit(plan.rows, [self.prompt(r) for r in plan.requests])
        end = self.clock.stamp()
        self.steps.append(StepEntry(PREFILL, begin, end, [r.id for r in plan.requests],
                                    [r.input_tokens for r in plan.requests]))
        host_now = time.monotonic()
        for request in plan.requests:
            self.first_token_host[request.id] = host_now
        self._collect_tokens(plan.rows, [r.id for r in plan.requests])
        self._release()

    def _decode(self, plan: DecodePlan) -> None:
        begin = self.clock.stamp()
        self.engine.step(plan.row_count, plan.attended)
        end = self.clock.stamp()
        self.steps.append(StepEntry(DECODE, begin, end, plan.members, plan.amounts))
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
        plan = self.scheduler.release()
        if plan is None:
            return
        self.engine.release(plan.finished)
        if plan.moves:
            self.engine.move(plan.moves)

    # ---- the loop ----------------------------------------------------------------------------------------
    def run(self, requests: Iterator[Request], rule: WindowRule, on_begin: Callable[[], None],
            on_end: Callable[[int], None], stop: Callable[[], str | None], expected: int | None) -> ServeLog:
        """Serve `requests` (sorted by arrival; may be endless for `--rate max`, which stops admitting at the
        window's end); `on_begin()` / `on_end(tokens)` open and close the meter's window (after a device sync).
        A stop request closes the window and ends the loop at once (requests in flight stay unfinished)."""
        scheduler = self.scheduler
        self.clock.synced_edge()
        start_ns = time.monotonic_ns()
        feed = ArrivalFeed(requests, start_ns, scheduler.rows)
        window = WindowRecorder(self.clock)
        last_progress = time.monotonic()
        while True:
            now_s = (time.monotonic_ns() - start_ns) / 1e9
            scheduler.warmups_left += feed.move_due(scheduler.queue, now_s)
            scheduler.exhausted = feed.exhausted
            stop_reason = stop()
            if stop_reason or (scheduler.idle and feed.exhausted):
                break
            self._iteration(now_s, rule, window, feed, on_begin, on_end, stop)
            if time.monotonic() - last_progress >= PROGRESS_EVERY_S:
                last_progress = time.monotonic()
                self.log(self._progress(now_s, expected, feed.arrival_ns))
        if window.edges == 1:  # stopped inside the window: close it where the loop stopped
            window.mark(len(self.steps), lambda: on_end(window.tokens))
        self.clock.synced_edge()
        return self._serve_log(start_ns, feed.arrival_ns, window, stop_reason)

    def _iteration(self, now_s: float, rule: WindowRule, window: WindowRecorder, feed: ArrivalFeed,
                   on_begin: Callable[[], None], on_end: Callable[[int], None], stop: StopCheck) -> None:
        """Admit, mark a window edge where the rule says, decode; wait for the next arrival (or a stop request) when
        nothing ran."""
        before = len(self.steps)
        prefill = self.scheduler.admit(now_s)
        if prefill is not None:
            self._prefill(prefill)
        if window.edges == 0 and rule.begin_now(self.scheduler, now_s):
            window.mark(len(self.steps), on_begin)
        elif window.edges == 1 and rule.end_now(self.scheduler, now_s):
            window.mark(len(self.steps), lambda: on_end(window.tokens))
            if isinstance(rule, SaturatedWindow):  # the queue "empties": nothing more is admitted
                self.scheduler.close_queue()
                feed.close()
        decode = self.scheduler.decode()
        if decode is not None:
            self._decode(decode)
        window.count(self.steps[before:])
        if len(self.steps) == before:  # nothing to run: wait for the next arrival
            self.clock.synced_edge()
            if feed.upcoming is not None:
                wait_until(feed.start_ns / 1e9 + feed.upcoming.arrival_s, stop)

    def _progress(self, now_s: float, expected: int | None, arrival_ns: dict[int, int]) -> str:
        scheduler = self.scheduler
        ttfts = [self.first_token_host[i] - arrival_ns[i] / 1e9 for i in self.first_token_host]
        ttft = f"{np.median(ttfts) * 1e3:.0f} ms" if ttfts else "n/a"
        rate = scheduler.done / now_s if now_s > 0 else 0.0
        eta = "n/a"
        if expected and rate > 0:
            left = (expected - scheduler.done) / rate
            eta = time.strftime("%H:%M:%S", time.gmtime(left))
        queued = f"{len(scheduler.queue)}{'+' if len(scheduler.queue) >= QUEUE_ROWS * scheduler.rows else ''}"
        return (f"load {now_s:.0f} s | done {scheduler.done}{f'/{expected}' if expected else ''} | "
                f"in flight {len(scheduler.running)} | queued {queued} | {rate:.3g} req/s | p50 TTFT (host) "
                f"{ttft} | ETA {eta}")

    def produced(self) -> dict[int, int]:
        """Output tokens per request so far (one per step it took part in)."""
        counts: dict[int, int] = {}
        for step in self.steps:
            for member in step.members:
                counts[member] = counts.get(member, 0) + 1
        return counts

    def _serve_log(self, start_ns: int, arrival_ns: dict[int, int], window: WindowRecorder,
                   stop_reason: str | None) -> ServeLog:
        times = self.clock.host_times()
        t0 = np.array([times[s.begin] for s in self.steps], dtype=np.int64)
        t1 = np.array([times[s.end] for s in self.steps], dtype=np.int64)
        admitted: dict[int, int] = {}
        first: dict[int, int] = {}
        finish: dict[int, int] = {}
        for index, step in enumerate(self.steps):
            for member in step.members:
                if step.kind == PREFILL:
                    admitted[member], first[member] = int(t0[index]), int(t1[index])
                finish[member] = int(t1[index])
        return ServeLog(
            step_kind=np.array([s.kind for s in self.steps], dtype=np.int8), step_t0_ns=t0, step_t1_ns=t1,
            step_members=[s.members for s in self.steps], step_amounts=[s.amounts for s in self.steps],
            arrival_ns=arrival_ns, admitted_ns=admitted, first_token_ns=first, finish_ns=finish, start_ns=start_ns,
            window=window.span(window.times), window_steps=window.span(window.steps), window_tokens=window.tokens,
            produced=self.produced(), stop_reason=stop_reason, tokens=self.tokens if self.keep_tokens else None)
