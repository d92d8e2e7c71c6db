"""The load loop: requests arrive on the host's clock, wait for a slot, are prefilled, decode until done.

One iteration of the loop, on the host:
1. finished requests leave their slots (the host knows each request's output length, so no device read), and the
   highest running requests move down into the freed slots (`_compact`);
2. admission: arrived requests (arrival <= now) take the lowest free slots, up to PREFILL_CHUNK_TOKENS prompt
   tokens per iteration, and are prefilled together as one step (prefill and decode interleave at step
   granularity: the running requests wait for that prefill, as in a server without chunked prefill). Under a
   backlog (more requests waiting than slots free) the host admits only once 1/ADMIT_DIVISOR of the slots are
   free: a prefill pass reads every weight once whatever its size, and one pass per finished request (about one
   per step at 256 slots) would double the cost of a step; a slot stays empty for half that many steps on average
   (3 % of the slots at ADMIT_DIVISOR = 16). Without a backlog every arrival is admitted at once;
3. one decode step over every occupied slot (rows up to the highest occupied slot's bucket);
4. with nothing to run, the host sleeps until the next arrival (the device idles).
The host admits before every decode step. It stays at most LOOKAHEAD steps ahead of the device (it waits for
the end of the step that many steps back), so admission decisions are at most that many steps late.

Every step is stamped at its start and end (CUDA events on GPUs, the monotonic clock on CPUs) and logged with
its work: prefill tokens, decoded rows, attended KV tokens, and which requests took part. The stamps become
the node's monotonic time at the end, through synced edges (jpwr.DeviceEventStamps), so steps, request times
and the energy counter share one clock.
"""

from __future__ import annotations

import dataclasses
import heapq
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch

from jpwr.phases import DeviceEventStamps, HostStamps
from llm_inference import memory
from llm_inference.arrivals import Request
from llm_inference.continuous_engine import ContinuousEngine, step_shape

LOOKAHEAD = 8  # decode steps the host may run ahead of the device
ADMIT_DIVISOR = 16  # under a backlog, admit once this fraction of the slots is free
PROGRESS_EVERY_S = 10.0
QUEUE_SLOTS = 2  # the queue holds at most this many times the slots; later arrivals wait in the source (their
# arrival times are the scheduled ones either way), and an endless `--rate max` source is read only as needed
PREFILL = 0
DECODE = 1


@dataclasses.dataclass
class Running:
    """A request in a slot: host mirrors of its cache length and tokens produced so far."""

    request: Request
    slot: int
    length: int
    produced: int


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
    loop and the HTTP client): at most QUEUE_SLOTS times the slots wait in the queue, later ones in the source."""

    def __init__(self, requests: Iterator[Request], start_ns: int, slots: int) -> None:
        self.pending = iter(requests)
        self.upcoming = next(self.pending, None)
        self.start_ns, self.limit = start_ns, QUEUE_SLOTS * slots
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


class WindowRule:
    """When the measured window begins and ends; the driver's meter calls go in `on_begin` / `on_end`."""

    def begin_now(self, loop: ServeLoop, now_s: float) -> bool:
        raise NotImplementedError

    def end_now(self, loop: ServeLoop, now_s: float) -> bool:
        raise NotImplementedError


@dataclasses.dataclass
class ArrivalWindow(WindowRule):
    """Finite rates (MLPerf's rule): from the first counted arrival to the last one."""

    first_s: float
    last_s: float

    def begin_now(self, loop: ServeLoop, now_s: float) -> bool:
        return now_s >= self.first_s

    def end_now(self, loop: ServeLoop, now_s: float) -> bool:
        return now_s >= self.last_s


@dataclasses.dataclass
class SaturatedWindow(WindowRule):
    """`--rate max`: from the first moment every slot is busy, for `seconds` (None: until the queue empties);
    admission stops at its end."""

    seconds: float | None
    began_s: float | None = None

    def begin_now(self, loop: ServeLoop, now_s: float) -> bool:
        if loop.free_slots == 0 and not loop.warming_up:
            self.began_s = now_s
            return True
        return False

    def end_now(self, loop: ServeLoop, now_s: float) -> bool:
        if self.seconds is None:
            return loop.exhausted and not loop.queue
        return self.began_s is not None and now_s - self.began_s >= self.seconds


@dataclasses.dataclass
class _Window:
    """The measured window's edges as the loop marks them: host times, step indices, tokens produced inside."""

    times: list[int] = dataclasses.field(default_factory=list)
    steps: list[int] = dataclasses.field(default_factory=list)
    tokens: int = 0

    @property
    def edges(self) -> int:
        return len(self.times)

    def mark(self, loop: ServeLoop, meter_call: Callable[[], None]) -> None:
        loop._synced_edge()
        meter_call()
        self.times.append(time.monotonic_ns())
        self.steps.append(len(loop.steps))

    def count(self, steps: list[StepEntry]) -> None:
        """Output tokens of steps run while the window is open: one per member (a prefill gives the first)."""
        if self.edges == 1:
            self.tokens += sum(len(s.members) for s in steps)

    @staticmethod
    def span(values: list[int]) -> tuple[int, int] | None:
        return (values[0], values[1]) if len(values) == 2 else None


class ServeLoop:
    """Slots, queue and steps of one load run; see the module docstring."""

    def __init__(self, engine: ContinuousEngine, slots: int, prompt: Callable[[Request], torch.Tensor],
                 keep_tokens: bool = False, log: Callable[[str], None] = print, admit_all: bool = False) -> None:
        """`admit_all`: every arrived request that finds a slot is prefilled before the next decode step (no token
        budget, no batching rule): the controlled-split window, where prefill and decode must not interleave."""
        self.engine, self.slots, self.prompt, self.log, self.admit_all = engine, slots, prompt, log, admit_all
        self.free: list[int] = list(range(slots))
        self.running: dict[int, Running] = {}  # by slot
        self.queue: deque[Request] = deque()
        self.stamps: Any = DeviceEventStamps(torch) if engine.device.type == "cuda" else HostStamps()
        self.raw: list[Any] = []
        self.edges: list[tuple[int, int]] = []
        self.steps: list[StepEntry] = []
        self.keep_tokens = keep_tokens
        self.tokens: dict[int, list[int]] = {}
        self.done = 0
        self.moved = 0  # requests moved down to keep the occupied slots at the bottom
        self.exhausted = False  # every request of the source has arrived
        self.warmups_left = 0
        self.first_token_host: dict[int, float] = {}  # host-side TTFT for the progress line only

    @property
    def free_slots(self) -> int:
        return len(self.free)

    @property
    def warming_up(self) -> bool:
        return self.warmups_left > 0

    # ---- clock -------------------------------------------------------------------------------------------
    def _stamp(self) -> int:
        self.raw.append(self.stamps.stamp())
        return len(self.raw) - 1

    def _synced_edge(self) -> None:
        """Device idle, host time known: an anchor for turning device stamps into host time."""
        index = self._stamp()
        self.engine.sync()
        self.edges.append((index, time.monotonic_ns()))

    def _wait_lookahead(self) -> None:
        if self.engine.device.type == "cuda" and len(self.steps) > LOOKAHEAD:
            self.raw[self.steps[-LOOKAHEAD - 1].end].synchronize()

    # ---- steps -------------------------------------------------------------------------------------------
    def _admit(self, now_s: float) -> None:
        backlog = len(self.queue) > len(self.free)
        if backlog and self.running and len(self.free) < max(1, self.slots // ADMIT_DIVISOR) and not self.admit_all:
            return
        admitted: list[Request] = []
        budget = float("inf") if self.admit_all else memory.PREFILL_CHUNK_TOKENS
        while self.queue and len(admitted) < len(self.free) and self.queue[0].arrival_s <= now_s:
            request = self.queue[0]
            if admitted and request.input_tokens > budget:
                break
            self.queue.popleft()
            admitted.append(request)
            budget -= request.input_tokens
        if not admitted:
            return
        slots = [heapq.heappop(self.free) for _ in admitted]
        begin = self._stamp()
        self.engine.admit(slots, [self.prompt(r) for r in admitted])
        end = self._stamp()
        self.steps.append(StepEntry(PREFILL, begin, end, [r.id for r in admitted], [r.input_tokens for r in admitted]))
        host_now = time.monotonic()
        for request, slot in zip(admitted, slots, strict=True):
            self.running[slot] = Running(request, slot, request.input_tokens, 1)
            self.first_token_host[request.id] = host_now
        self._collect_tokens(slots)
        self._finish_done()

    def _decode(self) -> None:
        running = list(self.running.values())
        rows, attended = step_shape([r.length for r in running], max(self.running), self.slots)
        begin = self._stamp()
        self.engine.step(rows, attended)
        end = self._stamp()
        self.steps.append(StepEntry(DECODE, begin, end, [r.request.id for r in running],
                                    [r.length + 1 for r in running]))
        for r in running:
            r.length += 1
            r.produced += 1
        self._collect_tokens(list(self.running))
        self._finish_done()
        self._wait_lookahead()

    def _collect_tokens(self, slots: list[int]) -> None:
        if not self.keep_tokens:
            return
        tokens = self.engine.next_tokens().tolist()  # a device read: only for correctness tests
        for slot in slots:
            self.tokens.setdefault(self.running[slot].request.id, []).append(tokens[slot])

    def _finish_done(self) -> None:
        done = [slot for slot, r in self.running.items() if r.produced >= r.request.output_tokens]
        if not done:
            return
        self.engine.release(done)
        for slot in done:
            request = self.running.pop(slot).request
            heapq.heappush(self.free, slot)
            self.done += 1
            if request.warmup:
                self.warmups_left -= 1
        self._compact()

    def _compact(self) -> None:
        """Keep the running requests in the lowest slots: the highest one moves into each free slot below it.

        A decode step computes every slot up to the highest occupied one (its row bucket), so without this a drain
        or a light load would keep computing rows long freed (on the H100 a 256-slot drain ran at full step cost
        with 30 requests left). A move copies one cache row's filled part (at most ~0.1 GB at 8B/896 slots)."""
        moves: list[tuple[int, int, int]] = []
        while self.free and self.running and self.free[0] < (high := max(self.running)):
            low = heapq.heapreplace(self.free, high)
            running = self.running.pop(high)
            running.slot = low
            self.running[low] = running
            moves.append((high, low, running.length))
        if moves:
            self.engine.move(moves)
            self.moved += len(moves)

    # ---- the loop ----------------------------------------------------------------------------------------
    def run(self, requests: Iterator[Request], rule: WindowRule, on_begin: Callable[[], None],
            on_end: Callable[[int], None], stop: Callable[[], str | None], expected: int | None) -> ServeLog:
        """Serve `requests` (sorted by arrival; may be endless for `--rate max`, which stops admitting at the
        window's end); `on_begin()` / `on_end(tokens)` open and close the meter's window (after a device sync).
        A stop request closes the window and ends the loop at once (requests in flight stay unfinished)."""
        self._synced_edge()
        start_ns = time.monotonic_ns()
        feed = ArrivalFeed(requests, start_ns, self.slots)
        window = _Window()
        last_progress = time.monotonic()
        stop_reason: str | None = None
        while True:
            now_s = (time.monotonic_ns() - start_ns) / 1e9
            self.warmups_left += feed.move_due(self.queue, now_s)
            self.exhausted = feed.exhausted
            stop_reason = stop()
            if stop_reason or (not self.running and not self.queue and feed.exhausted):
                break
            before = len(self.steps)
            self._admit(now_s)
            if window.edges == 0 and rule.begin_now(self, now_s):
                window.mark(self, on_begin)
            elif window.edges == 1 and rule.end_now(self, now_s):
                window.mark(self, lambda: on_end(window.tokens))
                if isinstance(rule, SaturatedWindow):  # the queue "empties": nothing more is admitted
                    self.queue.clear()
                    feed.close()
            if self.running:
                self._decode()
            window.count(self.steps[before:])
            if len(self.steps) == before:  # nothing to run: sleep until the next arrival
                self._synced_edge()
                if feed.upcoming is not None:
                    time.sleep(max(0.0, feed.upcoming.arrival_s - (time.monotonic_ns() - start_ns) / 1e9))
            if time.monotonic() - last_progress >= PROGRESS_EVERY_S:
                last_progress = time.monotonic()
                self.log(self._progress(now_s, expected, feed.arrival_ns))
        if window.edges == 1:  # stopped inside the window: close it where the loop stopped
            window.mark(self, lambda: on_end(window.tokens))
        self._synced_edge()
        return self._serve_log(start_ns, feed.arrival_ns, window, stop_reason)

    def _progress(self, now_s: float, expected: int | None, arrival_ns: dict[int, int]) -> str:
        ttfts = [self.first_token_host[i] - arrival_ns[i] / 1e9 for i in self.first_token_host]
        ttft = f"{np.median(ttfts) * 1e3:.0f} ms" if ttfts else "n/a"
        rate = self.done / now_s if now_s > 0 else 0.0
        eta = "n/a"
        if expected and rate > 0:
            left = (expected - self.done) / rate
            eta = time.strftime("%H:%M:%S", time.gmtime(left))
        queued = f"{len(self.queue)}{'+' if len(self.queue) >= QUEUE_SLOTS * self.slots else ''}"
        return (f"[llm_inference] load {now_s:.0f} s | done {self.done}{f'/{expected}' if expected else ''} | "
                f"in flight {len(self.running)} | queued {queued} | {rate:.3g} req/s | p50 TTFT (host) "
                f"{ttft} | ETA {eta}")

    def produced(self) -> dict[int, int]:
        """Output tokens per request so far (one per step it took part in)."""
        counts: dict[int, int] = {}
        for step in self.steps:
            for member in step.members:
                counts[member] = counts.get(member, 0) + 1
        return counts

    def _serve_log(self, start_ns: int, arrival_ns: dict[int, int], window: _Window, stop_reason: str | None
                   ) -> ServeLog:
        times = self.stamps.host_times(self.raw, self.edges)
        self.stamps.release(self.raw)
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
