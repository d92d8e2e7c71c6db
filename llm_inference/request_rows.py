"""One row per request of a load as its target saw it, the one type both targets build their request table and their
finished requests' latencies from: the engine from its step log (llm_inference/load.py), a server's client from its
streams (llm_inference/http_load.py). Times on the node's monotonic clock (ns), None where the moment never came.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from joulebench.requests_table import REQUEST_COLUMNS, RequestStatus
from llm_inference.request_metrics import RequestTimes


@dataclasses.dataclass(frozen=True)
class RequestRow:
    id: int
    arrival_ns: int | None  # None: drawn but not arrived when the load ended
    admitted_ns: int | None  # the engine's prefill or the server's request sent; None: never admitted
    first_token_ns: int | None
    finish_ns: int | None  # its last token, where it is done
    input_tokens: int
    output_tokens: int  # produced
    warmup: bool
    counted: bool  # counted in the window's latency figures
    status: RequestStatus
    tokens_from_usage: float = math.nan  # a server's finished request: 1 from its `usage`, 0 counted from the stream

    @property
    def finished(self) -> bool:
        return self.status is RequestStatus.DONE and self.finish_ns is not None


def request_columns(rows: list[RequestRow], start_ns: int) -> dict[str, np.ndarray]:
    """The request table's columns (every one of REQUEST_COLUMNS; the energy ones NaN until the fit fills them);
    times in seconds from the load's start."""
    def seconds(values: list[int | None]) -> np.ndarray:
        return np.array([math.nan if v is None else (v - start_ns) / 1e9 for v in values])

    columns: dict[str, np.ndarray] = {
        "id": np.array([r.id for r in rows], dtype=np.int64), "arrival_s": seconds([r.arrival_ns for r in rows]),
        "admitted_s": seconds([r.admitted_ns for r in rows]),
        "first_token_s": seconds([r.first_token_ns for r in rows]), "finish_s": seconds([r.finish_ns for r in rows]),
        "input_tokens": np.array([r.input_tokens for r in rows], dtype=np.int64),
        "output_tokens": np.array([r.output_tokens for r in rows], dtype=np.int64),
        "tokens_from_usage": np.array([r.tokens_from_usage for r in rows]),
        "warmup": np.array([r.warmup for r in rows], dtype=np.int8),
        "counted": np.array([r.counted for r in rows], dtype=np.int8),
        "status": np.array([r.status for r in rows], dtype=np.int8)}
    for name in REQUEST_COLUMNS:
        columns.setdefault(name, np.full(len(rows), math.nan))
    return columns


def counted_times(rows: list[RequestRow], start_ns: int) -> list[RequestTimes]:
    """The counted requests that finished, their times in seconds from the load's start (what the latency figures
    read)."""
    def s(ns: int | None) -> float:
        assert ns is not None, "a finished request was admitted and produced its first token"
        return (ns - start_ns) / 1e9

    return [RequestTimes(r.id, s(r.arrival_ns), s(r.admitted_ns), s(r.first_token_ns), s(r.finish_ns), r.input_tokens,
                         r.output_tokens, r.warmup) for r in rows if r.counted and r.finished]
