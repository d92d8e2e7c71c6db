"""Helpers for llm_inference tests: the driver as users run it (python -m, under `python -m jpwr --`)."""

from __future__ import annotations

import sys

from tests.driver_helpers import read_record, run_cmd, summaries  # noqa: F401 (re-exported to tests)

INFER = [sys.executable, "-m", "llm_inference"]
# The tiny preset and task on the CPU, short windows: a point takes a few seconds on 2 cores.
TINY = ["--preset", "tiny", "--task", "tiny", "--device", "cpu", "--min-window-s", "0.3", "--num-batches", "2"]


