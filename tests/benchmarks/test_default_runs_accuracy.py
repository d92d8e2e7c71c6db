"""benchmarks/default_runs_accuracy.py on the CPU: the script the lead runs on a GPU, with a tiny run.

The fake NVML replays the recorded H100 trace on one shared timeline in every process, so the script's
independent counter read and jpwr's sampler see the same counter; they must agree within the stated bounds.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "default_runs_accuracy.py"


@pytest.mark.slow
@pytest.mark.parametrize(("run", "tiny"), [("llm_training", ["--model", "tiny"]),
                                           ("llm_inference", ["--preset", "tiny", "--num-batches", "1"])])
def test_a_run_record_is_checked_against_an_independent_counter_read(run, tiny, fake_env, h100_trace_dir, tmp_path):
    env = fake_env(JPWR_FAKE_NVML_TRACE=str(h100_trace_dir), JPWR_FAKE_NVML_ORIGIN_NS=str(time.monotonic_ns()))
    result = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path), "--runs", run, "--",
                             *tiny, "--device", "cpu", "--steady-seconds", "2"],
                            env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    rows = [json.loads(line.split(" ", 1)[1]) for line in result.stdout.splitlines() if line.startswith("DEFAULT_RUN ")]
    assert len(rows) == 1, result.stdout[-3000:] + result.stderr[-3000:]
    row = rows[0]
    assert row["status"] == "OK" and row["method"] == "counter+power" and row["length rule"] == "steady-seconds"
    if run == "llm_training":  # a planned number of steps; inference windows are whole passes of a planned time
        assert row["end_reason"].startswith("planned length reached")
    allowed = row["record_bound_j"] + row["independent_uncertainty_j"]
    assert abs(row["record_energy_j"] - row["independent_j"]) <= allowed
    assert row["idle W"] > 0 and f"| {run} |" in result.stdout
