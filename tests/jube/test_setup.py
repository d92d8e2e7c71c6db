"""jube/setup.sh's choice of torch's index: the dry run for each case, the fallback for real.

Why: the CPU wheel index keeps a GPU-less machine's venv at a quarter of the CUDA build's size, but a machine that
reaches only PyPI must still be set up by the README's two commands. The real run installs a small package in the
place of torch (JOULEBENCH_TORCH_PACKAGES) into a venv of its own, so CI exercises the fallback without 1-5 GB.
"""

from __future__ import annotations

import http.server
import os
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.jube.conftest import JUBE_DIR, requires_jube

SETUP = JUBE_DIR / "setup.sh"


def _tools(tmp_path: Path, *names: str, gpu: bool = False) -> str:
    """A PATH holding only the tools setup.sh needs (so that this machine's own nvidia-smi cannot decide), and a
    stand-in nvidia-smi where a GPU machine is meant."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(Path(sys.executable).resolve())  # this Python's interpreter, not a wrapper
    for name in ("dirname", *names):
        (bin_dir / name).symlink_to(shutil.which(name) or name)
    if gpu:
        (bin_dir / "nvidia-smi").write_text("#!/bin/sh\nexit 0\n")
        (bin_dir / "nvidia-smi").chmod(0o755)
    return str(bin_dir)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]  # closed again when this returns: nothing listens there


@pytest.fixture
def cpu_index(tmp_path: Path) -> Iterator[str]:
    """A reachable wheel index with a torch/ page: an HTTP server on this machine."""
    root = tmp_path / "index"
    (root / "torch").mkdir(parents=True)
    (root / "torch" / "index.html").write_text("<html></html>")
    handler = lambda *a: http.server.SimpleHTTPRequestHandler(*a, directory=str(root))  # noqa: E731
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _setup(env: dict[str, str], *args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_INDEX_URL", "JOULEBENCH_"))}
    return subprocess.run([shutil.which("sh") or "/bin/sh", str(SETUP), *args], env={**clean, **env},
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("case", ["site index", "gpu", "cpu index", "cpu index unreachable"])
def test_the_dry_run_says_where_torch_would_come_from_and_why(case: str, tmp_path: Path, cpu_index: str) -> None:
    env = {"PATH": _tools(tmp_path, gpu=case == "gpu"),
           "JOULEBENCH_TORCH_CPU_INDEX": f"http://127.0.0.1:{_closed_port()}" if "unreachable" in case else cpu_index}
    if case == "site index":
        env["PIP_INDEX_URL"] = "http://mirror.site.example/simple"
    proc = _setup(env, "--dry-run")
    assert proc.returncode == 0 and proc.stdout == "", proc.stderr
    why, would = proc.stderr.splitlines()
    expected = {
        "site index": ("PIP_INDEX_URL (http://mirror.site.example/simple): the site's index wins", None),
        "gpu": ("pip's default index: a GPU tool is on PATH", None),
        "cpu index": (f"torch from {cpu_index}: no GPU found", cpu_index),
        "cpu index unreachable": ("pip's default index: no GPU found, but http://127.0.0.1:", None),
    }[case]
    assert expected[0] in why, why
    assert would.startswith("setup: would install: torch torchvision" + (f" --index-url {expected[1]}, "
                                                                          if expected[1] else ", ")), would
    assert ("nvidia]" in would) == (case == "gpu"), would  # pynvml only where nvidia-smi is


@requires_jube
def test_an_unreachable_cpu_index_falls_back_to_the_default_index_for_real(tmp_path: Path) -> None:
    """The whole set-up on a GPU-less machine whose CPU index is down: a venv of its own, the stand-in for torch from
    pip's default index, joulebench itself (no extras), the jube link, then the doctor."""
    venv = tmp_path / "venv"
    env = {"PATH": _tools(tmp_path, "jube", "ln"), "JOULEBENCH_VENV": str(venv), "JOULEBENCH_EXTRAS": "",
           "JOULEBENCH_TORCH_PACKAGES": "iniconfig", "JOULEBENCH_TORCH_CPU_INDEX": f"http://127.0.0.1:{_closed_port()}"}
    proc = _setup(env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "no GPU found, but http://127.0.0.1:" in proc.stderr and "cannot be reached" in proc.stderr
    imported = subprocess.run([str(venv / "bin" / "python"), "-c", "import iniconfig, joulebench, jpwr"],
                              capture_output=True, text=True, cwd=tmp_path)
    assert imported.returncode == 0, imported.stderr
    assert (venv / "bin" / "jube").is_symlink() and "setup: done." in proc.stderr
    # the doctor ran last in the new venv: no extras asked for, so the quick start's are missing, and said so
    doctor = proc.stderr.partition("its doctor:\n")[2].replace("\n    ", " ")  # its findings unwrapped
    assert "joulebench doctor: Python " in doctor and f"at {venv}/bin/python" in doctor, proc.stderr
    assert "FIX   the quick start" in doctor and "Fix: pip install 'joulebench[llm,reports]'" in doctor
    assert proc.stderr.splitlines()[-1].startswith("next: fix what the doctor marks FIX above")
