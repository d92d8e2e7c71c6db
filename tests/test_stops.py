"""Every wait bounded and interruptible, and what a stopped or failed run keeps (joulebench.waits,
joulebench.lifecycle; issue 47 item 2).

A signal in the middle of a long wait ends the run within 10 s with its record: the wait for the next arrival of a
very low rate, and a tracking client's set-up against a server that takes the connection and never answers (on
127.0.0.1, a socket of this test). Ctrl-C is CANCELLED with exit 130 and keeps the steady steps done; a failure
after the steady window keeps the window's figures. Real drivers as subprocesses on the CPU; fake NVML only at the
hardware boundary.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from joulebench.launch import LaunchEnv
from joulebench.lifecycle import INTERRUPTED_EXIT, Lifecycle, StopRequest
from joulebench.loop import LoopSpec, Progress, TrainSteps, run_loop
from joulebench.phases import Replay, replay_phases
from joulebench.record import EXIT_CODES, steady_metrics
from joulebench.waits import SLICE_S, Stopped, call_within, wait_until
from tests.driver_helpers import read_record, summaries

SIGNAL_TO_END_S = 10.0  # a signalled run must have ended, its record written, this soon
# (signal, status, exit code, words of the reason)
STOPS = [(signal.SIGTERM, "TIMEOUT", EXIT_CODES["TIMEOUT"], "SIGTERM received"),
         (signal.SIGINT, "CANCELLED", INTERRUPTED_EXIT, "SIGINT received (Ctrl-C)")]


@contextlib.contextmanager
def silent_server() -> Iterator[tuple[str, threading.Event]]:
    """An HTTP address on 127.0.0.1 that takes every connection and never answers (a tracking server out of reach
    as a client sees it: no refusal, no reply); the event is set once a client connected."""
    connected = threading.Event()
    held: list[socket.socket] = []
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        listener.settimeout(0.2)

        def accept() -> None:
            while listener.fileno() >= 0:
                try:
                    held.append(listener.accept()[0])
                    connected.set()
                except TimeoutError:
                    continue
                except OSError:
                    return

        threading.Thread(target=accept, daemon=True).start()
        try:
            yield f"http://127.0.0.1:{listener.getsockname()[1]}", connected
        finally:
            for connection in held:
                connection.close()


def _read_until(proc: subprocess.Popen[str], marker: str) -> str:
    """The run's stdout up to and with the line starting with `marker`."""
    assert proc.stdout is not None
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if line.startswith(marker):
            return "".join(seen)
    raise AssertionError(f"the run ended before printing {marker!r}: {''.join(seen)[-2000:]}")


def _signal_after(proc: subprocess.Popen[str], marker: str, signum: int, settle_s: float) -> tuple[str, float]:
    """Read the run's stdout up to the line starting with `marker`, wait `settle_s`, send `signum`; returns what
    was printed before it and the time the signal went."""
    seen = _read_until(proc, marker)
    time.sleep(settle_s)
    proc.send_signal(signum)
    return seen, time.monotonic()


def test_a_wait_ends_at_its_deadline_its_event_or_within_a_slice_of_a_stop():
    start = time.monotonic()
    assert wait_until(start + 0.2, lambda: None) is None and 0.2 <= time.monotonic() - start < 0.2 + SLICE_S
    done = threading.Event()
    threading.Timer(0.1, done.set).start()
    start = time.monotonic()
    assert wait_until(None, lambda: None, done) is None and time.monotonic() - start < 0.1 + SLICE_S
    asked = threading.Event()
    threading.Timer(0.3, asked.set).start()
    start = time.monotonic()
    assert wait_until(start + 600, lambda: "SIGTERM received" if asked.is_set() else None) == "SIGTERM received"
    assert time.monotonic() - start < 0.3 + SLICE_S + 0.2


def test_a_bounded_call_returns_raises_times_out_or_is_given_up_at_a_stop():
    assert call_within(lambda: 42, 5.0, "answering") == 42
    with pytest.raises(ValueError, match="bad input"):
        call_within(lambda: int("bad input"), 5.0, "parsing")
    hang = threading.Event()
    start = time.monotonic()
    with pytest.raises(TimeoutError, match=r"opening the tool did not return within 0\.3 s"):
        call_within(hang.wait, 0.3, "opening the tool")
    with pytest.raises(Stopped, match="opening the tool was given up: SIGTERM received"):
        call_within(hang.wait, 600.0, "opening the tool", lambda: "SIGTERM received")
    assert time.monotonic() - start < 2.0
    hang.set()


def test_a_tool_whose_server_never_answers_is_left_out_with_a_warning(tmp_path, monkeypatch):
    import mlflow.tracking  # noqa: F401  (imported before the clock starts: the import is not the wait)

    from joulebench.exports.run import Exports

    with silent_server() as (url, connected):
        monkeypatch.setenv("MLFLOW_TRACKING_URI", url)
        start = time.monotonic()
        exports = Exports(["mlflow"], tmp_path, "r", "resnet50", timeout_s=2.0)
        assert time.monotonic() - start < SIGNAL_TO_END_S
        assert connected.is_set()  # the client did reach the address: it waited for an answer that never came
    assert exports.sinks == []
    assert exports.close() == ["mlflow could not be opened and was left out: TimeoutError: opening mlflow did not "
                               "return within 2 s"]


@pytest.mark.slow
def test_sigterm_while_a_tool_opens_ends_the_run_within_seconds_with_its_record(fake_env, tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "llm_training", "train", "--model", "tiny", "--device", "cpu", "--log-interval", "1",
           "--no-idle-baseline", "--iterations", "100000", "--warmup-iterations", "1", "--log-to", "mlflow",
           "--out-dir", str(out)]
    with silent_server() as (url, connected):
        proc = subprocess.Popen(cmd, env=fake_env(MLFLOW_TRACKING_URI=url), cwd=tmp_path, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        try:
            assert connected.wait(120), "the run never reached the tracking server"
            time.sleep(1.0)  # the client now waits for its answer (it retries for minutes on its own)
            sent = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            stdout, stderr = proc.communicate(timeout=120)
        finally:
            proc.kill()
    _assert_opening_given_up_at_sigterm("mlflow", proc, sent, stdout, stderr, out)


@pytest.mark.slow
@pytest.mark.parametrize(("signum", "status", "code", "words"), STOPS, ids=["SIGTERM", "SIGINT"])
def test_a_signal_while_a_load_waits_for_its_next_arrival_ends_it_within_seconds(fake_env, tmp_path, signum, status,
                                                                                 code, words):
    out = tmp_path / "load"
    # constant arrivals at 0.002/s: the warm-up request at 0 s, the counted ones at 500 s and 1000 s
    cmd = [sys.executable, "-m", "llm_inference", "load", "--preset", "tiny", "--task", "tiny", "--device", "cpu",
           "--max-concurrency", "2", "--rate", "0.002", "--arrivals", "constant", "--no-idle-baseline",
           "--out-dir", str(out)]
    proc = subprocess.Popen(cmd, env=fake_env(), cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        before, sent = _signal_after(proc, "[llm_inference] rate 0.002: 1 warm-up and 2 counted", signum, 3.0)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert time.monotonic() - sent < SIGNAL_TO_END_S, stderr[-3000:]
    assert proc.returncode == code, stderr[-3000:]
    record = read_record(out)
    assert record["status"] == status and words in record["status_reason"], record["status_reason"]
    assert summaries(before + stdout)[-1]["status"] == status


@pytest.mark.slow
def test_ctrl_c_cancels_a_training_run_and_keeps_its_finished_steady_steps(fake_env, tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "llm_training", "train", "--model", "tiny", "--device", "cpu", "--log-interval", "1",
           "--no-idle-baseline", "--iterations", "100000", "--warmup-iterations", "1", "--out-dir", str(out)]
    proc = subprocess.Popen(cmd, env=fake_env(), cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        before, sent = _signal_after(proc, "[llm_training] step 5/", signal.SIGINT, 0.0)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert time.monotonic() - sent < SIGNAL_TO_END_S, stderr[-3000:]
    assert proc.returncode == INTERRUPTED_EXIT == 130, stderr[-3000:]
    assert "KeyboardInterrupt" not in stderr
    record = read_record(out)
    assert record["status"] == "CANCELLED", record["status_reason"]
    assert "SIGINT received (Ctrl-C)" in record["status_reason"] and "stopped cleanly" in record["status_reason"]
    steady = next(window for window in record["windows"] if window["name"] == "steady")
    done = steady["steps"]
    assert done >= 4  # steps 2..5 had finished when the signal came: every one is kept
    assert record["metrics"]["iterations"] == done
    assert summaries(before + stdout)[-1]["status"] == "CANCELLED"


def test_a_second_ctrl_c_stops_at_once_as_cancelled_with_exit_130(tmp_path):
    stop = StopRequest(None)
    stop.on_signal(signal.SIGINT, None)
    assert stop.local_reason() == "SIGINT received (Ctrl-C)" and stop.stopped_status() == "CANCELLED"
    with pytest.raises(KeyboardInterrupt):
        stop.on_signal(signal.SIGINT, None)
    life = Lifecycle("llm_inference", LaunchEnv.from_env({}))
    with life.run("r", tmp_path, {}, metrics=lambda record: {}):
        raise KeyboardInterrupt
    record = read_record(tmp_path)
    assert record["status"] == "CANCELLED" and "stopped at once" in record["status_reason"]
    assert life.exit_code() == INTERRUPTED_EXIT


def test_a_failure_after_the_steady_window_keeps_its_figures(fake_pynvml, h100_trace_dir, tmp_path):
    fake_pynvml.configure(h100_trace_dir)
    life = Lifecycle("resnet50", LaunchEnv.from_env({}))

    def figures(record):
        return steady_metrics(next(w for w in record.windows if w.name == "steady"), "images", 1)

    with life.run("r", tmp_path, {}, metrics=figures) as run:
        meter = run.open_meter(methods="nvml", read_every_s=0.05)
        run.idle_baseline(False, accelerator=True)
        meter.begin("steady", 0)
        time.sleep(2.0)
        meter.end("steady", 10, work={"images": 80.0})
        meter.begin("replay/step", 10)
        raise RuntimeError("the phase replay failed")
    record = read_record(tmp_path)
    assert record["status"] == "FAILED" and record["status_reason"] == "RuntimeError: the phase replay failed"
    assert [window["name"] for window in record["windows"]] == ["steady"]  # the window it failed in is not kept
    metrics = record["metrics"]
    assert metrics["energy_unavailable_reason"] is None, metrics["energy_unavailable_reason"]
    assert metrics["energy_wh"] > 0 and metrics["images_per_wh"] == pytest.approx(80.0 / metrics["energy_wh"])
    assert life.exit_code() == EXIT_CODES["FAILED"]


def test_a_failure_on_several_nodes_says_why_its_windows_have_no_energy(tmp_path, monkeypatch):
    monkeypatch.delenv("JPWR_ADDR", raising=False)
    launch = LaunchEnv.from_env({"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4",
                                 "GROUP_RANK": "0", "NNODES": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"})
    assert launch.num_nodes == 2
    life = Lifecycle("llm_training", launch)
    with life.run("r", tmp_path, {}, metrics=lambda record: {}) as run:
        meter = run.open_meter()
        meter.begin("steady", 0)
        meter.end("steady", 1)
        raise RuntimeError("a peer died")
    record = read_record(tmp_path)
    assert record["status"] == "FAILED"
    assert any("other nodes' energy cannot be gathered after a failure" in w for w in record["warnings"])


def test_a_stop_ends_the_cool_down_before_the_idle_baseline_at_its_next_poll(fake_pynvml, h100_trace_dir, tmp_path):
    from jpwr.idle import SettleRule, wait_until_settled
    from tests.jpwr.test_idle import DrivenClock
    from tests.jpwr.test_sampler_replay import _drive, _replay_sampler

    sampler, clock = _replay_sampler(fake_pynvml, h100_trace_dir, tmp_path)
    _drive(sampler, clock, 5.0)  # inside the recorded matmul: the devices would not settle for 6 s
    asked = []
    result = wait_until_settled(sampler.live, SettleRule(max_wait_s=60.0, hold_s=2.0), DrivenClock(sampler, clock),
                                lambda: "SIGTERM received" if asked.append(1) or len(asked) > 1 else None)
    assert not result.settled and result.note.startswith("not waited for further (SIGTERM received): nvml:")
    assert "power moved" in result.note
    assert result.waited_s <= 1.0 + 1e-9  # one poll (poll_s 1 s) after the first look, not the 60 s bound


# ---- issue 61: every phase hears a stop (before the steady window, the phase replays, the imports) ------------------
def _signal_at(count: int, signum: int) -> Callable[[], None]:
    """A step (or a phase) that takes 2 ms and sends `signum` to this process at its `count`-th call, as Slurm or a
    user would while the run is in that phase."""
    calls = []

    def step() -> None:
        calls.append(1)
        time.sleep(0.002)
        if len(calls) == count:
            os.kill(os.getpid(), signum)

    return step


@pytest.mark.parametrize(("signum", "status", "code", "words"), STOPS, ids=["SIGTERM", "SIGINT"])
def test_a_stop_in_the_warm_up_says_the_run_stopped_before_the_steady_window(tmp_path, signum, status, code, words):
    """Stopped at the 3rd of 1000 warm-up steps: "stopped before the steady window", the windows that exist, and no
    count of measured steps (once "-997 of 10 measured iterations")."""
    spec = LoopSpec(iterations=10, warmup_iterations=1000, steady_seconds=None, cpu_iterations=10, log_interval=1,
                    work_unit="tokens", work_per_step=1.0)
    steps = TrainSteps(step=_signal_at(3, signum), loss=lambda _: 0.0, any_rank=lambda flag: flag,
                       gather=lambda obj: [obj], sync=None)
    with (Lifecycle("llm_training", LaunchEnv.from_env({})) as life,
          life.run("r", tmp_path, {}, metrics=lambda record: {"work_unit": "tokens"}) as run):
        loop = run_loop(steps, run.open_meter(), spec, life.stop, "cpu", Progress("t", spec, False))
        run.stopped_early(loop.completed, loop.planned, spec.warmup_iterations)
    assert life.exit_code() == code
    record = read_record(tmp_path)
    assert record["status"] == status and words in record["status_reason"], record["status_reason"]
    assert record["status_reason"].endswith(": stopped before the steady window, after 3 of 1000 warm-up iterations; "
                                            "windows kept: warmup"), record["status_reason"]
    assert [w["name"] for w in record["windows"]] == ["warmup"]


def test_a_stop_inside_a_phase_replay_window_ends_the_run_at_its_next_check_keeping_what_was_closed(tmp_path):
    """Each phase replayed for at least 60 s; SIGTERM at the 96th invocation inside the first's window (after the four
    that time it): the window closes at its next check (about once a second, counted in invocations timed before the
    window: a loaded machine's later ones can take twice as long) with the invocations done, the second phase never
    starts, and the run ends TIMEOUT saying where it stopped."""
    replays = [Replay("forward", _signal_at(100, signal.SIGTERM)), Replay("backward", lambda: time.sleep(0.002))]
    with (Lifecycle("llm_training", LaunchEnv.from_env({})) as life,
          life.run("r", tmp_path, {}, metrics=lambda record: {}) as run):
        meter = run.open_meter()
        meter.begin("steady", 0)
        meter.end("steady", 1, work={"tokens": 1.0})
        started = time.monotonic()
        replay_phases(meter, replays, 60.0, stop_reason=life.stop.local_reason)
    assert time.monotonic() - started < 5.0  # a check or two, not the phase's 60 s
    assert life.exit_code() == EXIT_CODES["TIMEOUT"]
    record = read_record(tmp_path)
    assert record["status"] == "TIMEOUT", record["status_reason"]
    assert record["status_reason"].startswith("SIGTERM received (Slurm time limit or job cancelled): stopped during "
                                              "the phase replays, in replay/forward after "), record["status_reason"]
    windows = {w["name"]: w for w in record["windows"]}
    assert list(windows) == ["steady", "replay/forward"]
    done = windows["replay/forward"]["work"]["invocations"]
    assert done >= 96 and windows["replay/forward"]["end_reason"] == f"stopped after {done:.0f} invocations"


@pytest.mark.slow
def test_sigterm_during_a_drivers_phase_replays_ends_it_within_seconds_with_its_record(fake_env, h100_trace_dir,
                                                                                      tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "llm_training", "train", "--model", "tiny", "--device", "cpu", "--log-interval", "1",
           "--no-idle-baseline", "--iterations", "3", "--warmup-iterations", "1", "--replay-phases", "120",
           "--energy-methods", "nvml", "--out-dir", str(out)]
    proc = subprocess.Popen(cmd, env=fake_env(JPWR_FAKE_NVML_TRACE=str(h100_trace_dir)), cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        before, sent = _signal_after(proc, "[llm_training] replay 1/", signal.SIGTERM, 2.0)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert time.monotonic() - sent < SIGNAL_TO_END_S, stderr[-3000:]
    assert proc.returncode == EXIT_CODES["TIMEOUT"], stderr[-3000:]
    record = read_record(out)
    assert record["status"] == "TIMEOUT" and "stopped during the phase replays" in record["status_reason"]
    assert record["metrics"]["tokens_per_wh"] is not None  # the steady window measured before it is kept
    assert summaries(before + stdout)[-1]["status"] == "TIMEOUT"


def test_ctrl_c_while_a_driver_imports_its_framework_is_one_line_and_exit_130(fake_env, tmp_path):
    """torch and megatron-core take seconds to import, before any run installs its handlers: Ctrl-C there ends the
    process with one line (once a traceback through the imports; under load, the command line's own imports were
    still running at 1.5 s and gave one too: `python -m` now imports them behind the boundary as well)."""
    cmd = [sys.executable, "-m", "llm_training", "train", "--model", "tiny", "--device", "cpu",
           "--out-dir", str(tmp_path / "run")]
    proc = subprocess.Popen(cmd, env=fake_env(), cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        time.sleep(1.5)  # the command line is parsed in 0.3 s; torch's import alone takes longer than the rest
        assert proc.poll() is None
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert time.monotonic() - sent < SIGNAL_TO_END_S
    assert proc.returncode == INTERRUPTED_EXIT, stderr[-3000:]
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr[-3000:]
    assert "llm_training: error: stopped by Ctrl-C (SIGINT) outside a run" in stderr
    assert not (tmp_path / "run" / "run_record.json").exists()  # no run began: nothing to record


SWALLOWED_CTRL_C = """
import os, signal, sys
from joulebench.boundary import exit_code_of
from joulebench.launch import LaunchEnv
from joulebench.lifecycle import Lifecycle

class Swallowing:
    def __del__(self):
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(100000):  # the handler runs here, inside __del__: Python prints its KeyboardInterrupt, ignored
            pass

def command():
    Swallowing()
    print("after the swallowed Ctrl-C", flush=True)
    with Lifecycle("llm_training", LaunchEnv.from_env({})):
        print("a run began", flush=True)
    return 0

sys.exit(exit_code_of("llm_training", command))
"""


def test_a_ctrl_c_that_python_swallows_during_the_imports_still_stops_the_command_before_its_run(fake_env, tmp_path):
    """A KeyboardInterrupt raised inside a __del__ (or swallowed by a library's bare except) is lost: once, under load,
    Ctrl-C during a driver's imports let the run go to its end with exit 0. The boundary counts every SIGINT, and a run
    does not begin after one."""
    proc = subprocess.run([sys.executable, "-c", SWALLOWED_CTRL_C], env=fake_env(), cwd=tmp_path, capture_output=True,
                          text=True, timeout=60)
    assert "Exception ignored" in proc.stderr and "KeyboardInterrupt" in proc.stderr, proc.stderr  # Python lost it
    assert proc.stdout.splitlines() == ["after the swallowed Ctrl-C"], proc.stdout
    assert proc.returncode == INTERRUPTED_EXIT, proc.stderr
    assert proc.stderr.splitlines()[-1].startswith("llm_training: error: stopped by Ctrl-C (SIGINT) outside a run")


CTRL_C_IN_SOURCE_RUN_FROM_A_STRING = """
import sys
from joulebench.boundary import exit_code_of

def command():
    exec("raise KeyboardInterrupt")  # as a Ctrl-C lands in a dataclass's methods, built from source at import
    return 0

sys.exit(exit_code_of("llm_training", command))
"""
CTRL_C_IN_SOURCE_HANDLED_BY_THE_COMMAND = """
import sys
from joulebench.boundary import exit_code_of

def command():
    try:
        exec("raise KeyboardInterrupt")
    except KeyboardInterrupt:  # as a run's second-Ctrl-C handler does (joulebench.lifecycle): its record, then 130
        print("llm_training: stopped at once by a second Ctrl-C", file=sys.stderr)
        return 130
    return 0

sys.exit(exit_code_of("llm_training", command))
"""


@pytest.mark.parametrize("script, last_line", [
    (CTRL_C_IN_SOURCE_RUN_FROM_A_STRING, "llm_training: error: stopped by Ctrl-C (SIGINT) outside a run"),
    (CTRL_C_IN_SOURCE_HANDLED_BY_THE_COMMAND, "llm_training: stopped at once by a second Ctrl-C"),
], ids=["reaching-the-boundary", "handled-by-the-command"])
def test_a_ctrl_c_inside_code_run_from_a_string_still_exits_130_not_by_the_signal(fake_env, tmp_path, script,
                                                                                  last_line):
    """CPython marks a KeyboardInterrupt that left an `exec` of source as unhandled and, at exit, kills the process by
    SIGINT although it was handled (-2 instead of 130: the full suite saw it once under load, Ctrl-C in a driver's
    imports). The boundary clears that mark, whoever handled the Ctrl-C."""
    (tmp_path / "interrupted_in_exec.py").write_text(script)
    proc = subprocess.run([sys.executable, "-m", "interrupted_in_exec"], env=fake_env(), cwd=tmp_path,  # as drivers run
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == INTERRUPTED_EXIT, (proc.returncode, proc.stderr[-3000:])
    assert proc.stderr.splitlines()[-1].startswith(last_line)


def _assert_opening_given_up_at_sigterm(tool: str, proc: subprocess.Popen, sent: float, stdout: str, stderr: str,
                                        out: Path) -> None:
    """A SIGTERM while a tracking tool was opening: the run ended in time as TIMEOUT, the tool left out and said why."""
    assert time.monotonic() - sent < SIGNAL_TO_END_S, stderr[-3000:]
    assert proc.returncode == EXIT_CODES["TIMEOUT"], stderr[-3000:]
    record = read_record(out)
    assert record["status"] == "TIMEOUT" and "SIGTERM received" in record["status_reason"]
    assert f"--log-to: {tool} was left out: opening {tool} was given up: SIGTERM received" in " ".join(
        record["warnings"]), record["warnings"]
    assert summaries(stdout)[-1]["status"] == "TIMEOUT"


def _closed_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (a W&B server out of reach: connections refused)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _wandb_online_env(fake_env) -> dict[str, str]:
    return fake_env(WANDB_MODE="online", WANDB_BASE_URL=f"http://127.0.0.1:{_closed_port()}",
                    WANDB_API_KEY="0123456789abcdef0123456789abcdef01234567", WANDB_SILENT="true")


# A run's last moments as the drivers end them: a tool opened (here given up after 2 s), the record's result line, then
# the drivers' exit (joulebench.process_exit). W&B online retries its server for minutes and waits for it again in its
# exit handlers (once 70-100 s past the result line).
AFTER_RESULT = """
import sys, time
from pathlib import Path
from joulebench.exports.run import Exports
from joulebench.process_exit import exit_after_run
exports = Exports(["wandb"], Path(sys.argv[1]), "r", "llm_training", timeout_s=2.0, say=print)
exports.close()
print("JOULEBENCH_RESULT status=OK", flush=True)
exit_after_run(0)
"""


def test_wandb_online_with_its_server_out_of_reach_ends_within_seconds_of_the_result_line(fake_env, tmp_path):
    pytest.importorskip("wandb")
    proc = subprocess.Popen([sys.executable, "-c", AFTER_RESULT, str(tmp_path)], env=_wandb_online_env(fake_env),
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        before = _read_until(proc, "JOULEBENCH_RESULT")
        said = time.monotonic()
        proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert time.monotonic() - said < SIGNAL_TO_END_S
    assert proc.returncode == 0
    assert "wandb could not be opened and was left out: TimeoutError: opening wandb did not return within 2 s" in before


@pytest.mark.slow
def test_sigterm_while_wandb_online_opens_against_a_closed_port_ends_the_run_within_seconds(fake_env, tmp_path):
    pytest.importorskip("wandb")
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "llm_training", "train", "--model", "tiny", "--device", "cpu", "--log-interval", "1",
           "--no-idle-baseline", "--iterations", "3", "--warmup-iterations", "1", "--log-to", "wandb",
           "--out-dir", str(out)]
    proc = subprocess.Popen(cmd, env=_wandb_online_env(fake_env), cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(0.5)
        deadline = time.monotonic() + 120
        while not list(tmp_path.rglob("wandb/run-*")) and time.monotonic() < deadline:  # W&B is setting up its run
            time.sleep(0.2)
        time.sleep(1.0)
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        proc.kill()
    _assert_opening_given_up_at_sigterm("wandb", proc, sent, stdout, stderr, out)
