"""A directory whose writes fail at the OS boundary on request, for the tests of what a failing disk costs.

As root (CI): a small tmpfs mounted for the test and filled by `fail()`, so that every later write ends in ENOSPC.
Without root the mount is not possible; `fail()` makes the directories read-only instead (EACCES): the same
failure at the same boundary (a write the kernel refuses), not a full disk. The variant is written to the terminal
(pytest's reporter, past output capture, also under -q) so that the CI log says which one ran. The tmpfs is
unmounted on every exit path.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

SIZE = "64m"  # room for what a tiny run writes before its end (llm_training: its data cache, 10 MB), filled then
CHUNK = b"\0" * (1 << 16)


@dataclasses.dataclass(frozen=True)
class FailingDisk:
    path: Path
    variant: str  # "full tmpfs" or "read-only directory"

    def fail(self) -> None:
        """From now on every write under `path` fails: the tmpfs is filled, or its directories made read-only."""
        if self.variant == "full tmpfs":
            with contextlib.suppress(OSError), open(self.path / ".filler", "wb") as filler:
                while True:
                    filler.write(CHUNK)
            return
        for directory in [self.path, *(p for p in self.path.rglob("*") if p.is_dir())]:
            directory.chmod(0o555)

    def expected_errno(self) -> int:
        return errno.ENOSPC if self.variant == "full tmpfs" else errno.EACCES


def _say(request: pytest.FixtureRequest, line: str) -> None:
    """To the terminal past pytest's capture, as capsys.disabled() does (captured output shows only on failure)."""
    plugins = request.config.pluginmanager
    reporter, capture = plugins.get_plugin("terminalreporter"), plugins.get_plugin("capturemanager")
    if reporter is None or capture is None:
        return
    with capture.global_and_fixture_disabled():
        reporter.write(f"\n{request.node.nodeid}: {line}\n")


@contextlib.contextmanager
def failing_disk(where: Path, request: pytest.FixtureRequest) -> Iterator[FailingDisk]:
    where.mkdir(parents=True)
    if os.geteuid() != 0:
        disk = FailingDisk(where, "read-only directory")
        _say(request, f"failing disk: {disk.variant} (not root: no tmpfs can be mounted)")
        try:
            yield disk
        finally:
            for directory in [where, *(p for p in where.rglob("*") if p.is_dir())]:
                directory.chmod(0o755)  # pytest removes tmp_path later
        return
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={SIZE}", "tmpfs", str(where)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:  # root without CAP_SYS_ADMIN (a container): permissions do not stop root either
        pytest.skip(f"root, but cannot mount a tmpfs here: {mounted.stderr.strip()}")
    disk = FailingDisk(where, "full tmpfs")
    _say(request, f"failing disk: {disk.variant} of {SIZE} at {where}")
    try:
        yield disk
    finally:
        if subprocess.run(["umount", str(where)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "--lazy", str(where)], check=True)  # a file still open: detach it now
