"""A server the load generator starts itself: its command from a template, readiness, version, log and stop.

The template is a command line with placeholders (PLACEHOLDERS), e.g. the profile's
`vllm serve {model} --host {host} --port {port} --max-num-seqs {concurrency}` ({python}: the interpreter running
the load, for servers installed beside it); an unknown placeholder is refused
before anything starts. The server runs in its own process group with its output in `server.log` beside the run
record; it is ready when `GET /health` (or `/v1/models`) answers 200 within the ready timeout. It is stopped on
every exit path (a context manager: normal end, failure, the driver's SIGTERM turned into a clean stop):
SIGTERM to its group, STOP_GRACE_S, then SIGKILL.
"""

from __future__ import annotations

import contextlib
import ctypes
import http.client
import shlex
import signal
import socket
import string
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from joulebench.bounded_run import stop_group
from joulebench.lifecycle import RunFailed, StopRequested
from joulebench.waits import wait_until
from jpwr import ValidationError

PLACEHOLDERS = ("model", "host", "port", "concurrency", "devices", "python")  # python: this interpreter
READY_PATHS = ("/health", "/v1/models")
READY_POLL_S = 0.5
STOP_GRACE_S = 20.0
VERSION_TIMEOUT_S = 60.0
LOG_NAME = "server.log"
LOG_LINES = 15  # last lines of the server's log quoted in a failure
PR_SET_PDEATHSIG = 1


def render(template: str, values: Mapping[str, str], option: str = "--server-command") -> list[str]:
    """The command line of `template` with `values` filled in (each one shell word); an unknown or positional
    placeholder and a line that is not valid shell are refused, naming the problem and the option."""
    fields = []
    try:
        fields = [name for _, name, _, _ in string.Formatter().parse(template) if name is not None]
    except ValueError as exc:
        raise ValidationError(f"{option} {template!r}: {exc}",
                              "write placeholders as {name} and a literal brace as {{ or }}") from None
    unknown = ", ".join(sorted({"{" + f + "}" for f in fields if f not in PLACEHOLDERS}))
    if unknown:
        raise ValidationError(f"{option} names unknown placeholder(s) {unknown}",
                              f"use only {', '.join('{' + p + '}' for p in PLACEHOLDERS)}")
    try:
        words = shlex.split(template)
    except ValueError as exc:
        raise ValidationError(f"{option} {template!r} is not a valid command line ({exc})",
                              "close the quote, or escape it") from None
    if not words:
        raise ValidationError(f"{option} is empty", "give the command, or leave the option out")
    return [word.format(**values) for word in words]


def port_is_free(host: str, port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str) -> int:
    """A port the kernel hands out now (JUBE passes one from jube/jbport.py instead)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def version(command: str | None, values: Mapping[str, str]) -> str:
    """The server's version from the profile's version command's first line, or "unknown (why)"."""
    if not command:
        return "unknown (no --server-version-command)"
    try:
        done = subprocess.run(render(command, values, "--server-version-command"), capture_output=True, text=True,
                              timeout=VERSION_TIMEOUT_S, check=False)
    except (OSError, ValueError, subprocess.TimeoutExpired) as exc:
        return f"unknown ({command!r}: {type(exc).__name__}: {exc})"
    lines = [line.strip() for line in done.stdout.splitlines() if line.strip()]
    if done.returncode != 0 or not lines:
        return f"unknown ({command!r} exited {done.returncode}: {done.stderr.strip()[-200:]})"
    return lines[0]


def log_tail(path: Path, lines: int = LOG_LINES) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no server log)"
    return "\n".join(text[-lines:]) or "(the server's log is empty)"


class Server:
    """A started server process (its own process group) and where it logs."""

    def __init__(self, argv: list[str], env: Mapping[str, str], log_path: Path) -> None:
        self.argv, self.log_path = argv, log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as log:
            log.write(f"# joulebench: {shlex.join(argv)}\n".encode())
            log.flush()
            try:
                self.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=dict(env),
                                                start_new_session=True, preexec_fn=_end_with_parent)
            except OSError as exc:
                raise ValidationError(f"the server command {argv[0]!r} cannot be started ({exc})",
                                      "check --server-command (is the server installed on this node?)") from None

    def exited(self) -> str | None:
        """Why the server is gone (exit code and its log's last lines), or None while it runs."""
        code = self.process.poll()
        if code is None:
            return None
        return f"the server exited with code {code}; the last lines of {self.log_path}:\n{log_tail(self.log_path)}"

    def wait_ready(self, host: str, port: int, timeout_s: float, stop: Callable[[], str | None]) -> float:
        """Seconds until the server answered 200 on a READY_PATHS; refused (with its log) when it exits or the
        timeout passes first; a stop request ends the wait (StopRequested)."""
        start = time.monotonic()
        while True:
            reason = stop()
            if reason:
                raise StopRequested(f"{reason}: while waiting for the server to become ready")
            gone = self.exited()
            if gone:
                raise RunFailed(f"the server never became ready: {gone}")
            if any(_answers(host, port, path) for path in READY_PATHS):
                return time.monotonic() - start
            if time.monotonic() - start > timeout_s:
                raise RunFailed(f"the server was not ready within {timeout_s:g} s (no 200 from "
                                   f"{' or '.join(READY_PATHS)} on {host}:{port}); raise --server-ready-timeout if "
                                   f"it loads slowly. The last lines of {self.log_path}:\n{log_tail(self.log_path)}")
            wait_until(time.monotonic() + READY_POLL_S, stop)

    def stop(self) -> str:
        """SIGTERM to the group, STOP_GRACE_S, then SIGKILL to the group; returns how it ended."""
        return stop_group(self.process, STOP_GRACE_S)


def _end_with_parent() -> None:
    """In the child, before exec: SIGTERM when the load's process dies, even by SIGKILL (Linux prctl
    PR_SET_PDEATHSIG), so that no server outlives a killed driver on a machine without Slurm's cgroup."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def _answers(host: str, port: int, path: str) -> bool:
    connection = http.client.HTTPConnection(host, port, timeout=2.0)
    try:
        connection.request("GET", path)
        return connection.getresponse().status == 200
    except (OSError, http.client.HTTPException):
        return False
    finally:
        connection.close()


@contextlib.contextmanager
def started(argv: list[str], env: Mapping[str, str], log_path: Path, host: str, port: int,
            ready_timeout_s: float, stop: Callable[[], str | None] = lambda: None) -> Iterator[tuple[Server, float]]:
    """The server, ready, and the seconds it took; stopped however the body ends."""
    if not port_is_free(host, port):
        raise RuntimeError(f"port {port} on {host} is in use: another server is listening there; stop it, or give "
                           "the server another port (--server-port)")
    server = Server(argv, env, log_path)
    try:
        yield server, server.wait_ready(host, port, ready_timeout_s, stop)
    finally:
        how = server.stop()
        with open(log_path, "a") as log:
            log.write(f"# joulebench: server {how}\n")
