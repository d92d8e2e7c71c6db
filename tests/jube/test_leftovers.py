"""The session's leftover check (tests/conftest.py): a session that leaves something of ours in /tmp fails naming it;
what was there before it started, what a test removes again and a socket still in use are not its doing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.jube.conftest import REPO

pytestmark = pytest.mark.machine_wide  # counts our entries in /tmp: none of another test may appear meanwhile


def _session(tmp_path: Path, name: str, test: str) -> subprocess.CompletedProcess[str]:
    """A pytest session of one test file with the suite's session hooks."""
    inner = tmp_path / name
    inner.mkdir()
    (inner / "conftest.py").write_text("from tests.conftest import pytest_sessionfinish, pytest_sessionstart  # noqa\n")
    (inner / "test_inner.py").write_text(f"import socket\nfrom pathlib import Path\n\nKEEP = []\n\n\n"
                                         f"def test_inner() -> None:\n    {test}\n")
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", os.devnull, "--rootdir", str(inner),
            str(inner)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(argv, cwd=inner, env=env, capture_output=True, text=True, timeout=300)


def test_a_session_that_leaves_a_file_of_ours_in_tmp_fails_and_names_it(tmp_path: Path) -> None:
    stem = f"/tmp/jb-leftover-test-{os.getpid()}-{tmp_path.name}"
    earlier, left, removed = Path(f"{stem}-earlier"), Path(f"{stem}-left"), Path(f"{stem}-removed")
    bound = Path(f"/tmp/jb-leftover-test-{os.getpid()}.sock")  # a sampler of another session, still listening
    earlier.mkdir()
    try:
        listen = f"KEEP.append(socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)); KEEP[0].bind({str(bound)!r})"
        proc = _session(tmp_path, "leaves", f"Path({str(left)!r}).mkdir(); {listen}")
        assert proc.returncode == 1 and "1 thing(s) behind" in proc.stdout and f"  {left}\n" in proc.stdout, proc.stdout
        assert str(earlier) not in proc.stdout and str(bound) not in proc.stdout
        proc = _session(tmp_path, "cleans", f"Path({str(removed)!r}).mkdir(); Path({str(removed)!r}).rmdir()")
        assert proc.returncode == 0 and "behind" not in proc.stdout, proc.stdout
    finally:
        bound.unlink(missing_ok=True)
        for path in (earlier, left, removed):
            if path.exists():
                path.rmdir()
