"""Running the drivers as users do (python -m ..., real subprocesses) and reading what they wrote."""

from __future__ import annotations

import json
import socket
import subprocess
from collections.abc import Sequence
from pathlib import Path


def free_port(count: int = 1) -> int:
    """A port p such that p .. p+count-1 were free a moment ago (TF workers listen on consecutive ports)."""
    for _ in range(50):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            base = sock.getsockname()[1]
        if base + count < 65535 and all(_is_free(base + i) for i in range(1, count)):
            return base
    raise RuntimeError("no free consecutive ports")


def _is_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def run_cmd(cmd: Sequence[str], env: dict[str, str], cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run(list(cmd), env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)


def read_record(out_dir: Path) -> dict:
    return json.loads((out_dir / "run_record.json").read_text())


def summaries(stdout: str) -> list[dict[str, str]]:
    """key=value pairs of every JOULEBENCH_RESULT line; the last stdout line must be one."""
    lines = stdout.strip().splitlines()
    assert lines[-1].startswith("JOULEBENCH_RESULT "), f"last stdout line is not a summary: {lines[-1]!r}"
    return [dict(item.split("=", 1) for item in line.split()[1:])
            for line in lines if line.startswith("JOULEBENCH_RESULT ")]


def parse_summary(stdout: str) -> dict[str, str]:
    """The JOULEBENCH_RESULT line that ends stdout, as key=value pairs."""
    return summaries(stdout)[-1]
