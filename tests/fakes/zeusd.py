"""Fake Zeus daemon: zeusd's GPU-control endpoints on a Unix socket, acting on the fake pynvml's shared devices.

A hardware-boundary fake, run as its own (privileged) process like the real daemon:

    JPWR_FAKE_NVML_TRACE=... JPWR_FAKE_NVML_STATE=... JPWR_FAKE_NVML_PRIVILEGED=1 python tests/fakes/zeusd.py SOCKET

Endpoints as zeusd 0.3-0.5 serve them and Zeus's client calls them (POST, JSON body, "block" required):
/gpu/<index>/set_power_limit {power_limit_mw}, /gpu/<index>/set_gpu_locked_clocks {min_clock_mhz, max_clock_mhz},
/gpu/<index>/reset_gpu_locked_clocks. 200 on success; 400 for a bad body; 500 with NVML's message when the call
fails. <index> is the NVML index. Requests are appended to <SOCKET>.requests (one JSON line each) for tests.
"""

from __future__ import annotations

import http.server
import json
import os
import re
import socketserver
import sys

import pynvml

ENDPOINTS = {
    "set_power_limit": (("power_limit_mw",), lambda h, b: pynvml.nvmlDeviceSetPowerManagementLimit(h, b[0])),
    "set_gpu_locked_clocks": (("min_clock_mhz", "max_clock_mhz"),
                              lambda h, b: pynvml.nvmlDeviceSetGpuLockedClocks(h, b[0], b[1])),
    "reset_gpu_locked_clocks": ((), lambda h, b: pynvml.nvmlDeviceResetGpuLockedClocks(h)),
}


class Handler(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        match = re.fullmatch(r"/gpu/(\d+)/(\w+)", self.path)
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        with open(f"{self.server.server_address}.requests", "a") as log:
            log.write(json.dumps({"path": self.path, "body": body}) + "\n")
        if not match or match.group(2) not in ENDPOINTS:
            self._reply(404, "no such endpoint")
            return
        fields, call = ENDPOINTS[match.group(2)]
        if "block" not in body or any(f not in body for f in fields):
            self._reply(400, f"body needs {', '.join((*fields, 'block'))}")
            return
        try:
            call(pynvml.nvmlDeviceGetHandleByIndex(int(match.group(1))), [int(body[f]) for f in fields])
        except pynvml.NVMLError as exc:
            self._reply(500, f"NVML error: {exc}")
            return
        self._reply(200, "")

    def _reply(self, status: int, text: str) -> None:
        data = text.encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def address_string(self) -> str:
        return "unix"

    def log_message(self, format: str, *args: object) -> None:
        pass


class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


def main(path: str) -> None:
    pynvml.nvmlInit()
    server = Server(path, Handler)
    os.chmod(path, 0o666)
    print("ready", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main(sys.argv[1])
