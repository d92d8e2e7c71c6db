"""One streamed request to an OpenAI-compatible server, every chunk stamped on the node's monotonic clock.

`POST /v1/completions` (a prompt) or `/v1/chat/completions` (one user message), `"stream": true` with
`"stream_options": {"include_usage": true}`: the server answers with server-sent events, one `data: {json}` line
per chunk, and ends with `data: [DONE]` (OpenAI, vLLM) or by closing the stream after a chunk with a
`finish_reason` (transformers serve 5.24). Output tokens come from the final `usage` where the server reports it and
the count is plausible (a positive whole number, within the request's `max_tokens`, not below the chunks that carried
text: a server's number is not taken on faith), else one per chunk with text (the result says which, and why a
reported count was rejected). Standard library only (http.client), one thread per request
in flight: the load generator bounds them by `--max-concurrency`.

Faults end the request with a status and a named reason, never silently: `failed` (connection refused after the
retries, an HTTP error with the start of its body, an error event, a malformed event-stream line, the connection
reset or closed before `[DONE]`), `timed_out` (no `[DONE]` within the request timeout), `unfinished` (the load was
stopped). Retries happen only where no connection was made (refused or reset while connecting): nothing was sent,
so a retried request never doubles work the server started.
"""

from __future__ import annotations

import argparse
import dataclasses
import http.client
import json
import socket
import threading
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

APIS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}
RETRY_PAUSE_S = 0.5
BODY_SHOWN = 300  # characters of an error answer kept in the reason
LINE_SHOWN = 120


@dataclasses.dataclass(frozen=True)
class Target:
    """Where and how requests go; `extra` is merged into every request body (e.g. vLLM's {"ignore_eos": true})."""

    url: str
    api: str
    model: str
    timeout_s: float
    retries: int
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def host_port(self) -> tuple[str, int]:
        parts = urlsplit(self.url)
        return parts.hostname or "127.0.0.1", parts.port or 80

    def body(self, prompt: str, max_tokens: int) -> dict[str, Any]:
        content: dict[str, Any] = ({"prompt": prompt} if self.api == "completions"
                                   else {"messages": [{"role": "user", "content": prompt}]})
        return {"model": self.model, **content, "max_tokens": max_tokens, "stream": True,
                "stream_options": {"include_usage": True}, "temperature": 0.0, **self.extra}


def parse_url(text: str) -> str:
    """An argparse `type` for --url: http://host:port (no path: the API paths are fixed), trailing / dropped."""
    parts = urlsplit(text.strip())
    if parts.scheme != "http" or not parts.hostname or parts.path.strip("/") or parts.query:
        raise argparse.ArgumentTypeError(f"{text!r} is not a server's base URL: give http://HOST:PORT (https and "
                                         "paths are not supported; the client adds /v1/completions or "
                                         "/v1/chat/completions)")
    return f"http://{parts.netloc}"


@dataclasses.dataclass
class StreamResult:
    """One request as the client saw it (times in ns, the node's monotonic clock)."""

    id: int
    sent_ns: int = 0
    chunk_ns: list[int] = dataclasses.field(default_factory=list)
    usage: dict[str, Any] | None = None
    outcome: str = "unfinished"  # done | failed | timed_out | unfinished (the table's status)
    kind: str | None = None  # the fault's kind, fixed words (the record groups failures by it)
    error: str | None = None  # the fault in full
    http_status: int | None = None
    attempts: int = 0
    max_tokens: int | None = None  # the request's limit (`max_tokens` sent)

    @property
    def chunks(self) -> int:
        return len(self.chunk_ns)

    @property
    def reported_tokens(self) -> Any:
        """`usage.completion_tokens` as the server sent it (any JSON value), None where it sent none."""
        return (self.usage or {}).get("completion_tokens")

    @property
    def usage_rejected(self) -> str | None:
        """Why a finished request's reported output count is not used (None: used, or nothing reported)."""
        if self.outcome != "done" or self.reported_tokens is None:
            return None
        return implausible_count(self.reported_tokens, self.max_tokens, self.chunks)

    @property
    def _reported_tokens(self) -> int | None:
        """`usage.completion_tokens` of a finished request, where the server reported a plausible one."""
        if self.outcome != "done" or self.reported_tokens is None or self.usage_rejected:
            return None
        return int(self.reported_tokens)

    @property
    def output_tokens(self) -> int:
        """From `usage` where reported and plausible, else one per chunk with text."""
        reported = self._reported_tokens
        return self.chunks if reported is None else reported

    @property
    def token_source(self) -> str:
        """"usage" (the server's count), "stream" (none reported) or "stream, usage rejected"."""
        if self._reported_tokens is not None:
            return "usage"
        return "stream, usage rejected" if self.usage_rejected else "stream"

    def end(self, outcome: str, kind: str, error: str) -> None:
        self.outcome, self.kind, self.error = outcome, kind, error


def implausible_count(reported: Any, max_tokens: int | None, text_chunks: int) -> str | None:
    """Why a server's output token count cannot be true (None: plausible): not a whole number, not positive, above
    the request's limit, or below the chunks that carried text (each carried at least one token)."""
    if isinstance(reported, bool) or not isinstance(reported, int):
        return "not a whole number"
    if reported <= 0:
        return "not positive"
    if max_tokens is not None and reported > max_tokens:
        return "above the request's max_tokens"
    if reported < text_chunks:
        return "below the chunks that carried text"
    return None


class StreamError(Exception):
    """The request ends here with `outcome`, a fixed `kind` and the message as its reason."""

    def __init__(self, outcome: str, kind: str, reason: str) -> None:
        super().__init__(reason)
        self.outcome, self.kind = outcome, kind


STOPPED = ("unfinished", "stopped", "the load was stopped")


def stream(target: Target, result: StreamResult, prompt: str, max_tokens: int, stop: threading.Event,
           register: Callable[[socket.socket | None], None] = lambda sock: None) -> StreamResult:
    """Send one request and read its stream to the end, filling `result` as chunks arrive (a load reads the
    chunks of requests in flight at its window's edges); `register` is told the connection's socket (and None
    when done) so that a stopping load can shut it down. Whatever ends it, the result says how."""
    result.sent_ns, result.max_tokens = time.monotonic_ns(), max_tokens
    deadline = time.monotonic() + target.timeout_s
    try:
        response, connection = _open(target, prompt, max_tokens, result, deadline, stop, register)
        try:
            _read_events(response, connection, result, deadline, target.api)
        finally:
            connection.close()
    except StreamError as exc:
        result.end(exc.outcome, exc.kind, str(exc))
    except TimeoutError:
        result.end("timed_out", "timed out", f"no end of stream within {target.timeout_s:g} s ({result.chunks} "
                                             "chunks read)")
    except (ConnectionError, http.client.HTTPException, OSError) as exc:
        result.end("failed", "connection lost", f"connection lost after {result.chunks} chunks "
                                                f"({type(exc).__name__}: {exc})")
    except Exception as exc:  # an answer this client cannot read: the request fails, the load goes on
        result.end("failed", "unreadable answer", f"unreadable answer after {result.chunks} chunks "
                                                  f"({type(exc).__name__}: {exc})")
    finally:
        register(None)
    if stop.is_set() and result.outcome != "done":
        result.end(*STOPPED)  # whatever the shut-down socket looked like to the reader
    return result


def _open(target: Target, prompt: str, max_tokens: int, result: StreamResult, deadline: float,
          stop: threading.Event, register: Callable[[socket.socket | None], None]
          ) -> tuple[http.client.HTTPResponse, http.client.HTTPConnection]:
    """Connect (retried only while no connection was made: nothing was sent), send and read the status line."""
    host, port = target.host_port
    payload = json.dumps(target.body(prompt, max_tokens)).encode()
    while True:
        if stop.is_set():
            raise StreamError(*STOPPED)
        result.attempts += 1
        connection = http.client.HTTPConnection(host, port, timeout=max(0.001, deadline - time.monotonic()))
        try:
            connection.connect()
            break
        except (ConnectionRefusedError, ConnectionResetError) as exc:
            connection.close()
            if result.attempts > target.retries or time.monotonic() + RETRY_PAUSE_S > deadline:
                raise StreamError("failed", "no connection", f"no connection after {result.attempts} attempt(s) "
                                                             f"({type(exc).__name__}: {exc})") from None
            time.sleep(RETRY_PAUSE_S)
    register(connection.sock)
    connection.request("POST", APIS[target.api], body=payload,
                       headers={"Content-Type": "application/json", "Accept": "text/event-stream"})
    response = connection.getresponse()
    result.http_status = response.status
    if response.status != 200:
        body = response.read(4 * BODY_SHOWN).decode("utf-8", "replace").strip()
        connection.close()
        raise StreamError("failed", f"HTTP {response.status}", f"HTTP {response.status} {response.reason}: "
                                                              f"{body[:BODY_SHOWN]}")
    return response, connection


def _read_events(response: http.client.HTTPResponse, connection: http.client.HTTPConnection, result: StreamResult,
                 deadline: float, api: str) -> None:
    """Read `data:` lines until `[DONE]`, or the end of the stream after a `finish_reason`; each chunk with text
    is stamped as it is read."""
    finished = False
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError
        if connection.sock is not None:
            connection.sock.settimeout(remaining)
        raw = response.readline()
        if not raw:
            if finished:
                result.outcome = "done"
                return
            raise StreamError("failed", "stream ended early", f"the server closed the stream without a finish_reason "
                                                              f"or [DONE] after {result.chunks} chunks")
        line = raw.decode("utf-8", "replace").rstrip("\r\n")
        if not line or line.startswith(":") or line.split(":", 1)[0] in ("event", "id", "retry"):
            continue
        if not line.startswith("data:"):
            raise StreamError("failed", "malformed event-stream line", f"malformed event-stream line "
                                                                       f"{line[:LINE_SHOWN]!r}")
        data = line[5:].strip()
        if data == "[DONE]":
            result.outcome = "done"
            return
        try:
            event = json.loads(data)
        except json.JSONDecodeError:
            raise StreamError("failed", "malformed event-stream line", f"malformed event-stream line "
                                                                       f"{line[:LINE_SHOWN]!r} (not JSON)") from None
        if not isinstance(event, dict):
            raise StreamError("failed", "malformed event-stream line", f"malformed event-stream line "
                                                                       f"{line[:LINE_SHOWN]!r} (not an object)")
        if event.get("error"):
            raise StreamError("failed", "error event", f"error event: {json.dumps(event['error'])[:BODY_SHOWN]}")
        if _text(event, api):
            result.chunk_ns.append(time.monotonic_ns())
        finished = finished or any(isinstance(c, dict) and c.get("finish_reason") for c in event.get("choices") or [])
        if isinstance(event.get("usage"), dict):
            result.usage = event["usage"]


def _text(event: dict[str, Any], api: str) -> str:
    choices = event.get("choices") or []
    if not choices or not isinstance(choices[0], dict):
        return ""
    choice = choices[0]
    text = choice.get("text") if api == "completions" else (choice.get("delta") or {}).get("content")
    return text if isinstance(text, str) else ""
