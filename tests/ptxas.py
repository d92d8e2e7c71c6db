"""Register spills of a Triton kernel compiled for an H100, told by Triton's bundled ptxas (no GPU, no CUDA toolkit).

Why: a kernel whose accumulators spill turns its data stream into local-memory traffic, which only a GPU run would
show otherwise; ptxas's -v report names the spill bytes of the PTX Triton produced for sm_90.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest


def bundled_ptxas() -> Path:
    """Triton's own ptxas; the test is skipped where this Triton has none (or Triton is missing)."""
    triton = pytest.importorskip("triton", reason="Triton is not installed: nothing to compile")
    ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    if not ptxas.is_file():
        pytest.skip("this Triton has no bundled ptxas")
    return ptxas


def spill_bytes(ptx: str) -> tuple[int, int, str]:
    """(spill store bytes, spill load bytes, ptxas's report) of this PTX assembled for sm_90a."""
    path = Path(os.environ.get("TMPDIR", "/tmp")) / f"ptxas_{os.getpid()}.ptx"
    path.write_text(ptx)
    try:
        report = subprocess.run([str(bundled_ptxas()), "-v", "--gpu-name", "sm_90a", str(path), "-o", os.devnull],
                                capture_output=True, text=True, timeout=120, check=True).stderr
    finally:
        path.unlink()
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", report)
    assert spills is not None, report
    return int(spills[1]), int(spills[2]), report
