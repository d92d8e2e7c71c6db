"""The load loop's decisions, apart from any engine: which request runs in which request row, when arrived requests
are admitted, and which rows move down when requests finish. The load loop (llm_inference/load_loop.py) has each
plan carried out, on the engine or by a server's client; on the engine the host decides everything (a request's
output length is known), so the device is never read for a decision.

Words: a *row* is one request's place in a decode step (`--max-concurrency` rows; a row of the engine's KV cache, or
one request in flight to a server); a *cache position* is one token's place in a row's cache (the engine's,
llm_inference/continuous_engine.py).

* admission: arrived requests (arrival <= now) take the lowest free rows, up to PREFILL_CHUNK_TOKENS prompt tokens
  per prefill step. Under a backlog (more requests waiting than rows free) they are admitted only once
  1/`admit_divisor` of the rows are free (`--admit-divisor`, ADMIT_DIVISOR by default): a prefill pass reads every
  weight once whatever its size, and one pass per finished request (about one per step at 256 rows) would double the
  cost of a step; a row stays empty for half that many steps on average (3 % of the rows at 16), and an empty row
  inside the step's row bucket is computed all the same. The divisor is the prefill/decode interleave: larger, more
  and smaller prefill steps interrupt decoding and fewer rows wait empty; smaller, the reverse (a sweep's knob,
  chosen by energy per token). Without a backlog every arrival is admitted at once;
* decode: one step over every occupied row: the rows up to the highest occupied row's bucket
  (continuous_engine.row_buckets). Before it, running requests move down into free rows where that lowers the
  step's bucket (`_compact`), and only there: a move copies a cache row's filled part (~45 MB at llama-8b's 128 KiB
  per position and a chat request's ~350), and it pays only for the rows it stops computing. Under a backlog the
  freed rows are refilled by the next admission, so nothing moves; a drain or a light load moves its requests
  down as the occupied rows shrink;
* release: finished requests leave their rows (a server's client has no places to move: it only releases).

The controlled-split window (`controlled`, llm_inference/load.py) runs prefill and decode at separate times: its
prefill steps are of the size a backlog makes (`backlog_step_requests`: rows // admit_divisor requests, within the
token budget: the steps the rates' fits see at full load), back to back; no decode step runs while a queued request
could take a free row (so no row moves between prefill steps: the next ones refill the freed rows).
"""

from __future__ import annotations

import dataclasses
import heapq
from collections import deque
from collections.abc import Collection

from llm_inference import memory
from llm_inference.arrivals import Request
from llm_inference.continuous_engine import rows_for, step_shape
from llm_inference.load_config import ADMIT_DIVISOR


@dataclasses.dataclass
class Running:
    """A request in a row: host mirrors of its filled cache positions and the tokens it produced so far."""

    request: Request
    row: int
    length: int
    produced: int


@dataclasses.dataclass(frozen=True)
class PrefillPlan:
    """Requests admitted together, one prefill step: each into its row (the first token comes with it)."""

    requests: list[Request]
    rows: list[int]


@dataclasses.dataclass(frozen=True)
class DecodePlan:
    """One decode step: first the moves (from row, to row, filled cache positions) per moved request, then
    `row_count` rows (a bucket) attending to `attended` cache positions; per running request its id, its row (after
    the moves) and the cache positions it attends to."""

    moves: list[tuple[int, int, int]]
    row_count: int
    attended: int
    members: list[int]
    rows: list[int]
    amounts: list[int]


def backlog_step_requests(rows: int, admit_divisor: int = ADMIT_DIVISOR) -> int:
    """Requests a prefill step admits under a backlog (at least this many rows free): the controlled window's step."""
    return max(1, rows // admit_divisor)


class Scheduler:
    """The queue, the free rows and the running requests of one load; see the module docstring.
    `admit_all`: every arrived request that finds a row is admitted (no token budget, no backlog rule: a server's
    client). `controlled`: the controlled-split window's rules (the module docstring's last paragraph).
    `admit_divisor`: under a backlog, admit once rows // admit_divisor rows are free."""

    def __init__(self, rows: int, admit_all: bool = False, controlled: bool = False,
                 admit_divisor: int = ADMIT_DIVISOR) -> None:
        self.rows, self.admit_all, self.controlled = rows, admit_all, controlled
        self.backlog_step = backlog_step_requests(rows, admit_divisor)
        self.free: list[int] = list(range(rows))  # a heap: the lowest free row first
        self.running: dict[int, Running] = {}  # by row
        self.queue: deque[Request] = deque()
        self.exhausted = False  # every request of the source has arrived
        self.warmups_left = 0
        self.done = 0
        self.moved = 0  # requests moved down to lower a step's row bucket

    @property
    def free_rows(self) -> int:
        return len(self.free)

    @property
    def warming_up(self) -> bool:
        return self.warmups_left > 0

    @property
    def idle(self) -> bool:
        """Nothing runs and nothing waits."""
        return not self.running and not self.queue

    def admit(self, now_s: float) -> PrefillPlan | None:
        """The arrived requests to prefill now, each in its row (taken), or None."""
        backlog = len(self.queue) > len(self.free)
        step = self.backlog_step
        if backlog and self.running and len(self.free) < step and not (self.admit_all or self.controlled):
            return None
        admitted: list[Request] = []
        budget = float("inf") if self.admit_all else memory.PREFILL_CHUNK_TOKENS
        most = min(len(self.free), step) if self.controlled else len(self.free)
        while self.queue and len(admitted) < most and self.queue[0].arrival_s <= now_s:
            request = self.queue[0]
            if admitted and request.input_tokens > budget:
                break
            self.queue.popleft()
            admitted.append(request)
            budget -= request.input_tokens
        if not admitted:
            return None
        rows = [heapq.heappop(self.free) for _ in admitted]
        for request, row in zip(admitted, rows, strict=True):
            self.running[row] = Running(request, row, request.input_tokens, 1)
        return PrefillPlan(admitted, rows)

    def decode(self) -> DecodePlan | None:
        """The next decode step over every running request, after the moves that lower its row bucket (their
        mirrors advance by its token), or None."""
        if not self.running or (self.controlled and self.queue and self.free):
            return None
        moves = self._compact()
        running = list(self.running.values())
        row_count, attended = step_shape([r.length for r in running], max(self.running), self.rows)
        plan = DecodePlan(moves, row_count, attended, [r.request.id for r in running], [r.row for r in running],
                          [r.length + 1 for r in running])
        for r in running:
            r.length += 1
            r.produced += 1
        return plan

    def release(self, ended: Collection[int] | None = None) -> list[int]:
        """The finished requests' rows, freed (empty: nothing finished). `ended`: the ids of requests that ended
        outside the host's view (a server's finished streams); None: those that produced their output length (the
        engine's host mirrors)."""
        finished = [row for row, r in self.running.items()
                    if (r.produced >= r.request.output_tokens if ended is None else r.request.id in ended)]
        for row in finished:
            request = self.running.pop(row).request
            heapq.heappush(self.free, row)
            self.done += 1
            if request.warmup:
                self.warmups_left -= 1
        return finished

    def _compact(self) -> list[tuple[int, int, int]]:
        """Where the running requests, packed into the lowest rows, would run a smaller row bucket than the highest
        one's: the highest ones move into the lowest free rows until every one lies below that bucket. Elsewhere
        nothing moves (the module docstring: a move pays only for the rows it stops computing)."""
        moves: list[tuple[int, int, int]] = []
        packed = rows_for(len(self.running) - 1, self.rows)
        while (high := max(self.running)) >= packed:
            low = heapq.heapreplace(self.free, high)  # below `packed`: fewer than `packed` rows run
            running = self.running.pop(high)
            running.row = low
            self.running[low] = running
            moves.append((high, low, running.length))
        self.moved += len(moves)
        return moves

    def close_queue(self) -> None:
        """Nothing waiting is admitted any more (the queue "empties" at the end of a `--rate max` window)."""
        self.queue.clear()
