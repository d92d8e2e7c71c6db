"""Output directories: the drivers' --out-dir, checked before any work (resnet50, llm_training, llm_inference), and
the lock of a directory that a command fills with several files that belong together (`joulebench report -o`).

Why: a directory that cannot hold the run record was found only when something first wrote into it, minutes into
the run (llm_training's data cache: three chained Megatron tracebacks, the record sent elsewhere). Creating it and
writing a probe file first refuses the run at once, exit 73 (OutputDirError), naming the directory. And each file
written atomically is not enough where files belong together: four reports into one directory at once left one
report's table beside another's charts; one writer at a time keeps each set whole.
"""

from __future__ import annotations

import contextlib
import fcntl
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from jpwr import OutputDirError

LOCK_FILE = ".joulebench.lock"  # in the directory: hidden, as the atomic writer's temporary files
LOCK_WAIT_S = 600.0  # how long a second writer waits for the first before it refuses the busy directory
LOCK_POLL_S = 0.1


PROBE_BYTES = 4096  # one block: an empty probe file is created even on a full disk (an inode, no data)


def check_out_dir(out_dir: str | Path) -> None:
    """Create `out_dir` (and its parents) and write a block to a hidden probe file in it, then remove it; refuse if
    that fails (a read-only or full file system), naming the directory."""
    try:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out_dir, prefix=".write-test-") as probe:
            probe.write(b"\0" * PROBE_BYTES)
            probe.flush()
    except OSError as exc:
        raise OutputDirError(f"--out-dir {out_dir} cannot be written ({exc.strerror or exc}); free space there or "
                             "pass a writable directory") from None


@contextlib.contextmanager
def one_writer(directory: Path, what: str, wait_s: float = LOCK_WAIT_S) -> Iterator[None]:
    """Hold `directory` for one writer while the body writes its files: another writer (another process) waits,
    saying so once on stderr, and after `wait_s` is refused (OutputDirError naming the directory). The lock is the
    kernel's (flock on LOCK_FILE): a writer that dies releases it."""
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / LOCK_FILE, "a") as handle:
        deadline = time.monotonic() + wait_s
        said = False
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise OutputDirError(f"{directory} is still being written by another {what} after {wait_s:g} s; "
                                         "wait for it to end, or pass another output directory") from None
                if not said:
                    print(f"{what}: waiting for another {what} writing to {directory}", file=sys.stderr, flush=True)
                    said = True
                time.sleep(LOCK_POLL_S)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
