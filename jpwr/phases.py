"""public: for drivers that time named phases inside a window (WindowMeter.phases is a PhaseRecorder).

Phase marks: named sub-windows of each training step (forward, backward, optimizer, gradient reduction).

The meter stores whatever names a driver marks; the names the drivers share, and the replay of each phase
alone, are the core's (joulebench.phases).

Why device events: the host runs ahead of the GPU, so a host timestamp says when a phase was queued, not
when it ran. The recorder takes a stamp at each phase boundary without waiting for the device (a CUDA event
recorded on the current stream; on a CPU the host's monotonic clock, which is when CPU work runs) and turns
the stamps into the node's monotonic time only when a window ends, through the window's synced edges: right
after a device sync the device is idle, so an event recorded just before the sync completes just before the
sync returns, at a known host time. Events in between are placed linearly between the two edges by their
device-side elapsed time.

Time belongs to the innermost open phase (a phase begun inside another takes over until it ends), so the
phases of a step never overlap; time in no phase is unmarked. One window's intervals go to the sampler
once, when the window ends (split over a few datagrams for long windows), never per step.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Iterator, Sequence
from typing import Any, Protocol, TypedDict

from jpwr.clock import SYSTEM_CLOCK, Clock

__all__ = ["DeviceEventStamps", "HostStamps", "PhaseRecorder"]

MAX_PART_BYTES = 60_000  # one datagram (the sampler reads up to 65,507 bytes)


class Stamps(Protocol):
    """Where phase boundaries are stamped: device events or host time."""

    clock: str  # "device_events" or "host", stored with the intervals

    def stamp(self) -> Any:
        """Take a stamp now (on the device: enqueue it, never wait)."""
        ...

    def host_times(self, stamps: Sequence[Any], edges: Sequence[tuple[int, int]]) -> list[int]:
        """Monotonic ns of `stamps`, given synced edges (index into stamps, host ns), first and last included."""
        ...

    def release(self, stamps: Sequence[Any]) -> None:
        """The stamps will not be read again (device events go back to a pool)."""
        ...


class HostStamps:
    """CPU runs: work happens when the host calls it, so the host's monotonic clock is the phase clock."""

    clock = "host"

    def __init__(self, clock: Clock = SYSTEM_CLOCK) -> None:
        self._clock = clock

    def stamp(self) -> int:
        return self._clock.monotonic_ns()

    def host_times(self, stamps: Sequence[Any], edges: Sequence[tuple[int, int]]) -> list[int]:
        return [int(s) for s in stamps]

    def release(self, stamps: Sequence[Any]) -> None:
        """Host stamps are plain integers: nothing to release."""


def place_between(edge_a_ns: int, edge_b_ns: int, elapsed_a_b_ms: float, elapsed_a_x_ms: float) -> int:
    """Host time of a device event x between two synced edges a and b, by its device-side elapsed time.

    The device timer and the host clock may run at slightly different rates; scaling by the two edges
    keeps every event inside the window. Edges closer than the timer resolution fall back to the offset.
    """
    if elapsed_a_b_ms > 0:
        return edge_a_ns + round(elapsed_a_x_ms / elapsed_a_b_ms * (edge_b_ns - edge_a_ns))
    return edge_a_ns + round(elapsed_a_x_ms * 1e6)


class DeviceEventStamps:
    """CUDA (or ROCm) events recorded on the current stream; `torch` is passed in (jpwr never imports it)."""

    clock = "device_events"

    def __init__(self, torch: Any) -> None:
        self._torch = torch
        self._pool: list[Any] = []

    def stamp(self) -> Any:
        event = self._pool.pop() if self._pool else self._torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def host_times(self, stamps: Sequence[Any], edges: Sequence[tuple[int, int]]) -> list[int]:
        times: list[int] = []
        j, span_ms = -1, 0.0
        for i, event in enumerate(stamps):
            bracket = j if j >= 0 else 0
            while bracket + 2 < len(edges) and i > edges[bracket + 1][0]:
                bracket += 1
            (ia, ta), (ib, tb) = edges[bracket], edges[bracket + 1]
            if bracket != j:  # the two edges' device-side distance, once per pair of edges
                j, span_ms = bracket, stamps[ia].elapsed_time(stamps[ib])
            times.append(place_between(ta, tb, span_ms, stamps[ia].elapsed_time(event)))
        return times

    def release(self, stamps: Sequence[Any]) -> None:
        self._pool.extend(stamps)


class PhaseBatchDict(TypedDict):
    """A PhaseBatch on the wire and in segments (PhaseBatch.to_dict): its times from `base_ns`, in ns."""

    window: str
    rank: int
    local_rank: int
    clock: str
    names: list[str]
    phase: list[int]
    base_ns: int
    t0: list[int]
    t1: list[int]
    part: int
    parts: int


@dataclasses.dataclass(frozen=True)
class PhaseBatch:
    """One rank's phase intervals inside one window (or one part of them), on the node's monotonic clock."""

    window: str
    rank: int
    local_rank: int
    clock: str
    names: tuple[str, ...]
    phase: tuple[int, ...]  # index into names, per interval
    t0_ns: tuple[int, ...]
    t1_ns: tuple[int, ...]
    part: int = 1
    parts: int = 1

    def __len__(self) -> int:
        return len(self.phase)

    def intervals(self) -> Iterator[tuple[str, int, int]]:
        for k, a, b in zip(self.phase, self.t0_ns, self.t1_ns, strict=True):
            yield self.names[k], a, b

    def to_dict(self) -> PhaseBatchDict:
        """Wire and segment form: times relative to the first interval's start keep datagrams small."""
        base = self.t0_ns[0] if self.t0_ns else 0
        return {"window": self.window, "rank": self.rank, "local_rank": self.local_rank, "clock": self.clock,
                "names": list(self.names), "phase": list(self.phase), "base_ns": base,
                "t0": [t - base for t in self.t0_ns], "t1": [t - base for t in self.t1_ns],
                "part": self.part, "parts": self.parts}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PhaseBatch:
        base = int(data.get("base_ns", 0))
        return cls(window=str(data["window"]), rank=int(data.get("rank", 0)),
                   local_rank=int(data.get("local_rank", 0)), clock=str(data.get("clock", "host")),
                   names=tuple(str(n) for n in data["names"]), phase=tuple(int(k) for k in data["phase"]),
                   t0_ns=tuple(base + int(t) for t in data["t0"]), t1_ns=tuple(base + int(t) for t in data["t1"]),
                   part=int(data.get("part", 1)), parts=int(data.get("parts", 1)))

    def split(self, max_bytes: int = MAX_PART_BYTES) -> list[PhaseBatch]:
        """Parts whose JSON form fits one datagram each; every part is a valid batch on its own."""
        pieces = [self]
        while any(len(p) > 1 and len(json.dumps(p.to_dict())) > max_bytes for p in pieces):
            pieces = [half for p in pieces for half in (p._halves() if len(json.dumps(p.to_dict())) > max_bytes
                                                        else (p,))]
        return [dataclasses.replace(p, part=i + 1, parts=len(pieces)) for i, p in enumerate(pieces)]

    def _halves(self) -> tuple[PhaseBatch, PhaseBatch]:
        m = len(self) // 2
        return (dataclasses.replace(self, phase=self.phase[:m], t0_ns=self.t0_ns[:m], t1_ns=self.t1_ns[:m]),
                dataclasses.replace(self, phase=self.phase[m:], t0_ns=self.t0_ns[m:], t1_ns=self.t1_ns[m:]))


class _PhaseContext:
    """`with recorder.phase(name):` without a generator's cost on every step."""

    __slots__ = ("name", "recorder")

    def __init__(self, recorder: PhaseRecorder, name: str) -> None:
        self.recorder, self.name = recorder, name

    def __enter__(self) -> None:
        self.recorder.begin(self.name)

    def __exit__(self, *exc: object) -> None:
        self.recorder.end(self.name)


_NO_PHASE = contextlib.nullcontext()  # reusable: what `phase()` returns while the recorder is off


class PhaseRecorder:
    """One rank's phase marks; the WindowMeter feeds it the synced window edges and sends its batches.

    Disabled (no sampler to store the marks, or switched off for an overhead comparison), `phase()` is a
    shared no-op context and begin/end return at once. While no window is open only the stack of open
    phases is kept; stamps are taken only inside windows.
    """

    def __init__(self, stamps: Stamps | None = None, enabled: bool = True) -> None:
        self.stamps: Stamps = stamps or HostStamps()
        self._enabled = enabled
        self._stack: list[str] = []
        self._contexts: dict[str, _PhaseContext] = {}
        self._names: dict[str, int] = {}
        self._raw: list[Any] = []  # stamps of the open windows, in the order taken
        self._edges: list[tuple[int, int]] = []  # (index into _raw, host ns) of synced window edges
        self._intervals: list[tuple[int, int, int]] = []  # (name index, stamp index a, stamp index b)
        self._last: int | None = None  # stamp index of the last boundary inside a window
        self._windows: dict[str, int] = {}  # open window -> index of its begin edge stamp

    @property
    def enabled(self) -> bool:
        return self._enabled

    @enabled.setter
    def enabled(self, on: bool) -> None:
        """Switch between steps only: the stack of open phases starts empty either way."""
        self._enabled = on
        self._stack.clear()

    @property
    def current(self) -> str | None:
        """The innermost open phase (None when none is open or the recorder is off)."""
        return self._stack[-1] if self._stack else None

    def set_stamps(self, stamps: Stamps) -> None:
        if self._windows:
            raise RuntimeError("phase stamps changed while a window is open")
        self.stamps = stamps

    # --- marking (the training loop) --------------------------------------------------------------------
    def phase(self, name: str) -> contextlib.AbstractContextManager[None]:
        if not self._enabled:
            return _NO_PHASE
        context = self._contexts.get(name)
        if context is None:
            context = self._contexts[name] = _PhaseContext(self, name)
        return context

    def begin(self, name: str) -> None:
        if not self._enabled:
            return
        self._boundary()
        self._stack.append(name)

    def end(self, name: str) -> None:
        """Close `name` and any phase begun inside it that is still open."""
        if not self._enabled:
            return
        if name not in self._stack:
            raise RuntimeError(f"phase {name!r} ended but not begun (open: {self._stack or 'none'})")
        self._boundary()
        while self._stack.pop() != name:
            pass

    def _boundary(self) -> None:
        if not self._windows:
            return
        index = len(self._raw)
        self._raw.append(self.stamps.stamp())
        if self._stack and self._last is not None:
            self._intervals.append((self._name_index(self._stack[-1]), self._last, index))
        self._last = index

    def _name_index(self, name: str) -> int:
        index = self._names.get(name)
        if index is None:
            index = self._names[name] = len(self._names)
        return index

    # --- window edges (the WindowMeter) -----------------------------------------------------------------
    def edge_stamp(self) -> Any | None:
        """Stamp taken just before the meter's device sync at a window edge (None when disabled)."""
        return self.stamps.stamp() if self._enabled else None

    def window_begin(self, window: str, stamp: Any, t_ns: int) -> None:
        if stamp is None:
            return
        self._raw.append(stamp)
        index = len(self._raw) - 1
        self._edges.append((index, t_ns))
        self._windows[window] = index
        self._last = index  # a phase open at the window's begin counts from here

    def window_end(self, window: str, stamp: Any, t_ns: int, rank: int, local_rank: int) -> PhaseBatch | None:
        """Close the window's recording; its intervals as a batch (None when nothing was recorded)."""
        begin = self._windows.pop(window, None)
        batch = None if stamp is None or begin is None else self._close(window, begin, stamp, t_ns, rank, local_rank)
        if not self._windows:  # nothing open any more: start afresh (events go back to the pool)
            self.stamps.release(self._raw)
            self._raw, self._edges, self._intervals, self._last = [], [], [], None
        return batch

    def _close(self, window: str, begin: int, stamp: Any, t_ns: int, rank: int, local_rank: int) -> PhaseBatch | None:
        self._raw.append(stamp)
        end = len(self._raw) - 1
        if self._stack and self._last is not None:  # a phase open at the window's end counts up to it
            self._intervals.append((self._name_index(self._stack[-1]), self._last, end))
        self._edges.append((end, t_ns))
        self._last = end
        times = self.stamps.host_times(self._raw, self._edges)
        inside = [(k, a, b) for k, a, b in self._intervals if a >= begin and b <= end]
        if not inside:
            return None
        names = sorted(self._names, key=self._names.__getitem__)
        return PhaseBatch(window, rank, local_rank, self.stamps.clock, tuple(names), tuple(k for k, _, _ in inside),
                          tuple(times[a] for _, a, _ in inside), tuple(times[b] for _, _, b in inside))


class PhaseRow(TypedDict, total=False):
    """One rank's phase in a window (phase_summary): its intervals, their seconds, and whether every part of the
    rank's batch arrived."""

    rank: int
    local_rank: int
    phase: str
    intervals: int
    seconds: float
    complete: bool


def phase_summary(batches: Sequence[PhaseBatch]) -> list[PhaseRow]:
    """Per rank and phase of one window: intervals and seconds, and whether every part of the batch arrived."""
    rows: dict[tuple[int, str], PhaseRow] = {}
    parts: dict[int, tuple[set[int], int]] = {}
    for batch in batches:
        seen, expected = parts.get(batch.rank, (set(), batch.parts))
        seen.add(batch.part)
        parts[batch.rank] = (seen, max(expected, batch.parts))
        for name, a, b in batch.intervals():
            row = rows.setdefault((batch.rank, name), {"rank": batch.rank, "local_rank": batch.local_rank,
                                                        "phase": name, "intervals": 0, "seconds": 0.0})
            row["intervals"] += 1
            row["seconds"] += (b - a) / 1e9
    for (rank, _), row in rows.items():
        seen, expected = parts[rank]
        row["complete"] = len(seen) == expected
    return [row for _, row in sorted(rows.items(), key=lambda item: item[0])]
