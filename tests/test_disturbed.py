"""Disturbed runs (issue 32 item 5): each cause planted at the hardware boundary (the fake pynvml's processes and
clock event reasons, a fake /proc/loadavg) and judged by the real probe, watch and lifecycle; a real tiny run shows
the block in its record, the JUBE note, the report's note and `--compare`."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from joulebench.analysis.report import load_runs, table_rows
from joulebench.analysis.report import main as report_main
from joulebench.disturbed import LOADAVG_ENV, STEP_CV_MAX, WINDOW, Watch, judge
from joulebench.launch import LaunchEnv
from joulebench.lifecycle import Lifecycle
from joulebench.record import RunRecord
from jpwr.devices import node_name
from llm_training.cli import main as llm_training_main
from tests.jube.test_record_fields import jbrecord
from tests.llm_training.conftest import TINY

GIB = 2**30
HIDDEN_PID = 2**22 + 5  # above Linux's largest pid_max: a PID of another namespace, never visible here
HW_THERMAL, SW_POWER_CAP = 0x40, 0x4


@pytest.fixture
def stranger() -> Iterator[int]:
    """Another job's process: started through a shell that exits at once, so it descends from no process of ours."""
    shell = subprocess.run(["sh", "-c", "sleep 60 >/dev/null 2>&1 & echo $!"], capture_output=True, text=True,
                           check=True)
    pid = int(shell.stdout)
    yield pid
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)


@pytest.fixture
def loadavg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A quiet host unless the test writes more load into the file."""
    path = tmp_path / "loadavg"
    path.write_text("0.10 0.10 0.10 1/100 1\n")
    monkeypatch.setenv(LOADAVG_ENV, str(path))
    return path


def watched(seconds: float = 0.05) -> dict:
    """A node leader's part for a window of `seconds` sampled by the real watch every 10 ms."""
    watch = Watch(leader=True, every_s=0.01).start()
    start = time.monotonic_ns()
    time.sleep(seconds)
    end = time.monotonic_ns()
    watch.stop()
    return watch.part((start, end))


def test_a_run_beside_another_job_is_disturbed_says_by_whom_and_keeps_its_status(
        tmp_path: Path, fake_pynvml, h100_trace_dir: Path, stranger: int, loadavg: Path,
        capsys: pytest.CaptureFixture) -> None:
    child = subprocess.Popen(["sleep", "60"])  # a child of the run's process: the run's own, never another job's
    try:
        loadavg.write_text(f"{4 * (os.cpu_count() or 1) + 1:.2f} 1.00 1.00 3/300 {stranger}\n")
        fake_pynvml.configure(h100_trace_dir, devices=2, overrides={
            0: {"processes": {os.getpid(): 2 * GIB, child.pid: GIB, stranger: 3 * GIB}},
            1: {"event_reasons": HW_THERMAL | SW_POWER_CAP}})
        code = llm_training_main(["train", *TINY, "--warmup-iterations", "1", "--iterations", "5", "--log-interval",
                                  "1", "--energy-methods", "nvml", "--no-idle-baseline",
                                  "--out-dir", str(tmp_path / "run")])
    finally:
        child.kill()
        child.wait()
    assert code == 0
    path = tmp_path / "run" / "run_record.json"
    record = json.loads(path.read_text())
    assert record["status"] == "OK"  # disturbed is said, never a status
    block = record["disturbed"]
    checks = block["checks"]
    assert block["disturbed"] is True and block["window"] == "steady"
    others = checks["other_processes"]["value"]
    assert [(p["pid"], p["name"], p["used_memory_bytes"]) for p in others] == [(stranger, "sleep", 3 * GIB)]
    assert f"pid {stranger} (sleep, 3.0 GiB)" in checks["other_processes"]["reason"]
    assert checks["host_load"]["value"] == 1.0 and checks["host_load"]["cores"] == os.cpu_count()
    clocks = checks["clock_events"]
    device = next(d for d, names in clocks["value"].items() if "hw_thermal_slowdown" in names)
    assert clocks["value"][device]["sw_power_cap"] == 1.0 and "sw_power_cap" not in clocks["counted"]
    assert clocks["reason"].endswith(f"hw_thermal_slowdown on {device} (100%)")
    step = checks["step_time_cv"]  # the loop's 5 steady steps (log interval 1); a shared CPU decides the value
    assert step["samples"] == 5 and step["threshold"] == STEP_CV_MAX and step["value"] >= 0
    assert block["reasons"] == [c["reason"] for c in checks.values() if c["disturbed"]]
    assert record["warnings"][0] == "disturbed: " + "; ".join(block["reasons"])

    fields = jbrecord.table_fields(RunRecord.from_dict(record), {})
    assert fields["short_note"].startswith("disturbed: ") and fields["note"].count(f"pid {stranger}") == 1
    assert table_rows(load_runs([path]))[0]["note"].startswith("disturbed: ")

    quiet = tmp_path / "quiet" / "run_record.json"  # the same figures, judged undisturbed
    quiet.parent.mkdir()
    quiet.write_text(json.dumps({**record, "run_id": "quiet", "disturbed": {**block, "disturbed": False,
                                                                             "reasons": []}}))
    capsys.readouterr()
    assert report_main(["--compare", str(quiet), str(path)]) == 0
    out = capsys.readouterr().out.replace("\n" + " " * 4, " ")  # the 160-column wrapping undone (continuations)
    named = [line for line in out.splitlines() if "was disturbed" in line]
    assert len(named) == 1 and f"pid {stranger} (sleep, 3.0 GiB)" in " ".join(named[0].split())


def test_a_quiet_run_is_not_disturbed_and_every_check_has_its_value(fake_pynvml, h100_trace_dir: Path,
                                                                    loadavg: Path) -> None:
    fake_pynvml.configure(h100_trace_dir, overrides={0: {"processes": {os.getpid(): GIB}}})
    block = judge([watched()], [0.100, 0.102, 0.098, 0.101], "log intervals' mean step times")
    checks = block["checks"]
    assert block == {"disturbed": False, "reasons": [], "window": "steady", "checks": checks}
    assert checks["other_processes"]["value"] == [] and checks["other_processes"]["samples"] >= 1
    assert checks["host_load"]["value"] == 0.0 and checks["step_time_cv"]["value"] < 0.02
    assert checks["clock_events"]["disturbed"] is False


def test_step_time_spread_is_judged_on_the_step_times_given() -> None:
    stalls = [0.1] * 8 + [0.3] * 2  # two steps stalled threefold: CV 57 %
    block = judge([], stalls, "decode steps")
    step = block["checks"]["step_time_cv"]
    assert block["disturbed"] is True and step["value"] == pytest.approx(0.571, abs=1e-3)
    assert block["reasons"] == ["step-time spread: CV 57% over 10 decode steps (threshold 10%)"]
    assert judge([], [0.1, 0.3], "decode steps")["checks"]["step_time_cv"]["disturbed"] is None  # too few
    why = "a load's engine steps differ by design"
    unjudged = judge([], None, why)["checks"]
    assert unjudged["step_time_cv"] == {"disturbed": None, "unavailable_reason": why}
    assert unjudged["host_load"]["unavailable_reason"] == "no steady window was sampled"


def test_without_nvml_the_device_checks_are_na_with_the_reason_and_the_load_still_counts(
        fake_pynvml, loadavg: Path) -> None:
    loadavg.write_text(f"{4 * (os.cpu_count() or 1) + 1:.2f} 1 1 1/1 1\n")
    block = judge([watched()], None, "no step times")
    checks = block["checks"]
    for name in ("other_processes", "clock_events"):
        assert checks[name]["disturbed"] is None and "nvmlInit failed" in checks[name]["unavailable_reason"]
    assert block["disturbed"] is True and block["reasons"][0].startswith(
        "host load: 1-minute load (including this run's threads) above")


def test_pids_of_another_namespace_count_where_ours_are_seen_or_outnumber_the_run(fake_pynvml, h100_trace_dir: Path,
                                                                                   loadavg: Path) -> None:
    fake_pynvml.configure(h100_trace_dir, overrides={0: {"processes": {HIDDEN_PID: None}}})
    alone = judge([watched()], None, "-")["checks"]["other_processes"]
    assert alone["disturbed"] is False and "cannot be told apart" in alone["note"]
    fake_pynvml.configure(h100_trace_dir, overrides={0: {"processes": {HIDDEN_PID: None, HIDDEN_PID + 1: GIB}}})
    crowded = judge([watched()], None, "-")["checks"]["other_processes"]  # two processes for a run of one
    assert crowded["disturbed"] is True and "for this run's 1 processes" in crowded["note"]
    assert f"pid {HIDDEN_PID + 1} (not visible here, 1.0 GiB)" in crowded["reason"]
    fake_pynvml.configure(h100_trace_dir, overrides={0: {"processes": {HIDDEN_PID: None, os.getpid(): GIB}}})
    beside = judge([watched()], None, "-")["checks"]["other_processes"]
    assert beside["disturbed"] is True and f"pid {HIDDEN_PID} (not visible here, memory n/a)" in beside["reason"]
    assert beside["value"][0]["node"] == node_name() and "note" not in beside


def test_a_failing_nvml_call_makes_its_check_na_with_nvmls_error(fake_pynvml, h100_trace_dir: Path,
                                                                 loadavg: Path) -> None:
    fails = (fake_pynvml.Fail("nvmlDeviceGetComputeRunningProcesses"),)
    fake_pynvml.configure(h100_trace_dir, faults=fake_pynvml.Faults(fails=fails))
    checks = judge([watched()], None, "-")["checks"]
    assert checks["other_processes"]["disturbed"] is None
    assert "running processes: Not Supported" in checks["other_processes"]["unavailable_reason"]
    assert checks["clock_events"]["disturbed"] is False  # the other call still answers


def _sampling_thread_ended() -> None:
    """Wait for a sampling thread left inside a slow call, so that it never calls the fake of the next test."""
    for thread in threading.enumerate():
        if thread.name == "joulebench-disturbed":
            thread.join()


@pytest.mark.parametrize("stuck", ["nvmlDeviceGetUUID", "nvmlDeviceGetComputeRunningProcesses"])
def test_a_stuck_nvml_call_neither_holds_the_run_nor_counts(fake_pynvml, h100_trace_dir: Path, loadavg: Path,
                                                           stuck: str) -> None:
    fake_pynvml.configure(h100_trace_dir, faults=fake_pynvml.Faults(slow_ms={stuck: 2600}))
    try:
        began = time.monotonic()
        watch = Watch(leader=True, every_s=0.01).start()  # opening the probe (UUID) is the thread's, never the run's
        start = time.monotonic_ns()
        assert time.monotonic() - began < 0.5
        time.sleep(0.05)
        end = time.monotonic_ns()
        began = time.monotonic()
        watch.stop()
        assert time.monotonic() - began < 2.4  # two periods, at least 2 s: not the stuck call's 2.6 s
        checks = judge([watch.part((start, end))], None, "-")["checks"]
    finally:
        _sampling_thread_ended()
    for name in ("other_processes", "clock_events"):
        assert checks[name]["disturbed"] is None
        assert "the GPUs' state call did not return within 2 s" in checks[name]["unavailable_reason"]


def test_a_rank_whose_view_failed_makes_every_check_na() -> None:
    block = judge([{"unjudged": "rank 1's view failed: OSError: gone"}, watched()], [0.1] * 5, "steps")
    assert block["disturbed"] is None and block["reasons"] == []
    assert {c["unavailable_reason"] for c in block["checks"].values()} == {"rank 1's view failed: OSError: gone"}


def test_node_identities_of_one_host_see_each_others_ranks_as_the_runs(fake_pynvml, h100_trace_dir: Path,
                                                                      loadavg: Path, stranger: int,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A multi-identity local system: rank 1 (here the stranger's PID) is node n1 on this same host; its process on
    the GPUs that node n0's leader samples is the run's, never another job's."""
    fake_pynvml.configure(h100_trace_dir, overrides={0: {"processes": {os.getpid(): GIB, stranger: GIB}}})
    monkeypatch.setenv("JPWR_NODE_NAME", "n0")
    leader = watched()
    monkeypatch.setenv("JPWR_NODE_NAME", "n1")
    rank1 = {**Watch(leader=False).part(None), "pid": stranger}
    checks = judge([leader, rank1], None, "-")["checks"]
    assert checks["other_processes"]["disturbed"] is False and checks["other_processes"]["value"] == []
    rank1_elsewhere = {**rank1, "host": "another-host:boot"}
    assert judge([leader, rank1_elsewhere], None, "-")["checks"]["other_processes"]["disturbed"] is True


def test_a_judgement_that_fails_makes_every_check_na_and_the_run_goes_on(tmp_path: Path, fake_pynvml,
                                                                         h100_trace_dir: Path, loadavg: Path) -> None:
    """Step times a judgement cannot reduce (a driver's bug): the record says why no check was made, the run is OK."""
    fake_pynvml.configure(h100_trace_dir)
    with Lifecycle("llm_training", LaunchEnv.from_env()) as life, \
            life.run("judged", tmp_path / "run", {}, metrics=lambda record: {"work_unit": "tokens"}) as run:
        meter = run.open_meter(methods="nvml", read_every_s=0.05)
        meter.begin(WINDOW, 0)
        time.sleep(0.1)
        meter.end(WINDOW, 3, {"tokens": 30.0})
        run.step_times(["0.1 s"] * 3, "log intervals' mean step times")  # type: ignore[list-item]
    assert life.exit_code() == 0
    record = json.loads((tmp_path / "run" / "run_record.json").read_text())
    assert record["status"] == "OK" and record["disturbed"]["disturbed"] is None
    reasons = {check["unavailable_reason"] for check in record["disturbed"]["checks"].values()}
    assert len(reasons) == 1
    assert reasons.pop().startswith("whether the run was disturbed could not be judged: TypeError")
    assert any(w.startswith("whether the run was disturbed could not be judged") for w in record["warnings"])
