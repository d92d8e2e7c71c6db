"""Issue 61: the node's sampler killed in the middle of a run.

Once the record stayed OK with its energy n/a, and `jpwr combine` dropped the windows the sampler never saw end (the
steady window) without a word. Now the record says the sampler was lost and is PARTIAL (never OK for energy), and
`combine` lists every window: those the sampler saw whole with their energy, the one it was killed in n/a with the
reason. A real `jpwr serve` on fake GPUs replaying the H100 trace, killed with SIGKILL; the run is the lifecycle and
meter every driver uses, in this process.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

from joulebench.launch import LaunchEnv
from joulebench.lifecycle import Lifecycle
from joulebench.record import EXIT_CODES, steady_metrics
from tests.driver_helpers import read_record
from tests.jpwr.test_cli import JPWR, _has_mark, _serve, _wait_on_disk


def test_a_sampler_killed_in_the_steady_window_is_named_in_the_record_and_by_combine(fake_env, h100_trace_dir,
                                                                                      tmp_path, monkeypatch):
    env = fake_env(JPWR_FAKE_NVML_TRACE=str(h100_trace_dir), JPWR_FAKE_NVML_DEVICES="1")
    out = tmp_path / "jpwr"
    sampler = _serve(env, out, tmp_path, "n1")
    monkeypatch.setenv("JPWR_ADDR", str(tmp_path / "s-{node}.sock"))
    monkeypatch.setenv("JPWR_NODE_NAME", "n1")
    with (Lifecycle("llm_training", LaunchEnv.from_env({})) as life,
          life.run("r", tmp_path / "run", {}, metrics=lambda record: steady_metrics(
              next(w for w in record.windows if w.name == "steady"), "tokens", 1)) as run):
        meter = run.open_meter()
        meter.begin("warmup", 0)
        time.sleep(0.5)
        meter.end("warmup", 2, work={"tokens": 2.0})
        began = time.monotonic()
        meter.begin("steady", 2)
        _wait_on_disk(out / "n1", _has_mark("steady", "begin"))  # the sampler saw the window begin
        os.kill(sampler.pid, signal.SIGKILL)
        sampled_at_most = time.monotonic() - began
        sampler.wait(timeout=60)
        meter.end("steady", 12, work={"tokens": 10.0})
    assert life.exit_code() == EXIT_CODES["PARTIAL"]
    record = read_record(tmp_path / "run")
    assert record["status"] == "PARTIAL", record["status_reason"]
    assert "the node's jpwr sampler was lost during the run" in record["status_reason"]
    assert "its socket refused the 'steady' end mark (" in record["status_reason"]
    assert record["metrics"]["energy_wh"] is None and record["metrics"]["tokens_per_s"] is not None

    combined = subprocess.run([*JPWR, "combine", str(out), "--run-id", "job1"], env=env, cwd=tmp_path,
                              capture_output=True, text=True, timeout=120, check=False)
    assert combined.returncode == 0 and "Traceback" not in combined.stderr, combined.stderr
    lines = {line.split(":", 1)[0]: line for line in combined.stdout.splitlines() if not line.startswith(" ")}
    assert {"warmup", "steady"} <= set(lines), combined.stdout
    assert "energy_J=n/a" not in lines["warmup"]  # the sampler saw it whole
    assert "energy_J=n/a" in lines["steady"] and "reason=node n1: its sampler ended (killed?)" in lines["steady"]
    assert "after this window began, before it ended" in lines["steady"]
    steady = json.loads((out / "summary.json").read_text())["windows"]["steady"]
    assert steady["energy"]["energy_j"] is None and 0 < steady["duration_s"] <= sampled_at_most  # what was sampled
