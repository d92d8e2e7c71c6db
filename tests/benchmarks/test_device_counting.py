"""benchmarks/device_counting.py on the CPU: two `jpwr serve` node identities and two ranks on the fake H100.

The script the lead runs on a GPU, run here as it is, with the fake NVML replaying the recorded H100
trace on one shared timeline (JPWR_FAKE_NVML_ORIGIN_NS) in every process. Its 0.5 % tolerance needs the
default 40 s windows of a real GPU; here the 2 s windows must still agree within the stated bounds.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "device_counting.py"


@pytest.mark.slow
def test_each_device_is_counted_once_across_two_node_identities(fake_env, h100_trace_dir, tmp_path):
    env = fake_env(JPWR_FAKE_NVML_TRACE=str(h100_trace_dir), JPWR_FAKE_NVML_ORIGIN_NS=str(time.monotonic_ns()))
    result = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path), "--load", "sleep",
                             "--steady-seconds", "2", "--settle-s", "0", "--idle-s", "0.5", "--warmup-steps", "3"],
                            env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    cases = {c["case"]: c for c in (json.loads(line.split(" ", 1)[1]) for line in result.stdout.splitlines()
                                    if line.startswith("DEVICE_COUNTING "))}
    assert set(cases) == {"shared", "disjoint"}, result.stderr[-3000:]
    for case in cases.values():
        failed = [name for name, ok in case["checks"].items() if not ok and name != "within_tolerance"]
        assert not failed, (case["case"], failed, case)
        assert case["record_devices"] == 1 and case["idle_power_w"] > 0
    assert any("n1, n2" in w and "Fix:" in w for w in cases["shared"]["warnings"])
    assert any("n2 metered no accelerators" in w for w in cases["disjoint"]["warnings"])
    assert result.returncode == (0 if all(c["ok"] for c in cases.values()) else 1)
