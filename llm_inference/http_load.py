"""`python -m llm_inference load --url URL | --server-command TEMPLATE`: the load of load.py sent to a server.

The same plans (arrivals, warm-up, window rules), latency figures, SLO goodput, records and per-request table
as the in-process engine; requests go to an OpenAI-compatible server over HTTP (llm_inference/http_client.py),
at most `--max-concurrency` in flight (the client's limit: later arrivals wait in the client's queue, and their
queueing counts in TTFT). Per-request energy is the client-side estimate (llm_inference/client_estimate.py).

A started server (llm_inference/server.py) gets `--server-devices` as CUDA_VISIBLE_DEVICES (else this job's
own binding), and the in-process meter meters the same devices; for `--url` the meter meters `--server-devices`,
and without them energy is n/a with that reason. One server serves every rate of a sweep; it is stopped on every
exit path. A server that dies during a rate makes that rate FAILED with the last lines of its log, and ends the
sweep. A failed or timed-out request is counted and named (record `requests.failures`, table status).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import socket
import sys
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch

from joulebench.launch import LaunchEnv
from joulebench.lifecycle import Lifecycle, Run, RunFailed, StopRequested
from joulebench.record import RunRecord
from joulebench.record_types import OutputTokenCounts, RequestFailures, RequestsBlock
from joulebench.requests_table import FILE_NAME, REQUEST_COLUMNS, STATUSES, RequestsTable
from joulebench.torch_device import resolve_device
from joulebench.waits import wait_until
from jpwr import WindowMeter
from llm_inference import request_metrics, server
from llm_inference.arrivals import Request
from llm_inference.checkpoint import prompt_text
from llm_inference.engine import request_prompt
from llm_inference.http_client import StreamResult, Target, stream
from llm_inference.load_config import LoadConfig, ServerTarget
from llm_inference.load_plan import COUNTER_READ_S, WORK_UNIT, Plan, counted_ids
from llm_inference.load_run import RateOutcome, drawn, run_rates
from llm_inference.presets import ModelPreset
from llm_inference.serve_loop import ArrivalFeed, SaturatedWindow, WindowRule
from llm_inference.serving_energy import RecordedRate, Sweep, client_energy, in_process_counter

HOST = "127.0.0.1"
WAIT_S = 0.05  # the dispatcher looks at arrivals, windows and the stop request at least this often
PROGRESS_EVERY_S = 10.0
FAILURES_LISTED = 20
PRIMING_PROMPT, PRIMING_TOKENS = "w1 w2 w3 w4", 2
EXTERNAL_SERVER = "an external server's processes cannot be told from another job's (--url)"


def _log(text: str) -> None:
    print(f"[llm_inference] {text}", flush=True)


class HttpLoad:
    """The client side of one rate: arrivals into a queue, at most `rows` requests in flight, window edges.
    Offers what the window rules read (serve_loop.LoadState: a row is one request in flight), as the engine's
    scheduler does."""

    def __init__(self, target: Target, rows: int, prompt: Callable[[Request], str]) -> None:
        self.target, self.rows, self.prompt = target, rows, prompt
        self.queue: deque[Request] = deque()
        self.results: dict[int, StreamResult] = {}
        self.in_flight = 0
        self.exhausted = False
        self.warmups_left = 0
        self.done = 0
        self.cond = threading.Condition()
        self.stopping = threading.Event()
        self.sockets: dict[int, socket.socket] = {}

    @property
    def free_rows(self) -> int:
        return self.rows - self.in_flight

    @property
    def warming_up(self) -> bool:
        return self.warmups_left > 0

    def _register(self, request_id: int, sock: socket.socket | None) -> None:
        with self.cond:
            if sock is None:
                self.sockets.pop(request_id, None)
            elif self.stopping.is_set():  # connected while the load stopped: end it now
                _shut(sock)
            else:
                self.sockets[request_id] = sock

    def _one(self, request: Request) -> None:
        result = self.results[request.id]
        try:
            stream(self.target, result, self.prompt(request), request.output_tokens, self.stopping,
                   lambda sock: self._register(request.id, sock))
        finally:
            with self.cond:
                self.in_flight -= 1
                self.done += 1
                self.warmups_left -= request.warmup
                self.cond.notify_all()

    def chunks_read(self) -> int:
        """Chunks read so far: the window's step count (a server step gives each running request one chunk)."""
        return sum(r.chunks for r in list(self.results.values()))

    def _stop_all(self) -> None:
        """Requests in flight end now: their sockets are shut down, later connections at once (`_register`)."""
        with self.cond:
            self.stopping.set()
            for sock in self.sockets.values():
                _shut(sock)

    def run(self, requests: Iterator[Request], rule: WindowRule, on_begin: Callable[[], None],
            on_end: Callable[[float], None], stop: Callable[[], str | None], expected: int | None) -> LoadOutcome:
        """Serve `requests` (in arrival order; endless at `--rate max`) until they are done or a stop request;
        on a stop or an error the requests in flight are ended, never waited for."""
        start_ns = time.monotonic_ns()
        feed = ArrivalFeed(requests, start_ns, self.rows)
        outcome = LoadOutcome(start_ns, feed.arrival_ns)
        pool = ThreadPoolExecutor(max_workers=self.rows, thread_name_prefix="request")
        try:
            self._dispatch(feed, pool, rule, on_begin, on_end, stop, expected, outcome)
        except BaseException:
            self._stop_all()
            raise
        finally:
            if outcome.stop_reason:
                self._stop_all()
            pool.shutdown(wait=True)
        return outcome

    def _dispatch(self, feed: ArrivalFeed, pool: ThreadPoolExecutor, rule: WindowRule, on_begin: Callable[[], None],
                  on_end: Callable[[float], None], stop: Callable[[], str | None], expected: int | None,
                  outcome: LoadOutcome) -> None:
        edges: list[int] = []
        last_progress = time.monotonic()
        with self.cond:
            while True:
                now_s = (time.monotonic_ns() - outcome.start_ns) / 1e9
                self.warmups_left += feed.move_due(self.queue, now_s)
                self.exhausted = feed.exhausted
                outcome.stop_reason = stop()
                if outcome.stop_reason or (not self.in_flight and not self.queue and feed.exhausted):
                    outcome.in_flight_at_end = self.in_flight
                    break
                while self.queue and self.in_flight < self.rows:
                    request = self.queue.popleft()
                    self.results[request.id] = StreamResult(request.id)
                    self.in_flight += 1
                    pool.submit(self._one, request)
                if not edges and rule.begin_now(self, now_s):
                    on_begin()
                    edges.append(time.monotonic_ns())
                elif len(edges) == 1 and rule.end_now(self, now_s):
                    now = time.monotonic_ns()
                    on_end(window_tokens(list(self.results.values()), (edges[0], now)))
                    edges.append(now)
                    if isinstance(rule, SaturatedWindow):  # the queue "empties": nothing more is sent
                        self.queue.clear()
                        feed.close()
                upcoming = feed.upcoming
                # a request due but held back by the full queue waits for a completion (notify), as does an idle one
                due_in = upcoming.arrival_s - now_s if upcoming is not None else 0.0
                self.cond.wait(min(WAIT_S, due_in) if due_in > 0 else WAIT_S)
                if time.monotonic() - last_progress >= PROGRESS_EVERY_S:
                    last_progress = time.monotonic()
                    _log(f"load {now_s:.0f} s | done {self.done}{f'/{expected}' if expected else ''} | in flight "
                         f"{self.in_flight} | queued {len(self.queue)} | {self.done / max(now_s, 1e-9):.3g} req/s")
            if len(edges) == 1:  # stopped inside the window
                now = time.monotonic_ns()
                on_end(window_tokens(list(self.results.values()), (edges[0], now)))
                edges.append(now)
        outcome.window = (edges[0], edges[1]) if len(edges) == 2 else None


@dataclasses.dataclass
class LoadOutcome:
    """What one rate's load gives back: its time zero, the arrivals (ns), the window's edges and why it stopped."""

    start_ns: int
    arrival_ns: dict[int, int]
    window: tuple[int, int] | None = None
    stop_reason: str | None = None
    in_flight_at_end: int = 0


def _shut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


# ---- figures of one rate ------------------------------------------------------------------------------------
def _times(results: dict[int, StreamResult], served: dict[int, Request], arrival_ns: dict[int, int],
           start_ns: int) -> list[request_metrics.RequestTimes]:
    def s(ns: int) -> float:
        return (ns - start_ns) / 1e9

    return [request_metrics.RequestTimes(i, s(arrival_ns[i]), s(r.sent_ns), s(r.chunk_ns[0]), s(r.chunk_ns[-1]),
                                         _input_tokens(r, served[i]), r.output_tokens, served[i].warmup)
            for i, r in results.items() if r.outcome == "done" and r.chunk_ns]


def _input_tokens(result: StreamResult, request: Request) -> int:
    """The server's `usage.prompt_tokens` where it is a positive whole number, else the prompt's own length."""
    reported = (result.usage or {}).get("prompt_tokens")
    return reported if isinstance(reported, int) and not isinstance(reported, bool) and reported > 0 \
        else request.input_tokens


def token_counts(results: dict[int, StreamResult], done: set[int]) -> OutputTokenCounts:
    """The record's `output_token_counts`: finished requests by where their output count came from, and the
    server's counts rejected as implausible (by reason, the first ones with the value sent)."""
    finished = [results[i] for i in sorted(done)]
    rejected = [r for r in finished if r.usage_rejected]
    used = sum(1 for r in finished if r.token_source == "usage")
    return {"from usage": used, "counted from the stream": len(finished) - used, "usage rejected": len(rejected),
            "rejected by reason": dict(Counter(str(r.usage_rejected) for r in rejected).most_common()),
            "rejected first": [{"id": r.id, "reported": r.reported_tokens, "reason": str(r.usage_rejected)}
                               for r in rejected[:FAILURES_LISTED]]}


def window_tokens(results: list[StreamResult], window: tuple[int, int]) -> float:
    """Output tokens produced inside the window: each request's chunks inside, scaled by its `usage` count where
    it reported one (at the window's end requests still in flight have none yet: the load recounts after)."""
    total = 0.0
    for r in results:
        inside = sum(1 for t in r.chunk_ns if window[0] <= t <= window[1])
        total += inside * (r.output_tokens / r.chunks if r.chunks else 0.0)
    return total


def _table(results: dict[int, StreamResult], served: dict[int, Request], arrival_ns: dict[int, int],
           counted: set[int], start_ns: int) -> RequestsTable:
    ids = sorted(served)
    nan = float("nan")

    def seconds(values: list[int | None]) -> np.ndarray:
        return np.array([nan if v is None else (v - start_ns) / 1e9 for v in values])

    got = [results.get(i) for i in ids]
    status = [STATUSES.index("not_admitted") if r is None else STATUSES.index(r.outcome) for r in got]
    columns: dict[str, np.ndarray] = {
        "id": np.array(ids, dtype=np.int64), "arrival_s": seconds([arrival_ns.get(i) for i in ids]),
        "admitted_s": seconds([r.sent_ns if r else None for r in got]),
        "first_token_s": seconds([r.chunk_ns[0] if r and r.chunk_ns else None for r in got]),
        "finish_s": seconds([r.chunk_ns[-1] if r and r.outcome == "done" and r.chunk_ns else None for r in got]),
        "input_tokens": np.array([_input_tokens(r, served[i]) if r else served[i].input_tokens
                                  for i, r in zip(ids, got, strict=True)], dtype=np.int64),
        "output_tokens": np.array([r.output_tokens if r else 0 for r in got], dtype=np.int64),
        "tokens_from_usage": np.array([nan if r is None or r.outcome != "done" else float(r.token_source == "usage")
                                       for r in got]),
        "warmup": np.array([served[i].warmup for i in ids], dtype=np.int8),
        "counted": np.array([i in counted for i in ids], dtype=np.int8), "status": np.array(status, dtype=np.int8)}
    for name in REQUEST_COLUMNS:
        columns.setdefault(name, np.full(len(ids), nan))
    sent = [r for r in got if r is not None]
    offsets = np.cumsum([0, *(r.chunks for r in sent)]).astype(np.int64)
    chunks = {"request": np.array([r.id for r in sent], dtype=np.int64), "chunk_offsets": offsets,
              "chunk_ns": np.array([t for r in sent for t in r.chunk_ns], dtype=np.int64)}
    attrs = {"start_ns": start_ns, "source": "client: chunk arrival times of each streamed request (node's "
                                            "monotonic clock, ns); the server's steps are not known"}
    return RequestsTable(columns, chunks, attrs)


def _failures(results: dict[int, StreamResult]) -> RequestFailures:
    bad = [r for r in results.values() if r.outcome in ("failed", "timed_out")]
    kinds = Counter(r.kind or r.outcome for r in bad)
    return {"count": len(bad), "by_reason": dict(kinds.most_common()),
            "first": [{"id": r.id, "status": r.outcome, "reason": r.error} for r in sorted(bad, key=lambda r: r.id)
                      [:FAILURES_LISTED]]}


# ---- the server, the rates ----------------------------------------------------------------------------------
def _placeholders(cfg: LoadConfig, port: int | None) -> dict[str, str]:
    return {"model": cfg.checkpoint or cfg.preset, "host": HOST, "port": str(port or ""),
            "concurrency": str(cfg.max_concurrency), "python": sys.executable,
            "devices": os.environ.get("CUDA_VISIBLE_DEVICES", "")}


def _start_server(stack: contextlib.ExitStack, cfg: LoadConfig, target: ServerTarget,
                  stop: Callable[[], str | None]) -> StartedServer:
    """The server every rate sends to: started (stopped when `stack` closes) with its log in --out-dir, or the
    one at --url."""
    if not target.command:
        url = target.url or ""
        return StartedServer(url, None, _server_record(cfg, target, url, None, None, None))
    port = target.port or server.free_port(HOST)
    argv = server.render(target.command, _placeholders(cfg, port))
    log_path = Path(cfg.out_dir) / server.LOG_NAME
    _log(f"starting the server: {' '.join(argv)} (log {log_path})")
    running, ready_s = stack.enter_context(server.started(argv, os.environ, log_path, HOST, port,
                                                          target.ready_timeout_s, stop))
    _log(f"server ready after {ready_s:.1f} s on {HOST}:{port}")
    url = f"http://{HOST}:{port}"
    return StartedServer(url, running, _server_record(cfg, target, url, argv, ready_s, str(log_path)))


def _server_record(cfg: LoadConfig, target: ServerTarget, url: str, argv: list[str] | None, ready_s: float | None,
                   log: str | None) -> dict[str, Any]:
    """The record's config `server` block (its first request's seconds follow once it answered)."""
    return {"url": url, "command": argv, "version": server.version(target.version_command,
                                                                   _placeholders(cfg, target.port)),
            "ready_s": ready_s, "log": log, "devices": os.environ.get("CUDA_VISIBLE_DEVICES"), "api": target.api}


def _prime(client: Target, stop: Callable[[], str | None]) -> float:
    """One short request before the first rate: a server may set up its engine at its first request (transformers
    serve's continuous batching: ~30 s on a CPU), which no rate's window should hold. Refused when it fails; a stop
    request ends the wait (StopRequested)."""
    result, stopping, answered = StreamResult(-1), threading.Event(), threading.Event()

    def prime() -> None:
        try:
            stream(client, result, PRIMING_PROMPT, PRIMING_TOKENS, stopping)
        finally:
            answered.set()

    threading.Thread(target=prime, daemon=True).start()
    reason = wait_until(None, stop, answered)
    if reason:
        stopping.set()
        raise StopRequested(f"{reason}: while waiting for the server's first answer")
    if result.outcome != "done":
        raise RunFailed(f"the server did not answer a first request: {result.outcome}: {result.error}")
    seconds = (time.monotonic_ns() - result.sent_ns) / 1e9
    _log(f"first request answered in {seconds:.1f} s (before any window)")
    return seconds


@dataclasses.dataclass
class StartedServer:
    """The server every rate of the sweep sends to: a started one (its process) or one at --url."""

    url: str
    process: server.Server | None
    record: dict[str, Any]  # the record's config `server` block

    def gone(self) -> str | None:
        """Why a started server is gone (its exit and log), or None while it runs (or it is not ours)."""
        return self.process.exited() if self.process is not None else None


@dataclasses.dataclass
class ClientServed:
    """The client's own results of one rate: which requests finished, how many were sent, which failed."""

    done: set[int]
    results: int  # requests sent
    failures: RequestFailures


class HttpServerTarget:
    """An OpenAI-compatible server as a load target (llm_inference/load_run.py): started once (or given by --url),
    primed with one request, metered where its devices are known."""

    def __init__(self, cfg: LoadConfig, shape: ModelPreset, device: torch.device, stack: contextlib.ExitStack
                 ) -> None:
        assert cfg.server is not None
        self.cfg, self.server, self.shape, self.device, self.stack = cfg, cfg.server, shape, device, stack
        self.hardware: dict[str, object] | None = None
        self.sweep = Sweep()
        self.started: StartedServer | None = None
        self.client: Target | None = None
        # a started server runs on the metered devices; a server at --url only where --server-devices names them
        self.meter_devices = self.server.devices is not None or self.server.command is not None

    def config(self) -> dict[str, Any]:
        return {"engine": self.server.engine}

    def describe(self, config: dict[str, Any]) -> None:
        config["server"] = None if self.started is None else self.started.record

    def start(self, run: Run) -> None:
        if not self.server.command:  # --url: the server is no child of this run's, its GPU processes are not ours
            run.processes_unjudged(EXTERNAL_SERVER)
        if self.started is None:
            self.started = _start_server(self.stack, self.cfg, self.server, run.stop.local_reason)
        gone = self.started.gone()
        if gone:
            raise RuntimeError(gone)
        self.client = Target(self.started.url, self.server.api, self.server.served_model or self.cfg.checkpoint
                             or self.cfg.preset, self.server.request_timeout_s, self.server.retries,
                             self.server.request_extra)
        if "first_request_s" not in self.started.record:
            self.started.record["first_request_s"] = _prime(self.client, run.stop.local_reason)

    def open_meter(self, run: Run, cfg: LoadConfig) -> WindowMeter:
        return run.open_meter(methods=cfg.energy_methods if self.meter_devices else None, read_every_s=COUNTER_READ_S)

    def limit_note(self) -> str:
        url = "n/a" if self.started is None else self.started.url
        return f"at most {self.cfg.max_concurrency} requests in flight to {url}"

    def serve(self, run: Run, plan: Plan, served: dict[int, Request], meter: WindowMeter,
              outcome: RateOutcome[ClientServed], say: Callable[[str], None]) -> RequestsBlock:
        assert self.client is not None and self.started is not None
        started, cfg = self.started, self.cfg
        load = HttpLoad(self.client, cfg.max_concurrency,
                        lambda r: prompt_text(request_prompt(r, self.shape.vocab_size, cfg.seed).tolist()))

        def on_end(tokens: float) -> None:
            outcome.steady = meter.end("steady", load.chunks_read(), {WORK_UNIT: tokens})

        ended = load.run(drawn(plan, served), plan.rule, lambda: meter.begin("steady", load.chunks_read()), on_end,
                         lambda: run.stop.local_reason() or started.gone(), plan.expected)
        _settle(load, plan, served, ended, outcome)
        assert outcome.detail is not None and outcome.table is not None
        counts = token_counts(load.results, outcome.detail.done)
        if counts["usage rejected"]:
            run.record.warn(f"{counts['usage rejected']} request(s) reported an implausible usage.completion_tokens "
                            "(counted from the stream instead): "
                            + "; ".join(f"{n} x {k}" for k, n in counts["rejected by reason"].items()))
        return {"file": FILE_NAME, "rows": len(outcome.table), "counted": len(outcome.counted),
                "columns": list(REQUEST_COLUMNS), "chunks": load.chunks_read(), "output_token_counts": counts,
                "failures": outcome.detail.failures}

    def check(self, run: Run, outcome: RateOutcome[ClientServed]) -> None:
        """Failed requests are named; a server gone and a load without one counted success fail the rate."""
        assert outcome.detail is not None and self.started is not None
        failures = outcome.detail.failures
        if failures["count"]:
            run.record.warn(f"{failures['count']} request(s) failed or timed out: "
                            + "; ".join(f"{n} x {k}" for k, n in failures["by_reason"].items()))
        # a stop first: a server it also reached, and cut requests, follow from it
        outcome.stop_reason = run.stop.local_reason()
        if outcome.stop_reason:
            return
        gone = self.started.gone()  # the other reason the load stops early
        if gone:
            raise RuntimeError(f"{gone} (during rate {outcome.label}, {len(outcome.detail.done)} of "
                               f"{outcome.detail.results} requests done)")
        if outcome.counted and not outcome.counted & outcome.detail.done:
            first = failures["first"][0]["reason"] if failures["first"] else None
            raise RuntimeError(f"no counted request succeeded ({failures['count']} failed; first: {first})")

    def figures(self, outcome: RateOutcome[ClientServed]) -> dict[str, Any]:
        return {"engine": self.server.engine}

    def energy_unavailable(self) -> str | None:
        if not self.meter_devices:
            return "an external server (--url) without --server-devices: which devices serve it is not known here"
        return None

    def energy(self, rate: RecordedRate) -> dict[str, Any]:
        return client_energy(rate, in_process_counter(rate), self.sweep)

    def ends_sweep(self, record: RunRecord) -> bool:
        """A FAILED rate without a server (it never started) or with one gone: none can serve another rate."""
        return record.status == "FAILED" and (self.started is None or self.started.gone() is not None)


def _settle(load: HttpLoad, plan: Plan, served: dict[int, Request], ended: LoadOutcome,
            outcome: RateOutcome[ClientServed]) -> None:
    """The rate's outcome from the client's results: what counts, the window's tokens recounted with the usage the
    requests reported after it closed, the table and the streams."""
    results, arrival_ns, window_ns = load.results, ended.arrival_ns, ended.window
    counted = counted_ids({i: r.sent_ns for i, r in results.items()}, window_ns, served, plan.rule)
    if outcome.steady is not None and window_ns is not None:
        outcome.steady.work[WORK_UNIT] = window_tokens(list(results.values()), window_ns)
    outcome.times = [t for t in _times(results, served, arrival_ns, ended.start_ns) if t.id in counted]
    outcome.table = _table(results, served, arrival_ns, counted, ended.start_ns)
    outcome.detail = ClientServed({i for i, r in results.items() if r.outcome == "done"}, len(results),
                                  _failures(results))
    outcome.rule, outcome.counted = plan.rule, counted
    outcome.window_ns, outcome.in_flight_at_end = window_ns, ended.in_flight_at_end


def run(cfg: LoadConfig, shape: ModelPreset, trace: list[Request] | None, launch: LaunchEnv) -> int:
    """Every rate (or the trace) against the server; returns the exit code. Config and trace are validated."""
    assert cfg.server is not None
    device = resolve_device(cfg.device)  # picks the warm-up and window defaults (a GPU here: the server's); unused
    if cfg.server.devices is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = cfg.server.devices  # a started server and the in-process meter: the same
    with Lifecycle("llm_inference", launch, cfg.exit_duration_mins, software_extra=("transformers",)) as life, \
            contextlib.ExitStack() as stack:
        return run_rates(life, cfg, HttpServerTarget(cfg, shape, device, stack), trace, shape, _log,
                         " against the server")
