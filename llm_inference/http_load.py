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
import math
import os
import socket
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch

from joulebench.launch import LaunchEnv
from joulebench.lifecycle import Lifecycle, Run, RunFailed, StopRequested
from joulebench.record import RunRecord
from joulebench.record_types import (
    HardwareBlock,
    LoadMetrics,
    OutputTokenCounts,
    RequestEnergyBlock,
    RequestFailures,
    RequestsBlock,
)
from joulebench.requests_table import FILE_NAME, REQUEST_COLUMNS, RequestsTable, RequestStatus
from joulebench.torch_device import resolve_device
from joulebench.waits import StopCheck, wait_until
from jpwr import WindowMeter
from llm_inference import server
from llm_inference.arrivals import Request
from llm_inference.checkpoint import prompt_text
from llm_inference.engine import request_prompt
from llm_inference.http_client import StreamResult, Target, stream
from llm_inference.load_config import LoadConfig, ServerTarget
from llm_inference.load_loop import LoadEnd, run_load
from llm_inference.load_plan import COUNTER_READ_S, WORK_UNIT, Plan
from llm_inference.load_run import RateOutcome, drawn, run_rates
from llm_inference.presets import ModelPreset
from llm_inference.request_rows import RequestRow, counted_times, request_columns
from llm_inference.scheduler import PrefillPlan, Scheduler
from llm_inference.serving_energy import RecordedRate, Sweep, client_energy, in_process_counter
from llm_inference.window_rules import WindowRule

HOST = "127.0.0.1"
WAIT_S = 0.05  # the dispatcher looks at arrivals, windows and the stop request at least this often
FAILURES_LISTED = 20
PRIMING_PROMPT, PRIMING_TOKENS = "w1 w2 w3 w4", 2
EXTERNAL_SERVER = "an external server's processes cannot be told from another job's (--url)"


def _log(text: str) -> None:
    print(f"[llm_inference] {text}", flush=True)


class HttpLoad:
    """A server's client as the load loop's executor (llm_inference/load_loop.py): a row is one request in flight
    (`rows` = --max-concurrency), admitting sends a request on a thread of its own, the server decodes, and a
    finished stream (done, failed, timed out) releases its row. The loop's thread alone asks the scheduler; a
    request's thread hands its end over through `ended`."""

    def __init__(self, target: Target, rows: int, prompt: Callable[[Request], str]) -> None:
        self.target, self.prompt = target, prompt
        self.scheduler = Scheduler(rows, admit_all=True)  # a server batches on its own: every arrival is sent at once
        self.results: dict[int, StreamResult] = {}
        self.ended: list[int] = []  # requests whose stream ended since the loop last looked (under `cond`)
        self.cond = threading.Condition()
        self.stopping = threading.Event()
        self.sockets: dict[int, socket.socket] = {}
        self.pool: ThreadPoolExecutor | None = None

    def run(self, requests: Iterator[Request], rule: WindowRule, on_begin: Callable[[], None],
            on_end: Callable[[float], None], stop: Callable[[], str | None], expected: int | None) -> LoadEnd:
        """Serve `requests` (in arrival order; endless at `--rate max`) until they are done or a stop request;
        on a stop or an error the requests in flight are ended, never waited for."""
        self.pool = ThreadPoolExecutor(max_workers=self.scheduler.rows, thread_name_prefix="request")
        ended: LoadEnd | None = None
        try:
            ended = run_load(self, requests, rule, on_begin, on_end, stop, expected, _log)
        except BaseException:
            self._stop_all()
            raise
        finally:
            if ended is not None and ended.stop_reason:
                self._stop_all()
            self.pool.shutdown(wait=True)
        return ended

    # ---- the executor ------------------------------------------------------------------------------------
    def progress(self) -> int:
        return self.chunks_read()

    def edge(self) -> None:
        """Nothing to sync: the server's device is not this process's."""

    def admit(self, plan: PrefillPlan) -> None:
        assert self.pool is not None
        for request in plan.requests:
            self.results[request.id] = StreamResult(request.id)
            self.pool.submit(self._one, request)

    def advance(self) -> bool:
        with self.cond:
            ended, self.ended = self.ended, []
        if ended:
            self.scheduler.release(ended)  # the rows freed: a server decodes on its own (no decode plans, no moves)
        return bool(ended)

    def idle(self, until_s: float | None, stop: StopCheck) -> None:
        """Until the next arrival, a stream's end or WAIT_S (the loop asks the stop request that often); a request due
        but held back by the full queue waits for a stream's end as well."""
        due_in = WAIT_S if until_s is None else until_s - time.monotonic()
        with self.cond:
            if not self.ended:
                self.cond.wait(min(WAIT_S, due_in) if due_in > 0 else WAIT_S)

    def window_tokens(self, opened: tuple[int, int], end_ns: int) -> float:
        return window_tokens(list(self.results.values()), (opened[1], end_ns))

    def first_tokens_ns(self) -> dict[int, int]:
        return {i: r.chunk_ns[0] for i, r in list(self.results.items()) if r.chunk_ns}

    # ---- the requests' threads ---------------------------------------------------------------------------
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
                self.ended.append(request.id)
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


def _shut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


# ---- figures of one rate ------------------------------------------------------------------------------------
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


def _rows(results: dict[int, StreamResult], served: dict[int, Request], arrival_ns: dict[int, int],
          counted: set[int]) -> list[RequestRow]:
    """Every drawn request as the client saw it: never sent, or its stream's times, counts and end."""
    rows = []
    for i in sorted(served):
        request, result = served[i], results.get(i)
        if result is None:
            rows.append(RequestRow(i, arrival_ns.get(i), None, None, None, request.input_tokens, 0, request.warmup,
                                   i in counted, RequestStatus.NOT_ADMITTED))
            continue
        status, chunks = RequestStatus[result.outcome.upper()], result.chunk_ns
        done = status is RequestStatus.DONE
        rows.append(RequestRow(i, arrival_ns.get(i), result.sent_ns, chunks[0] if chunks else None,
                               chunks[-1] if done and chunks else None, _input_tokens(result, request),
                               result.output_tokens, request.warmup, i in counted, status,
                               float(result.token_source == "usage") if done else math.nan))
    return rows


def _table(results: dict[int, StreamResult], rows: list[RequestRow], start_ns: int) -> RequestsTable:
    """The per-request rows and each sent request's chunk times (the server's steps are not known here)."""
    sent = [results[row.id] for row in rows if row.id in results]
    offsets = np.cumsum([0, *(r.chunks for r in sent)]).astype(np.int64)
    chunks = {"request": np.array([r.id for r in sent], dtype=np.int64), "chunk_offsets": offsets,
              "chunk_ns": np.array([t for r in sent for t in r.chunk_ns], dtype=np.int64)}
    attrs = {"start_ns": start_ns, "source": "client: chunk arrival times of each streamed request (node's "
                                            "monotonic clock, ns); the server's steps are not known"}
    return RequestsTable(request_columns(rows, start_ns), chunks, attrs)


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
        self.hardware: HardwareBlock | None = None
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

    def figures(self, outcome: RateOutcome[ClientServed]) -> LoadMetrics:
        return {"engine": self.server.engine}

    def energy_unavailable(self) -> str | None:
        if not self.meter_devices:
            return "an external server (--url) without --server-devices: which devices serve it is not known here"
        return None

    def energy(self, rate: RecordedRate) -> RequestEnergyBlock:
        return client_energy(rate, in_process_counter(rate), self.sweep)

    def ends_sweep(self, record: RunRecord) -> bool:
        """A FAILED rate without a server (it never started) or with one gone: none can serve another rate."""
        return record.status == "FAILED" and (self.started is None or self.started.gone() is not None)


def _settle(load: HttpLoad, plan: Plan, served: dict[int, Request], ended: LoadEnd,
            outcome: RateOutcome[ClientServed]) -> None:
    """The rate's outcome from the client's results: what counts, the window's tokens recounted with the usage the
    requests reported after it closed, the table and the streams."""
    results, window_ns = load.results, ended.window
    counted = plan.rule.counted({i: r.sent_ns for i, r in results.items()}, window_ns, served)
    if outcome.steady is not None and window_ns is not None:
        outcome.steady.work[WORK_UNIT] = window_tokens(list(results.values()), window_ns)
    rows = _rows(results, served, ended.arrival_ns, counted)
    outcome.times = counted_times(rows, ended.start_ns)
    outcome.table = _table(results, rows, ended.start_ns)
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
