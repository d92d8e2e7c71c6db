"""The `jpwr` command as users and job scripts run it: real processes, fake GPU only at pynvml."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from jpwr.errors import ExitCode
from jpwr.trace_io import SEGMENT_DIR, TraceData, load_trace, read_segments

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
    env = {**no_gpu_env, "JPWR_SYSFS_ROOT": str(tmp_path / "no-sysfs")}  # no RAPL either, wherever this runs
    result = run(["--out", "o", "--", "true"], env, tmp_path)
    assert result.returncode == 0, result.stderr
    summary = json.loads(next((tmp_path / "o").glob("*/summary.json")).read_text())
    energy = summary["windows"]["command"]["energy"]
    # n/a with one short reason, never 0 (RAPL, where readable, is the headline: tests/test_energy_domain.py)
    assert energy["energy_j"] is None and "no energy sensor readable" in energy["unavailable_reason"]
    assert "energy n/a" in result.stderr


def test_a_reason_every_window_shares_is_printed_once(no_gpu_env, tmp_path):
    """Without sensors the command's and the marked window's energy are n/a for the same (long) reason: in full once,
    the other window refers to it."""
    marks = ("from joulebench.launch import LaunchEnv\nfrom jpwr.meter import WindowMeter\n"
             "meter = WindowMeter.open(LaunchEnv.from_env())\nmeter.begin('steady', 0)\nmeter.end('steady', 1)\n")
    result = run(["--out", "o", "--", sys.executable, "-c", marks], no_gpu_env, tmp_path)
    assert result.returncode == 0, result.stderr
    summary = json.loads(next((tmp_path / "o").glob("*/summary.json")).read_text())
    reason = summary["windows"]["steady"]["energy"]["unavailable_reason"]
    assert reason == summary["windows"]["command"]["energy"]["unavailable_reason"] and len(reason) > 40
    lines = [line for line in result.stderr.splitlines() if line.startswith("jpwr: window ")]
    assert len(lines) == 2 and result.stderr.count(reason) == 1, result.stderr
    assert any(line.endswith("energy n/a (the same reason as window command)") for line in lines), lines


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
    killed = run(["--out", "o2", "--", "sh", "-c", "kill -TERM $$"], h100_env, tmp_path)
    assert killed.returncode == 128 + signal.SIGTERM


def test_a_second_run_into_one_out_directory_is_refused_and_the_first_kept(h100_env, tmp_path):
    assert run(["--out", "o", "--", "true"], h100_env, tmp_path).returncode == 0
    first = (tmp_path / "o").rglob("summary.json").__next__().read_text()
    second = run(["--out", "o", "--", "touch", "ran"], h100_env, tmp_path)
    assert second.returncode == ExitCode.CANT_CREATE
    assert "already holds the trace of run" in second.stderr and "Fix: give this run another --out" in second.stderr
    assert not (tmp_path / "ran").exists()
    assert (tmp_path / "o").rglob("summary.json").__next__().read_text() == first


def test_a_command_that_is_not_executable_is_named(h100_env, tmp_path):
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\n")
    result = run(["--out", "o", "--", str(script)], h100_env, tmp_path)
    assert result.returncode == ExitCode.NOT_EXECUTABLE
    assert "command not executable" in result.stderr and "chmod +x" in result.stderr


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


def _wait_on_disk(node_dir: Path, holds: Callable[[TraceData], bool], timeout_s: float = 60.0) -> None:
    """Until the sampler's segments on disk hold what `holds` asks for: it flushes them about once a second, later on
    a loaded machine, and a SIGKILL then leaves only what was flushed."""
    deadline = time.monotonic() + timeout_s
    while not ((node_dir / SEGMENT_DIR).is_dir() and holds(read_segments(node_dir))):
        assert time.monotonic() < deadline, f"the sampler flushed nothing that holds it to {node_dir} in {timeout_s} s"
        time.sleep(0.1)


def _has_mark(name: str, edge: str) -> Callable[[TraceData], bool]:
    """The mark on disk, and a later reading of every sensor read so far: the window's edge lies between readings
    (the mark may be the last line a flush wrote)."""
    def holds(trace: TraceData) -> bool:
        mark = next((m for m in trace.marks if m.name == name and m.edge == edge), None)
        return mark is not None and all(rows[-1].t_before_ns > mark.t_ns for rows in trace.readings.values() if rows)
    return holds


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


def test_legacy_power_table_leaves_a_failed_stretch_empty(fake_env, h100_trace_dir, tmp_path):
    """jpwr 0.0.10's power.csv: rows whose instant power read failed stay empty; no line is drawn across them. The
    failed stretch counts from the fake's import in jpwr, just before it samples (counted from this process, a slow
    start on a loaded machine could reach into the stretch before the first row)."""
    fails = json.dumps({"fails": [{"target": "field:186", "code": 999, "from_ns": 1_400_000_000,
                                   "until_ns": 2_000_000_000}]})
    env = fake_env(JPWR_FAKE_NVML_TRACE=str(h100_trace_dir), JPWR_FAKE_NVML_FAULTS=fails)
    result = run(["--methods", "nvml", "--interval", "50", "--out", "o", "--df-out", "df", "--", "sleep", "3"],
                 env, tmp_path)
    assert result.returncode == 0, result.stderr
    cells = [line.split(",")[1] for line in (tmp_path / "df" / "power.csv").read_text().splitlines()[1:]]
    empty = [i for i, cell in enumerate(cells) if cell == ""]
    assert len(empty) >= 5, cells  # ~0.6 s of 50 ms reads failed
    assert cells[0] != "" and cells[-1] != ""  # before and after the failed stretch the table has values
    assert empty == list(range(empty[0], empty[-1] + 1))  # one stretch, nothing filled in inside it


def test_min_coverage_option_reaches_the_summary(h100_env, tmp_path):
    result = run(["--methods", "nvml", "--min-coverage", "0.5", "--out", "o", "--", "sleep", "0.5"], h100_env, tmp_path)
    assert result.returncode == 0, result.stderr
    summary = json.loads(next((tmp_path / "o").glob("*/summary.json")).read_text())
    assert summary["info"]["min_coverage"] == 0.5
    assert summary["windows"]["command"]["energy"]["coverage_threshold"] == 0.5


@pytest.mark.parametrize(("args", "env", "named"), [
    (["--run-id", "../up"], {}, "run id '../up'"),
    ([], {"JPWR_NODE_NAME": "rack/n1"}, "node name (from JPWR_NODE_NAME) 'rack/n1'"),
    ([], {"JPWR_NODE_NAME": "."}, "node name (from JPWR_NODE_NAME) '.'"),  # issue 61: once <out>/. = <out> itself
    ([], {"JPWR_NODE_NAME": ".."}, "node name (from JPWR_NODE_NAME) '..'"),
    ([], {"SLURMD_NODENAME": "."}, "node name (from SLURMD_NODENAME) '.'"),
])
def test_names_that_become_paths_are_refused_before_anything_starts(h100_env, tmp_path, args, env, named):
    result = run(["--methods", "nvml", *args, "--out", "o", "--", "touch", "ran"], {**h100_env, **env}, tmp_path)
    assert result.returncode == ExitCode.USAGE and named in result.stderr and "Fix:" in result.stderr
    assert "JPWR_NODE_NAME" not in env or "Fix: set JPWR_NODE_NAME to a name" in result.stderr
    assert not (tmp_path / "ran").exists() and not (tmp_path / "o").exists()


def test_an_in_process_sampler_refuses_a_node_name_that_is_no_directory_before_writing(fake_pynvml, h100_trace_dir,
                                                                                       tmp_path, monkeypatch):
    """A driver's own sampler (--energy-methods) writes <out>/<node>/ too: JPWR_NODE_NAME=. is refused there alike."""
    from jpwr import ValidationError
    from jpwr.clock import VirtualClock
    from jpwr.sampler import Sampler, open_backends

    fake_pynvml.configure(h100_trace_dir, VirtualClock())
    monkeypatch.delenv("SLURMD_NODENAME", raising=False)
    monkeypatch.setenv("JPWR_NODE_NAME", ".")
    backends, discoveries = open_backends(["nvml"], VirtualClock())
    with pytest.raises(ValidationError, match=r"node name \(from JPWR_NODE_NAME\) '\.' cannot be used as a file name"):
        Sampler(backends, discoveries, tmp_path / "jpwr", 0.1, 1.0, run_id="r", background=False)
    assert not (tmp_path / "jpwr").exists()


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
    out = tmp_path / "o"
    proc = _serve(h100_env, out, tmp_path, "n1")
    time.sleep(1.5)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0
    assert len(load_trace(out / "n1").readings) >= 2

    out2 = tmp_path / "o2"
    proc = _serve(h100_env, out2, tmp_path, "n2")
    _wait_on_disk(out2 / "n2", lambda trace: sum(len(v) for v in trace.readings.values()) > 10)
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


def test_a_second_sampler_on_a_live_socket_is_refused_with_the_first_ones_pid(h100_env, tmp_path):
    first = _serve(h100_env, tmp_path / "o", tmp_path, "n1")
    env = dict(h100_env, JPWR_ADDR=str(tmp_path / "s-{node}.sock"), JPWR_NODE_NAME="n1", JPWR_RUN_ID="job2")
    second = run(["serve", "--out", str(tmp_path / "other")], env, tmp_path, timeout=60)
    assert second.returncode == ExitCode.USAGE
    assert f"served by a running jpwr sampler (pid {first.pid}, node n1, run job1)" in second.stderr
    first.send_signal(signal.SIGTERM)
    assert first.wait(timeout=60) == 0


def test_a_stale_socket_is_reclaimed_and_bad_socket_paths_are_named(h100_env, tmp_path):
    import socket

    stale = tmp_path / "s-n1.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as dead:
        dead.bind(str(stale))  # bound, then closed without unlinking: what a killed sampler leaves
    proc = _serve(h100_env, tmp_path / "o", tmp_path, "n1")
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and "reclaimed the stale socket" in err
    for addr, text in ((str(tmp_path / ("x" * 120) / "{node}.sock"), "more than the 107"),
                       (str(tmp_path / "missing" / "{node}.sock"), "does not exist")):
        result = run(["serve", "--out", str(tmp_path / "o2"), "--addr", addr], h100_env, tmp_path, timeout=60)
        assert result.returncode == ExitCode.USAGE and text in result.stderr and "Fix:" in result.stderr


def _two_runs(h100_env, tmp_path: Path) -> Path:
    """Node n1 of run job1 and node n2 of run job2 in one directory, each with a steady window."""
    out = tmp_path / "o"
    for node, run_id in (("n1", "job1"), ("n2", "job2")):
        env = dict(h100_env, JPWR_NODE_NAME=node, JPWR_RUN_ID=run_id)
        result = subprocess.run([*JPWR, "--out", str(out), "--", sys.executable, "-c", "import time; time.sleep(1)"],
                                env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
    return out


def test_combine_refuses_nodes_of_different_runs_unless_one_is_chosen(h100_env, tmp_path):
    out = _two_runs(h100_env, tmp_path)
    mixed = run(["combine", str(out)], h100_env, tmp_path)
    assert mixed.returncode == ExitCode.USAGE
    assert "node summaries of 2 runs (job1: n1; job2: n2)" in mixed.stderr and "--run-id" in mixed.stderr
    chosen = run(["combine", str(out), "--run-id", "job2"], h100_env, tmp_path)
    assert chosen.returncode == 0, chosen.stderr
    assert json.loads((out / "summary.json").read_text())["nodes"] == ["n2"]


def test_combine_recovers_a_killed_node_and_refuses_a_partial_sum(h100_env, tmp_path):
    out = tmp_path / "o"
    nodes = {n: _serve(h100_env | {"JPWR_FAKE_NVML_DEVICES": "1"}, out, tmp_path, n) for n in ("n1", "n2")}
    for node in nodes:
        env = dict(h100_env, JPWR_ADDR=str(tmp_path / "s-{node}.sock"), JPWR_NODE_NAME=node)
        subprocess.run([sys.executable, "-c", RANK_SCRIPT], env=env, check=True, timeout=120, capture_output=True)
    _wait_on_disk(out / "n2", _has_mark("steady", "end"))
    nodes["n1"].send_signal(signal.SIGTERM)
    nodes["n1"].wait(timeout=60)
    os.kill(nodes["n2"].pid, signal.SIGKILL)  # n2 leaves segments and no summary
    nodes["n2"].wait(timeout=60)
    result = run(["combine", str(out), "--run-id", "job1"], h100_env, tmp_path)
    assert result.returncode == 0, result.stderr
    assert "node n2 had no summary" in result.stderr
    combined = json.loads((out / "summary.json").read_text())
    assert combined["nodes"] == ["n1", "n2"] and combined["recovered_nodes"] == ["n2"]
    steady = combined["windows"]["steady"]["energy"]
    assert steady["energy_j"] is not None and any("recovered from its segments" in w for w in steady["warnings"])
    # Slurm said three nodes: two traces are not the run's energy
    short = run(["combine", str(out), "--run-id", "job1"], {**h100_env, "SLURM_JOB_NUM_NODES": "3"}, tmp_path)
    assert short.returncode == 0 and "only 2 of 3 nodes" in short.stderr
    steady = json.loads((out / "summary.json").read_text())["windows"]["steady"]["energy"]
    assert steady["energy_j"] is None and "only 2 of 3 nodes" in steady["unavailable_reason"]


@pytest.mark.parametrize(("limit", "says"), [
    (20_000, "the trace was not saved completely: segments stopped: File too large"),  # summary still fits
    (2_000, "could not write the results: File too large"),  # not even the summary fits
])
def test_a_full_disk_keeps_the_commands_exit_code_and_prints_the_energy(h100_env, tmp_path, limit, says):
    """Writes past RLIMIT_FSIZE fail with EFBIG (Python ignores SIGXFSZ), as writes to a full disk fail."""
    import resource

    def small_files() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    result = subprocess.run([*JPWR, "--out", "o", "--interval", "20", "--", "sh", "-c", "sleep 2; exit 5"],
                            env=h100_env, cwd=tmp_path, capture_output=True, text=True, timeout=120,
                            preexec_fn=small_files)
    assert result.returncode == 5, result.stderr
    assert "Traceback" not in result.stderr
    assert says in result.stderr
    assert "jpwr: window command:" in result.stderr and " J (" in result.stderr  # measured, and printed
