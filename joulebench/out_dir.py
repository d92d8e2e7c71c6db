"""The drivers' --out-dir, checked before any work (resnet50, llm_training, llm_inference).

Why: a directory that cannot hold the run record was found only when something first wrote into it, minutes into
the run (llm_training's data cache: three chained Megatron tracebacks, the record sent elsewhere). Creating it and
writing a probe file first refuses the run at once, exit 73 (OutputDirError), naming the directory.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from jpwr import OutputDirError


def check_out_dir(out_dir: str | Path) -> None:
    """Create `out_dir` (and its parents) and write and remove a hidden probe file in it; refuse if that fails."""
    try:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out_dir, prefix=".write-test-"):
            pass
    except OSError as exc:
        raise OutputDirError(f"--out-dir {out_dir} cannot be written ({exc}); pass a writable directory") from None
