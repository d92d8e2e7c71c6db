"""One sampler per output directory and per socket: a second one is refused, never silently merged.

Two samplers writing one node directory interleave their segments and the second summary
replaces the first; two serving one socket path split the marks between them. A node directory
is claimed with an advisory lock held for the sampler's life (the kernel drops it when the
process dies, so a killed sampler leaves no stale claim); a directory that already holds a trace
is refused too. A socket path whose server still answers is refused; one whose server is gone
is reclaimed with a note.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import sys
from pathlib import Path
from typing import IO

from jpwr.errors import OutputDirError, ValidationError

LOCK_FILE = "sampler.lock"
MAX_SOCKET_PATH_BYTES = 107  # sockaddr_un.sun_path minus the terminating NUL (Linux)
WHO_TIMEOUT_S = 1.0


def claim_node_dir(node_dir: Path, run_id: str, trace_files: tuple[str, ...]) -> IO[str]:
    """Lock `node_dir` for this sampler; refuse a live sampler there or a trace already written there.

    Returns the open lock file: the claim lasts while it stays open (close it when the sampler stops).
    """
    handle = open(node_dir / LOCK_FILE, "a+")  # noqa: SIM115 (held open for the sampler's life)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "another process"
        handle.close()
        raise OutputDirError(f"{node_dir} is in use by a running jpwr sampler ({holder}). Fix: give this run "
                             "another --out directory, or stop that sampler first") from None
    existing = [name for name in trace_files if (node_dir / name).exists()]
    if existing:
        handle.close()
        owner = _run_of(node_dir)
        raise OutputDirError(f"{node_dir} already holds {'the trace of run ' + owner if owner else 'a trace'} "
                             f"({', '.join(existing)}): a second run there would mix with it or replace it. Fix: "
                             f"give this run another --out directory, or move {node_dir} away first")
    handle.seek(0)
    handle.truncate()
    handle.write(f"pid {os.getpid()} on {socket.gethostname()}, run {run_id}\n")
    handle.flush()
    return handle


def _run_of(node_dir: Path) -> str | None:
    with contextlib.suppress(OSError, ValueError, KeyError):
        return str(json.loads((node_dir / "summary.json").read_text())["run_id"])
    return None


def claim_socket(addr: str) -> None:
    """Check that `addr` can be bound by this sampler: a sane path, and no live sampler serving it.

    A stale socket file (its server died without removing it) is removed with a note.
    """
    size = len(os.fsencode(addr))
    if size > MAX_SOCKET_PATH_BYTES:
        raise ValidationError(f"socket path {addr} is {size} bytes, more than the {MAX_SOCKET_PATH_BYTES} a Unix "
                              "socket allows", "choose a shorter --addr / JPWR_ADDR (or a shorter TMPDIR)")
    parent = Path(addr).parent
    if not parent.is_dir():
        raise ValidationError(f"the directory of socket path {addr} does not exist",
                              f"create {parent} or choose another --addr / JPWR_ADDR")
    if not os.path.exists(addr):
        return
    holder = who_serves(addr)
    if holder is not None:
        raise ValidationError(f"socket {addr} is served by a running jpwr sampler ({holder})",
                              "give this sampler another --addr / JPWR_ADDR, or stop that sampler first")
    os.unlink(addr)
    print(f"jpwr: note: reclaimed the stale socket {addr} (no sampler answered on it)", file=sys.stderr)


def who_serves(addr: str) -> str | None:
    """Ask the sampler on `addr` who it is; None when nothing answers (refused, or silent for a second)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as probe:
        probe.bind("")  # an abstract address the sampler can reply to
        probe.settimeout(WHO_TIMEOUT_S)
        try:
            probe.sendto(json.dumps({"type": "who"}).encode(), addr)
            reply = json.loads(probe.recv(65507))
        except (ConnectionRefusedError, FileNotFoundError, TimeoutError, json.JSONDecodeError):
            return None
    return f"pid {reply.get('pid')}, node {reply.get('node')}, run {reply.get('run_id')}"
