"""The node-local channel between training ranks and their node's sampler.

Ranks send window marks as small JSON datagrams over a Unix socket whose path is in
JPWR_ADDR; a send costs microseconds and never blocks the training loop. A window's phase
intervals follow its end mark as one batch (a few datagrams when long), sent blocking with a
timeout: the window has ended, and a full socket queue must not drop them. The path may hold
"{node}", replaced by the node name, so that test "nodes" sharing one host (and one /tmp)
each reach their own sampler. A query (window energies) waits for the sampler's reply.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import socket
from collections.abc import Sequence
from typing import Any, Protocol, TypedDict

from jpwr.live import NodeLiveDict
from jpwr.node import node_name
from jpwr.phases import PhaseBatch

ADDR_ENV = "JPWR_ADDR"
MAX_DATAGRAM = 65507
PHASES_SEND_TIMEOUT_S = 5.0
INTERVAL_PREFIX = "log/"  # WindowMeter.mark_interval's edges: log intervals inside a window, never windows
SAMPLER_LOST = "sampler_lost"  # a query's reply for a window when the sampler is gone (killed, its socket removed)


def is_interval_mark(name: str) -> bool:
    """A log interval's name, not a window's: no window of a summary, no Prometheus `window` label."""
    return name.startswith(INTERVAL_PREFIX)


class MarkDict(TypedDict):
    """A Mark on the wire and in traces (Mark.to_dict)."""

    name: str
    edge: str
    step: int
    t_ns: int
    rank: int
    local_rank: int
    work: dict[str, float]


@dataclasses.dataclass(frozen=True)
class Mark:
    """One window edge as seen by one rank, on that node's monotonic clock."""

    name: str
    edge: str  # "begin" or "end"
    step: int
    t_ns: int
    rank: int = 0
    local_rank: int = 0
    work: tuple[tuple[str, float], ...] = ()

    def to_dict(self) -> MarkDict:
        return {"name": self.name, "edge": self.edge, "step": self.step, "t_ns": self.t_ns, "rank": self.rank,
                "local_rank": self.local_rank, "work": dict(self.work)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Mark:
        return cls(
            name=str(data["name"]), edge=str(data["edge"]), step=int(data["step"]), t_ns=int(data["t_ns"]),
            rank=int(data.get("rank", 0)), local_rank=int(data.get("local_rank", 0)),
            work=tuple(sorted((str(k), float(v)) for k, v in dict(data.get("work", {})).items())),
        )


class Channel(Protocol):
    """How a rank reaches its sampler: over the socket, or directly in library mode."""

    def send_mark(self, mark: Mark) -> None: ...

    def send_phases(self, batch: PhaseBatch) -> None: ...

    def query_energy(self, names: Sequence[str], timeout_s: float) -> dict[str, dict[str, Any]]: ...

    def query_live(self, span_s: float, timeout_s: float) -> NodeLiveDict: ...

    def close(self) -> None: ...


def resolve_addr(template: str, environ: dict[str, str] | None = None) -> str:
    return template.replace("{node}", node_name(environ))


class SocketChannel:
    """Client side of the sampler socket (Linux abstract autobind for replies)."""

    def __init__(self, addr: str) -> None:
        self.addr = addr
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.bind("")  # autobind: an abstract address the sampler can reply to
        self._sock.setblocking(False)
        self.lost: str | None = None  # the first sign that the sampler is gone: what its socket refused, and when

    def _lose(self, what: str, exc: OSError) -> None:
        if self.lost is None:
            self.lost = f"its socket refused {what} ({type(exc).__name__})"

    def send_mark(self, mark: Mark) -> None:
        payload = json.dumps({"type": "mark", **mark.to_dict()}).encode()
        # A full socket buffer or a sampler that died must not stop training: the mark is lost, and a sampler that
        # is gone is remembered (`lost`): the windows' energy is then not known (query_energy says why).
        with contextlib.suppress(BlockingIOError):
            try:
                self._sock.sendto(payload, self.addr)
            except (FileNotFoundError, ConnectionRefusedError) as exc:
                self._lose(f"the {mark.name!r} {mark.edge} mark", exc)

    def send_phases(self, batch: PhaseBatch) -> None:
        """Every part of the batch, each in its own datagram; a sampler that is gone loses them (as marks)."""
        self._sock.settimeout(PHASES_SEND_TIMEOUT_S)
        try:
            for part in batch.split():
                payload = json.dumps({"type": "phases", **part.to_dict()}, separators=(",", ":")).encode()
                self._sock.sendto(payload, self.addr)
        except TimeoutError:
            pass
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            self._lose(f"the {batch.window!r} window's phases", exc)
        finally:
            self._sock.setblocking(False)

    def _ask(self, request: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        """Send a request and wait for the sampler's reply; raises OSError/TimeoutError when it does not answer."""
        self._sock.setblocking(True)
        self._sock.settimeout(timeout_s)
        try:
            self._sock.sendto(json.dumps({**request, "pid": os.getpid()}).encode(), self.addr)
            return dict(json.loads(self._sock.recv(MAX_DATAGRAM * 16)))
        finally:
            self._sock.setblocking(False)

    def query_energy(self, names: Sequence[str], timeout_s: float) -> dict[str, dict[str, Any]]:
        """Each window's energy as the sampler answers; a sampler that is gone (or never answers) is lost: each
        window's reply then says so (SAMPLER_LOST), since none of their energy can be known from here."""
        try:
            reply = self._ask({"type": "query", "names": list(names)}, timeout_s)
        except (TimeoutError, FileNotFoundError, ConnectionRefusedError) as exc:
            why = self.lost or f"it did not answer the energy query ({type(exc).__name__}: {exc})"
            reason = (f"the node's jpwr sampler was lost during the run (at {self.addr}: {why}; killed?): the "
                      "windows' energy is not known")
            return {name: {"unavailable_reason": reason, SAMPLER_LOST: True} for name in names}
        return dict(reply.get("windows", {}))

    def query_live(self, span_s: float, timeout_s: float) -> NodeLiveDict:
        try:
            live: NodeLiveDict = self._ask({"type": "live", "span_s": span_s}, timeout_s).get("live", {})  # the JSON
            return live
        except (TimeoutError, FileNotFoundError, ConnectionRefusedError) as exc:
            return {"span_s": span_s, "devices": [], "reason": f"sampler at {self.addr} did not answer: {exc}"}

    def close(self) -> None:
        self._sock.close()


def channel_from_env(environ: dict[str, str] | None = None) -> SocketChannel | None:
    env = dict(os.environ if environ is None else environ)
    template = env.get(ADDR_ENV)
    return SocketChannel(resolve_addr(template, env)) if template else None
