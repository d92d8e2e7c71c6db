"""The `jpwr` command as users and job scripts run it: real processes, fake GPU only at pynvml."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jpwr.errors import ExitCode

JPWR = [sys.executable, "-m", "jpwr"]


def run(args, env, cwd, timeout=120):
    return subprocess.run(JPWR + args, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def no_gpu_env(fake_env):
    return fake_env()  # fakes on the path, unconfigured: a machine without NVIDIA/AMD/Graphcore libraries


@pytest.fixture
def h100_env(fake_env, h100_trace_dir):
    return fake_env(JPWR_FAKE_NVML_TRACE=str(h100_trace_dir))


def test_info_without_sensors_says_so_and_exits_zero(no_gpu_env, tmp_path):
    for methods in (["--methods", "nvml,amdsmi,gcipuinfo"], []):
        result = run(["info", *methods, "--probe-seconds", "0"], no_gpu_env, tmp_path)
        assert result.returncode == 0, result.stderr
        assert "nvml: unavailable" in result.stdout
    if not Path("/sys/class/powercap").exists() and not Path("/sys/class/hwmon").exists():
        assert "no sensors found" in result.stdout


def test_explicit_unavailable_method_fails_before_the_command(no_gpu_env, tmp_path):
    marker = tmp_path / "ran"
    result = run(["--methods", "nvml", "--out", str(tmp_path / "o"), "--", "touch", str(marker)], no_gpu_env, tmp_path)
    assert result.returncode == ExitCode.UNAVAILABLE
    assert "method 'nvml' is not available" in result.stderr and "Fix:" in result.stderr
    assert not marker.exists()


def test_auto_without_sensors_runs_and_reports_none(no_gpu_env, tmp_path):
    result = run(["--out", "o", "--", "true"], no_gpu_env, tmp_path)
    assert result.returncode == 0, result.stderr
    summary = json.loads(next((tmp_path / "o").glob("*/summary.json")).read_text())
    energy = summary["windows"]["command"]["energy"]
    # even where RAPL is readable there is no accelerator: n/a with the reasons, never 0
    assert energy["energy_j"] is None and "no accelerator sensors" in energy["unavailable_reason"]
    assert "energy n/a" in result.stderr


@pytest.mark.parametrize(("args", "code", "text"), [
    (["--methods", "bogus", "--", "true"], ExitCode.USAGE, "unknown measurement method 'bogus'"),
    (["--out", "/proc/jpwr-cannot-write", "--", "true"], ExitCode.CANT_CREATE, "Fix: choose a writable"),
    (["--out", "o", "--", "jpwr-no-such-command"], ExitCode.NO_COMMAND, "command not found"),
])
def test_own_errors_have_distinct_exit_codes(h100_env, tmp_path, args, code, text):
    result = run(args, h100_env, tmp_path)
    assert result.returncode == code
    assert text in result.stderr


def test_child_exit_code_and_signal_pass_through(h100_env, tmp_path):
    assert run(["--out", "o", "--", "sh", "-c", "exit 3"], h100_env, tmp_path).returncode == 3
    killed = run(["--out", "o", "--", "sh", "-c", "kill -TERM $$"], h100_env, tmp_path)
    assert killed.returncode == 128 + signal.SIGTERM


def test_wrapped_command_on_replayed_h100_gets_counter_energy(h100_env, tmp_path):
    result = run(["--methods", "pynvml", "--interval", "50", "--out", "o", "--df-out", "df", "--", "sleep", "2"],
                 h100_env, tmp_path)
    assert result.returncode == 0, result.stderr
    node_dir = next((tmp_path / "o").iterdir())
    summary = json.loads((node_dir / "summary.json").read_text())
    energy = summary["windows"]["command"]["energy"]
    assert energy["method"] == "counter+power" and energy["devices"] == 1
    assert 100 < energy["mean_power_w"] < 800  # the trace spans idle (~125 W) and load (~690 W)
    assert energy["error_bound_j"] < 0.1 * energy["energy_j"]
    assert (node_dir / "trace.h5").exists()
    # jpwr 0.0.10's tables, for CARAML's scripts
    power = (tmp_path / "df" / "power.csv").read_text().splitlines()
    assert power[0].startswith("timestamp_s,nvml:0") and len(power) > 10
    assert "nvml:0," in (tmp_path / "df" / "energy.csv").read_text()


def _serve(env, out: Path, cwd: Path, node: str) -> subprocess.Popen:
    env = dict(env, JPWR_ADDR=str(cwd / "s-{node}.sock"), JPWR_NODE_NAME=node, JPWR_RUN_ID="job1")
    proc = subprocess.Popen([*JPWR, "serve", "--out", str(out), "--interval", "50"], env=env, cwd=cwd,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not (out / node / "ready").exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.stderr else ""
        time.sleep(0.05)
    return proc


RANK_SCRIPT = """
import os, sys, time
from joulebench.launch import LaunchEnv
from jpwr.meter import WindowMeter
launch = LaunchEnv.from_env()
meter = WindowMeter.open(launch)
meter.begin("steady", 0)
time.sleep(1.5)
meter.end("steady", 10, work={"tokens": 1000})
energy = meter.node_energy()
print("RANK", launch.rank, launch.local_rank, energy["steady"].energy_j if energy else "none", flush=True)
"""


def test_one_sampler_per_node_serves_several_ranks(h100_env, tmp_path):
    out = tmp_path / "o"
    sampler = _serve(h100_env, out, tmp_path, "n1")
    ranks = []
    for rank in range(3):
        env = dict(h100_env, JPWR_ADDR=str(tmp_path / "s-{node}.sock"), JPWR_NODE_NAME="n1", RANK=str(rank),
                   LOCAL_RANK=str(rank), WORLD_SIZE="3", LOCAL_WORLD_SIZE="3")
        ranks.append(subprocess.Popen([sys.executable, "-c", RANK_SCRIPT], env=env, stdout=subprocess.PIPE, text=True))
    lines = [p.communicate(timeout=120)[0] for p in ranks]
    sampler.send_signal(signal.SIGTERM)
    assert sampler.wait(timeout=60) == 0
    leader = next(line for line in lines if "RANK 0 0" in line)
    assert float(leader.split()[-1]) > 0  # the node leader got the node's energy
    assert all(line.split()[-1] == "none" for line in lines if "RANK 0 0" not in line)
    summary = json.loads((out / "n1" / "summary.json").read_text())
    assert summary["windows"]["steady"]["energy"]["devices"] == 1  # one GPU, metered once for three ranks
    marks = [m for m in json.loads(json.dumps(summary))["windows"]]
    assert marks == ["steady"]


def test_combine_two_nodes_sums_and_counts_shared_devices_once(h100_env, tmp_path):
    out = tmp_path / "o"
    nodes = [_serve(dict(h100_env, JPWR_FAKE_NVML_DEVICES="2"), out, tmp_path, n) for n in ("n1", "n2")]
    for node in ("n1", "n2"):
        env = dict(h100_env, JPWR_ADDR=str(tmp_path / "s-{node}.sock"), JPWR_NODE_NAME=node)
        subprocess.run([sys.executable, "-c", RANK_SCRIPT], env=env, check=True, timeout=120, capture_output=True)
    for proc in nodes:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    result = run(["combine", str(out), "--run-id", "job1"], h100_env, tmp_path)
    assert result.returncode == 0, result.stderr
    combined = json.loads((out / "summary.json").read_text())
    energy = combined["windows"]["steady"]["energy"]
    assert combined["nodes"] == ["n1", "n2"]
    # both "nodes" replay the same two fake GPUs (same UUIDs, one host): counted once, with a warning
    assert energy["devices"] == 2
    assert any("counted once" in w for w in energy["warnings"])


def test_sigterm_and_sigkill_leave_readable_traces(h100_env, tmp_path):
    from jpwr.trace import load_trace, read_segments

    out = tmp_path / "o"
    proc = _serve(h100_env, out, tmp_path, "n1")
    time.sleep(1.5)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0
    assert len(load_trace(out / "n1").readings) >= 2

    out2 = tmp_path / "o2"
    proc = _serve(h100_env, out2, tmp_path, "n2")
    time.sleep(2.5)  # segments are flushed every second
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    trace = read_segments(out2 / "n2")
    assert not (out2 / "n2" / "summary.json").exists()
    assert sum(len(v) for v in trace.readings.values()) > 10


def test_moved_analysis_verbs_forward_to_joulebench_and_say_so(no_gpu_env, tmp_path):
    """`jpwr report|plot` still work for one release, in a separate process (the meter imports no analysis)."""
    for verb in ("report", "plot"):
        result = run([verb, "--help"], no_gpu_env, tmp_path)
        assert result.returncode == 0, result.stderr
        assert f"`jpwr {verb}` moved to `joulebench {verb}`" in result.stderr
        assert f"usage: joulebench {verb}" in result.stdout
