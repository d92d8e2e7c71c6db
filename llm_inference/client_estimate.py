"""A server's work log rebuilt from what its client saw: the per-request fit for servers we cannot instrument.

An OpenAI-compatible server tells its client only when each chunk of output arrived (and, in `usage`, how many
tokens there were). The rebuilt log puts, for each request,
* its prompt tokens (one prefill pass) in the interval before its first chunk: from the last output the client
  saw of any request before it (the server's previous step; output of the same step, which arrives within a
  grid cell, does not count), or from when it was sent if that was later,
* each later chunk's tokens as decoded rows spread evenly over the gap since the chunk before (attended KV
  tokens: its prompt plus the tokens before each one),
on a time grid of a quarter of the load's median gap (1 to 10 ms). In each grid cell the decode passes are the
most rows any one request decoded there (a server step decodes every running request once), and the prefill
passes the largest share of one request's prefill interval. The counter-segment fit (joulebench.request_energy)
then runs on this log as on an engine's own.

What the client cannot see makes it an estimate, labelled "client-side estimate": when inside the gap a token
was computed, and which requests shared a server step. Its error is measured on the in-process engine, whose
own stamps are known: `estimate_error` fits the log rebuilt from the engine's requests as a client would have
seen them, on the same counter, and compares each request's energy with the engine's own fit.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from joulebench.record_types import ClientEstimateError
from joulebench.request_energy import RequestParts, WorkLog, fit_request_energy, request_parts
from jpwr import ValidationError
from jpwr.trace import Knots

METHOD = ("client-side estimate: the server's steps rebuilt from the client's chunk times and token counts "
          "(llm_inference/client_estimate.py), then the counter-segment fit")
MIN_CELL_NS = 1_000_000
MAX_CELL_NS = 10_000_000


@dataclasses.dataclass(frozen=True)
class ClientStream:
    """What a client saw of one request: when it was sent, when each chunk of output arrived, tokens in each."""

    id: int
    sent_ns: int
    input_tokens: int
    chunk_ns: np.ndarray  # int64, chunks with output, in arrival order
    chunk_tokens: np.ndarray  # float, tokens in each

    def merged(self) -> tuple[np.ndarray, np.ndarray]:
        """Chunks read at the same instant as one."""
        times, index = np.unique(self.chunk_ns, return_inverse=True)
        return times, np.bincount(index, weights=self.chunk_tokens, minlength=len(times))


def _median_gap(streams: Sequence[ClientStream], merged: list[tuple[np.ndarray, np.ndarray]]) -> float:
    gaps = np.concatenate([np.diff(times) for times, _ in merged] or [np.zeros(0)])
    if len(gaps):
        return float(np.median(gaps))
    firsts = [s.chunk_ns[0] - s.sent_ns for s in streams if len(s.chunk_ns)]
    return float(np.median(firsts)) if firsts else float(MAX_CELL_NS)


def _pieces(streams: Sequence[ClientStream], merged: list[tuple[np.ndarray, np.ndarray]], cell: float) -> np.ndarray:
    """[pieces, 7]: request, start, end, prefill tokens, prefill passes, rows, KV tokens of each interval."""
    rows: list[tuple[float, ...]] = []
    events = np.unique(np.concatenate([times for times, _ in merged] or [np.zeros(0)]).astype(float))
    for s, (times, tokens) in zip(streams, merged, strict=True):
        if not len(times):
            continue
        first = float(times[0])
        before = np.searchsorted(events, first - cell, side="left")  # events earlier than the same step's output
        previous = float(events[before - 1]) if before else -np.inf
        start = min(max(float(s.sent_ns), previous), first - 1.0)
        extra = max(tokens[0] - 1, 0.0)  # a first chunk of several tokens: the rest decoded in the same interval
        rows.append((s.id, start, first, s.input_tokens, 1.0 if s.input_tokens > 0 else 0.0, extra,
                     extra * (s.input_tokens + 1) + extra * (extra - 1) / 2))
        received = np.concatenate(([0.0], np.cumsum(tokens)))[1:-1]  # tokens received before each later chunk
        k = tokens[1:]
        kv = k * (s.input_tokens + received) + k * (k - 1) / 2
        rows.extend((s.id, float(a), float(b), 0.0, 0.0, float(n), float(v))
                    for a, b, n, v in zip(times[:-1], times[1:], k, kv, strict=True))
    return np.array(rows, dtype=float).reshape(-1, 7)


def client_work_log(streams: Sequence[ClientStream]) -> WorkLog:
    """The rebuilt work log (see the module docstring); refused when no request produced output."""
    merged = [s.merged() for s in streams]
    cell = float(np.clip(_median_gap(streams, merged) / 4, MIN_CELL_NS, MAX_CELL_NS))
    pieces = _pieces(streams, merged, cell)
    if not len(pieces):
        raise ValidationError("no request produced output: there is no work to rebuild",
                              "check the server's log and the requests' failures")
    origin = pieces[:, 1].min()
    first = np.floor((pieces[:, 1] - origin) / cell).astype(np.int64)
    last = np.maximum(np.ceil((pieces[:, 2] - origin) / cell).astype(np.int64), first + 1)  # cells [first, last)
    counts = last - first
    piece = np.repeat(np.arange(len(pieces)), counts)
    cells = first[piece] + (np.arange(len(piece)) - np.repeat(np.cumsum(counts) - counts, counts))
    cell_t0 = origin + cells * cell
    overlap = np.clip(np.minimum(cell_t0 + cell, pieces[piece, 2]) - np.maximum(cell_t0, pieces[piece, 1]), 0, None)
    length = pieces[piece, 2] - pieces[piece, 1]
    share = np.where(length > 0, overlap / np.where(length > 0, length, 1), 1.0 / counts[piece])
    # one member per (cell, request): a request's two intervals meeting in a cell add up
    requests = pieces[piece, 0].astype(np.int64)
    keys, member = _cell_request_members(cells, requests)

    def per_member(values: np.ndarray) -> np.ndarray:
        return np.bincount(member, weights=values * share, minlength=len(keys))

    m_prefill, m_pass, m_rows, m_kv = (per_member(pieces[piece, c]) for c in (3, 4, 5, 6))
    step_cells, step_of_member = np.unique(keys[:, 0], return_inverse=True)
    step_of_member = step_of_member.reshape(-1)
    n = len(step_cells)

    def per_step(values: np.ndarray, how: Any = np.add) -> np.ndarray:
        out = np.zeros(n)
        how.at(out, step_of_member, values)
        return out

    offsets = np.concatenate(([0], np.cumsum(np.bincount(step_of_member, minlength=n)))).astype(np.int64)
    t0 = np.round(origin + step_cells * cell).astype(np.int64)
    t1 = np.round(origin + (step_cells + 1) * cell).astype(np.int64)
    return WorkLog(t0, t1, per_step(m_prefill), per_step(m_pass, np.maximum), per_step(m_rows, np.maximum),
                   per_step(m_rows), per_step(m_kv), offsets, keys[:, 1], m_prefill, m_rows, m_kv)


def _cell_request_members(cells: np.ndarray, requests: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct (cell, request) pairs, sorted by cell then request, and each piece's index among them. One int64
    key per pair (cell * span + request - lowest): a one-dimensional unique, where `np.unique(axis=0)` on the pairs
    sorted millions of rows as raw bytes (half of a sweep's replay time)."""
    low = int(requests.min())
    span = int(requests.max()) - low + 1
    keys, member = np.unique(cells * span + (requests - low), return_inverse=True)
    return np.column_stack([keys // span, keys % span + low]), member.reshape(-1)


def engine_streams(log: WorkLog, arrival_ns: dict[int, int], input_tokens: dict[int, int]) -> list[ClientStream]:
    """The requests of an engine's log as an ideal client would have seen them: sent at arrival, one chunk of
    one token at the end of every step the request took part in (no network or streaming delay)."""
    counts = np.diff(log.member_offsets)
    ends = np.repeat(log.t1_ns, counts)
    order = np.argsort(log.member_request, kind="stable")
    ids, starts = np.unique(log.member_request[order], return_index=True)
    return [ClientStream(int(i), arrival_ns[int(i)], input_tokens[int(i)], chunk, np.ones(len(chunk)))
            for i, chunk in zip(ids, np.split(ends[order], starts[1:]), strict=True)]


def estimate_error(engine: RequestParts, streams: Sequence[ClientStream], lifetimes: np.ndarray,
                   knots: Sequence[Knots], idle_w: float | None, span: tuple[float, float]) -> ClientEstimateError:
    """Each request's energy over `span` from the engine's own log (`engine`: its fit's parts over `span`, as the
    record has them) and from the rebuilt one, same counter: the client-side estimate's error (relative to the
    engine's figure) as median, p90 and of their sum."""
    rebuilt_log = client_work_log(streams)
    rebuilt = request_parts(fit_request_energy(rebuilt_log, knots, idle_w, *span), rebuilt_log, lifetimes, *span)
    done = engine.total_j > 0
    error = (rebuilt.total_j[done] - engine.total_j[done]) / engine.total_j[done]
    result: ClientEstimateError = {
        "method": "the in-process engine's requests, fitted from its own step stamps and from their client-side "
                  "rebuild (one chunk per token at each step's end, sent at arrival), on the same counter",
        "requests": int(done.sum()),
        "relative_error_p50": float(np.median(np.abs(error))) if len(error) else None,
        "relative_error_p90": float(np.quantile(np.abs(error), 0.9)) if len(error) else None,
        "relative_error_of_sum": float(rebuilt.total_j.sum() / engine.total_j.sum() - 1) if done.any() else None}
    result["prefill_relative_error_of_sum"] = _error_of_sum(engine.prefill_j, rebuilt.prefill_j)
    result["decode_relative_error_of_sum"] = _error_of_sum(engine.decode_j, rebuilt.decode_j)
    return result


def _error_of_sum(ours: np.ndarray | None, theirs: np.ndarray | None) -> float | None:
    """One part's energy summed over the requests, rebuilt against the engine's: its relative error."""
    return float(theirs.sum() / ours.sum() - 1) if ours is not None and theirs is not None and ours.sum() > 0 else None
