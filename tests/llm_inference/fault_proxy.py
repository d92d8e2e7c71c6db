"""Faults on the wire between the load generator and a real server: a forwarding proxy that damages some answers.

The server behind it is real (`transformers serve`); the proxy passes each request on and, by the request's
ordinal (the n-th POST takes FAULTS[n % len]), answers 503 itself, cuts the event stream with a malformed line or
a TCP reset after two chunks, strips `usage` from it or replaces its output count by one that cannot be true
(USAGE_FAULTS). What a flaky network or an overloaded gateway does.
"""

from __future__ import annotations

import http.client
import itertools
import json
import socket
import struct
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

FAULTS = ("pass", "http_503", "malformed", "reset", "no_usage")
# A server's `usage.completion_tokens` replaced by one that cannot be true (the answers carry 12 chunks of text)
USAGE_FAULTS = {"usage_negative": -5, "usage_zero": 0, "usage_huge": 4_000_000_000_000, "usage_below_chunks": 1,
                "usage_text": "12"}


class FaultProxy(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, upstream_port: int, faults: tuple[str, ...] = FAULTS) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.upstream_port, self.faults = upstream_port, faults
        self.counter = itertools.count()
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def __enter__(self) -> FaultProxy:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
        self.server_close()

    def handle_error(self, request: object, client_address: object) -> None:
        return  # a connection the proxy reset on purpose

    def next_fault(self) -> str:
        with self.lock:
            return self.faults[next(self.counter) % len(self.faults)]


class _Handler(BaseHTTPRequestHandler):
    server: FaultProxy
    protocol_version = "HTTP/1.0"  # the answer ends when the connection closes

    def log_message(self, format: str, *args: object) -> None:
        return

    def do_GET(self) -> None:
        upstream = http.client.HTTPConnection("127.0.0.1", self.server.upstream_port, timeout=10)
        upstream.request("GET", self.path)
        answer = upstream.getresponse()
        body = answer.read()
        self.send_response(answer.status)
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        fault = self.server.next_fault()
        if fault == "http_503":
            self.send_response(503)
            self.end_headers()
            self.wfile.write(b'{"error": "injected: overloaded"}')
            return
        upstream = http.client.HTTPConnection("127.0.0.1", self.server.upstream_port, timeout=120)
        upstream.request("POST", self.path, body=body, headers={"Content-Type": "application/json"})
        answer = upstream.getresponse()
        self.send_response(answer.status)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        chunks = 0
        while line := answer.readline():
            if line.startswith(b"data: {"):
                chunks += 1
                if chunks == 3 and fault == "malformed":
                    self.wfile.write(b"data: {not json\n\n")
                    self.wfile.flush()
                    return
                if chunks == 3 and fault == "reset":
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    self.connection.close()
                    return
                if fault == "no_usage" or fault in USAGE_FAULTS:
                    event = json.loads(line[6:])
                    if fault == "no_usage":
                        event.pop("usage", None)
                    elif isinstance(event.get("usage"), dict):
                        event["usage"]["completion_tokens"] = USAGE_FAULTS[fault]
                    line = b"data: " + json.dumps(event).encode() + b"\n"
            self.wfile.write(line)
            self.wfile.flush()
        upstream.close()
