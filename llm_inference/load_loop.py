"""The one load loop of both targets: requests arrive on the host's clock, wait for a row, are admitted, run until
done; the measured window opens and closes between the loop's iterations.

Every decision is the scheduler's (llm_inference/scheduler.py: rows, admission, release); an `Executor` carries the
plans out: the in-process engine (llm_inference/serve_loop.py `ServeLoop`: admit = a prefill step, then one decode
step per iteration over the occupied rows) or a server's client (llm_inference/http_load.py `HttpLoad`: rows = the
requests in flight, admit = send, the server decodes, a finished stream releases its row). One iteration:
1. the requests due by now enter the queue (`ArrivalFeed`); a stop request, or nothing left to run, ends the loop;
2. admission: arrived requests take free rows and the executor starts them;
3. the measured window opens or closes where the rule says (`WindowRecorder`, at an edge the executor syncs: the
   engine's device is idle there); a rule that `closes_admission` empties the queue at its end;
4. the executor advances (a decode step, finished streams released); where nothing ran, it waits for the next
   arrival or a stop request.
A stop request closes the window at once and ends the loop (requests in flight stay unfinished).
"""

from __future__ import annotations

import dataclasses
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Protocol

import numpy as np

from joulebench.waits import StopCheck
from llm_inference.arrivals import Request
from llm_inference.scheduler import PrefillPlan, Scheduler
from llm_inference.window_rules import WindowRule

PROGRESS_EVERY_S = 10.0
QUEUE_ROWS = 2  # the queue holds at most this many times the rows; later arrivals wait in the source (their
# arrival times are the scheduled ones either way), and an endless `--rate max` source is read only as needed


class ArrivalFeed:
    """A load's requests entering its queue once their arrival time has passed: at most QUEUE_ROWS times the rows wait
    in the queue, later ones in the source."""

    def __init__(self, requests: Iterator[Request], start_ns: int, rows: int) -> None:
        self.pending = iter(requests)
        self.upcoming = next(self.pending, None)
        self.start_ns, self.limit = start_ns, QUEUE_ROWS * rows
        self.arrival_ns: dict[int, int] = {}

    @property
    def exhausted(self) -> bool:
        """Every request of the source has arrived (or the feed was closed)."""
        return self.upcoming is None

    @property
    def next_arrival_s(self) -> float | None:
        """When the next request arrives, on the monotonic clock in seconds (None: none will)."""
        return None if self.upcoming is None else self.start_ns / 1e9 + self.upcoming.arrival_s

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


class Executor(Protocol):
    """What carries the scheduler's plans out (see the module docstring)."""

    scheduler: Scheduler

    def progress(self) -> int:
        """Work done so far in the executor's own unit (engine steps, or chunks read): the window's step count."""
        ...

    def edge(self) -> None:
        """A window edge, the load's start or its end: the engine syncs its device (a server's work is not ours)."""
        ...

    def admit(self, plan: PrefillPlan) -> None:
        """Start the admitted requests in their rows (a prefill step, or the requests sent)."""
        ...

    def advance(self) -> bool:
        """Whatever runs after admission (a decode step over the occupied rows, or the finished streams released);
        whether anything did."""
        ...

    def idle(self, until_s: float | None, stop: StopCheck) -> None:
        """Nothing ran: wait for the next arrival at `until_s` (monotonic seconds; None: none is due), a stop request,
        or (a server's client) a finished stream."""
        ...

    def window_tokens(self, opened: tuple[int, int], end_ns: int) -> float:
        """Output tokens produced since the window opened at (progress, monotonic ns)."""
        ...

    def first_tokens_ns(self) -> dict[int, int]:
        """Each request's first token as the host saw it (the progress line's TTFT only)."""
        ...


@dataclasses.dataclass
class WindowRecorder:
    """The measured window's edges as the loop marks them: host times, the executor's progress, the tokens inside."""

    executor: Executor
    times: list[int] = dataclasses.field(default_factory=list)
    steps: list[int] = dataclasses.field(default_factory=list)
    tokens: float = 0

    @property
    def edges(self) -> int:
        return len(self.times)

    def open(self, on_begin: Callable[[], None]) -> None:
        """The window opens: the executor's edge, then the meter's."""
        self.executor.edge()
        on_begin()
        self.times.append(time.monotonic_ns())
        self.steps.append(self.executor.progress())

    def close(self, on_end: Callable[[float], None]) -> None:
        """The window closes: the executor's edge, then the meter's with the output tokens produced inside."""
        self.executor.edge()
        end_ns = time.monotonic_ns()
        self.tokens = self.executor.window_tokens((self.steps[0], self.times[0]), end_ns)
        on_end(self.tokens)
        self.times.append(end_ns)
        self.steps.append(self.executor.progress())

    @staticmethod
    def span(values: list[int]) -> tuple[int, int] | None:
        return (values[0], values[1]) if len(values) == 2 else None


@dataclasses.dataclass(frozen=True)
class LoadEnd:
    """What the loop gives back: its time zero (arrival_s = 0), the arrivals and the window's edges (monotonic ns),
    the window in the executor's progress, the tokens inside, why it stopped and how many requests were in flight."""

    start_ns: int
    arrival_ns: dict[int, int]
    window: tuple[int, int] | None
    window_steps: tuple[int, int] | None
    window_tokens: float
    stop_reason: str | None
    in_flight_at_end: int


def run_load(executor: Executor, requests: Iterator[Request], rule: WindowRule, on_begin: Callable[[], None],
             on_end: Callable[[float], None], stop: StopCheck, expected: int | None, log: Callable[[str], None]
             ) -> LoadEnd:
    """Serve `requests` (sorted by arrival; may be endless for `--rate max`, which stops admitting at the window's end);
    `on_begin()` / `on_end(tokens)` open and close the meter's window; `expected`: how many requests, where known."""
    scheduler = executor.scheduler
    executor.edge()
    start_ns = time.monotonic_ns()
    feed = ArrivalFeed(requests, start_ns, scheduler.rows)
    window = WindowRecorder(executor)
    last_progress = time.monotonic()
    while True:
        now_s = (time.monotonic_ns() - start_ns) / 1e9
        scheduler.warmups_left += feed.move_due(scheduler.queue, now_s)
        scheduler.exhausted = feed.exhausted
        stop_reason = stop()
        if stop_reason or (scheduler.idle and feed.exhausted):
            break
        _iteration(executor, now_s, rule, window, feed, on_begin, on_end, stop)
        if time.monotonic() - last_progress >= PROGRESS_EVERY_S:
            last_progress = time.monotonic()
            log(_progress(scheduler, now_s, expected, executor.first_tokens_ns(), feed.arrival_ns))
    in_flight = len(scheduler.running)
    if window.edges == 1:  # stopped inside the window: close it where the loop stopped
        window.close(on_end)
    executor.edge()
    return LoadEnd(start_ns, feed.arrival_ns, window.span(window.times), window.span(window.steps), window.tokens,
                   stop_reason, in_flight)


def _iteration(executor: Executor, now_s: float, rule: WindowRule, window: WindowRecorder, feed: ArrivalFeed,
               on_begin: Callable[[], None], on_end: Callable[[float], None], stop: StopCheck) -> None:
    """Admit, mark a window edge where the rule says, advance; wait for the next arrival (or a stop request) when
    nothing ran."""
    scheduler = executor.scheduler
    plan = scheduler.admit(now_s)
    if plan is not None:
        executor.admit(plan)
    if window.edges == 0 and rule.begin_now(scheduler, now_s):
        window.open(on_begin)
    elif window.edges == 1 and rule.end_now(scheduler, now_s):
        window.close(on_end)
        if rule.closes_admission:  # the queue "empties": nothing more is admitted
            scheduler.close_queue()
            feed.close()
    advanced = executor.advance()
    if plan is None and not advanced:
        executor.idle(feed.next_arrival_s, stop)


def _progress(scheduler: Scheduler, now_s: float, expected: int | None, first_tokens_ns: dict[int, int],
              arrival_ns: dict[int, int]) -> str:
    ttfts = [(first_tokens_ns[i] - arrival_ns[i]) / 1e9 for i in list(first_tokens_ns) if i in arrival_ns]
    ttft = f"{np.median(ttfts) * 1e3:.0f} ms" if ttfts else "n/a"
    rate = scheduler.done / now_s if now_s > 0 else 0.0
    eta = "n/a"
    if expected and rate > 0:
        eta = time.strftime("%H:%M:%S", time.gmtime((expected - scheduler.done) / rate))
    queued = f"{len(scheduler.queue)}{'+' if len(scheduler.queue) >= QUEUE_ROWS * scheduler.rows else ''}"
    return (f"load {now_s:.0f} s | done {scheduler.done}{f'/{expected}' if expected else ''} | "
            f"in flight {len(scheduler.running)} | queued {queued} | {rate:.3g} req/s | p50 TTFT (host) "
            f"{ttft} | ETA {eta}")
