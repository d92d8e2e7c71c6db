"""When a load's measured window opens and closes, and what it counts: one rule per kind of rate, asked the same way
by the load loop (llm_inference/load_loop.py) and the rate's figures (llm_inference/load_plan.py). Every question a
caller has about the window is the rule's own method, so no caller tells the rules apart.

* finite rates and traces, MLPerf's rule (`ArrivalWindow`): from the first counted arrival to the last; every
  counted arrival counts;
* `--rate max` (`SaturatedWindow`): from the first moment every row is busy (warm-up requests done), for the window
  length; admission stops at its end (the queue "empties"); the requests admitted inside it count.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Mapping
from typing import ClassVar, Protocol

from llm_inference.arrivals import Request


class LoadState(Protocol):
    """What a window rule reads of a load (the scheduler, llm_inference/scheduler.py): a row is one request in flight,
    on the engine and on a server alike."""

    queue: deque[Request]
    exhausted: bool

    @property
    def free_rows(self) -> int: ...

    @property
    def warming_up(self) -> bool: ...


class WindowRule:
    """When the measured window begins and ends and what it counts; the driver's meter calls go in the load's
    `on_begin` / `on_end`."""

    closes_admission: ClassVar[bool] = False  # the window's end stops admission: nothing waiting is served after it
    description: ClassVar[str]  # the record's `window_rule`

    def begin_now(self, load: LoadState, now_s: float) -> bool:
        raise NotImplementedError

    def end_now(self, load: LoadState, now_s: float) -> bool:
        raise NotImplementedError

    def arrival_span_s(self) -> float | None:
        """The counted arrivals' own span, first to last (the offered rate's and the queue judgement's basis); None
        where every request is offered at once."""
        raise NotImplementedError

    def counted(self, admitted_ns: Mapping[int, int], window: tuple[int, int] | None, served: Mapping[int, Request]
                ) -> set[int]:
        """The requests the window's latency figures count, of `served` (admitted: an engine's prefill, a server's
        request sent, on the node's clock)."""
        raise NotImplementedError


@dataclasses.dataclass
class ArrivalWindow(WindowRule):
    """Finite rates and traces (MLPerf's rule): from the first counted arrival to the last one; every counted
    arrival counts (they are all inside the window by construction, and finish after it if they must)."""

    first_s: float
    last_s: float
    description: ClassVar[str] = "first to last counted arrival (MLPerf)"

    def begin_now(self, load: LoadState, now_s: float) -> bool:
        return now_s >= self.first_s

    def end_now(self, load: LoadState, now_s: float) -> bool:
        return now_s >= self.last_s

    def arrival_span_s(self) -> float | None:
        return self.last_s - self.first_s

    def counted(self, admitted_ns: Mapping[int, int], window: tuple[int, int] | None, served: Mapping[int, Request]
                ) -> set[int]:
        return {i for i, r in served.items() if not r.warmup}


@dataclasses.dataclass
class SaturatedWindow(WindowRule):
    """`--rate max`: from the first moment every row is busy, for `seconds` (None: until the queue empties);
    admission stops at its end. The requests admitted inside it count."""

    seconds: float | None
    began_s: float | None = None
    closes_admission: ClassVar[bool] = True
    description: ClassVar[str] = "every slot busy (rate max)"  # a record value, as earlier records have it

    def begin_now(self, load: LoadState, now_s: float) -> bool:
        if load.free_rows == 0 and not load.warming_up:
            self.began_s = now_s
            return True
        return False

    def end_now(self, load: LoadState, now_s: float) -> bool:
        if self.seconds is None:
            return load.exhausted and not load.queue
        return self.began_s is not None and now_s - self.began_s >= self.seconds

    def arrival_span_s(self) -> float | None:
        return None

    def counted(self, admitted_ns: Mapping[int, int], window: tuple[int, int] | None, served: Mapping[int, Request]
                ) -> set[int]:
        if window is None:
            return set()
        w0, w1 = window
        return {i for i, t in admitted_ns.items() if w0 <= t < w1 and not served[i].warmup}
