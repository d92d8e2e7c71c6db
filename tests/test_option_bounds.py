"""Every command at both ends of every numeric option's range (issue 32 item 4).

tests/test_numeric_options.py checks that each range is stated and enforced at the parser; this file runs the
commands at the ends. Lower bounds: every command and sub-command with each numeric option at its smallest
admitted value must end within 120 s with a clean code (0, a refusal, 69 where a GPU is needed, 124 for a stop
at the time limit) and no traceback. Options that do not interact share one invocation; the table RUNS says which
invocation covers which option, and the first test checks that every option the parsers have is covered. Upper
bounds: the drivers' through their validate twins (accepted, or refused by a check such as the memory estimate,
before any work); the others by a run that ends on its own, or is stopped by SIGTERM after a few seconds and must
stop cleanly. The values are read from the parsers, so a changed range is followed here.

Real parts throughout: the drivers (Megatron training included, its import done before the clock starts) and
jpwr's verbs in-process where the pytest process can host them, jpwr's sampler processes and the runs stopped by
SIGTERM as real subprocesses; fake GPU only at pynvml.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.test_numeric_options import _numeric

# The ports at the ends of --metrics-port's range (1, 65535) are the same for every run of every process: under
# xdist two of this file's runs on two workers collided on one ("Address already in use"), so the file runs on the
# one worker of machine-wide tests.
pytestmark = pytest.mark.machine_wide

REPO = Path(__file__).resolve().parents[1]
H100_TRACE = REPO / "tests" / "data" / "h100_trace"
REPORT_RECORD = REPO / "tests" / "reports" / "data" / "resnet50_cpu_replay" / "b2" / "run_record.json"
CLEAN = (0, 64, 69, 124)  # done, refused, needs a GPU, stopped at its time limit
STOPPED = (0, 124, 143, -signal.SIGTERM)  # after SIGTERM: a clean stop, or Python's default end by the signal
# A range end that makes a command run away (a loop of 1e9 steps, a wait without end) takes far longer; Megatron's
# set-up alone took 47-62 s in loaded full runs on 2 cores (in-process, 1 iteration, 2026-12-02), 15 s on an idle one.
LIMIT_S = 120
# sub-commands whose options are their validate twin's: the twin checks their upper bounds before any work
TWINS = {("python -m llm_training", "train"): "validate", ("python -m resnet50", "train"): "validate",
         ("python -m llm_inference", "run"): "validate", ("python -m llm_inference", "load"): "validate-load"}
SUBPROCESS = {"jpwr --": ["-m", "jpwr"],
              "jpwr serve": ["-m", "jpwr", "serve"], "jpwr info": ["-m", "jpwr", "info"],
              "jpwr qualify": ["-m", "jpwr", "qualify"], "python -m resnet50": ["-m", "resnet50"],
              "joulebench demo": ["-m", "joulebench", "demo"]}


def _in_process(command: str) -> Callable[[list[str]], int]:
    """The command's main behind its error boundary (a traceback would be an 'internal error' there)."""
    from joulebench.analysis.cli import main as joulebench
    from jpwr.cli import main as jpwr
    from llm_inference.cli import main as inference
    from llm_training.cli import main as training
    from resnet50.cli import main as resnet

    verbs = {"jpwr combine": ["combine"], "jpwr info": ["info"], "jpwr selftest": ["selftest"],
             "joulebench attribute": ["attribute"], "joulebench report --pareto": ["report", "--pareto"],
             "joulebench plan": ["plan"], "joulebench recommend": ["recommend"]}
    if command in verbs:
        main = jpwr if command.startswith("jpwr") else joulebench
        return lambda argv: main([*verbs[command], *argv])
    return {"python -m llm_training": training, "python -m resnet50": resnet, "python -m llm_inference": inference}[
        command]


@dataclasses.dataclass(frozen=True)
class Run:
    """One invocation: `command` (a key of _commands()) with `argv` (what makes it small; {tmp} is the test's
    directory) and the options in `options` at their `end` of the range."""

    name: str
    command: str
    argv: tuple[str, ...]
    options: tuple[str, ...]
    end: str = "low"
    process: bool = False  # a real subprocess (Megatron, jpwr's sampler) instead of the pytest process
    stop_after_s: float | None = None  # SIGTERM after this long (a subprocess), else it must end on its own
    codes: tuple[int, ...] = CLEAN
    preload: str | None = None  # imported before the clock starts: Megatron's import alone takes 10-40 s on 2 cores

    @property
    def sub(self) -> str | None:
        return self.argv[0] if self.argv and not self.argv[0].startswith("-") and self.command.startswith(
            "python -m") else None


TINY_LLM = ("--model", "tiny", "--device", "cpu", "--no-idle-baseline")
TINY_INF = ("--preset", "tiny", "--task", "tiny", "--device", "cpu", "--no-idle-baseline")
RESNET = ("--framework", "pytorch", "--device", "cpu", "--precision", "fp32", "--no-idle-baseline")
JPWR_FAST = ("--methods", "nvml", "--out", "{tmp}/o")
METERING = ("--interval", "--counter-interval", "--min-coverage", "--metrics-port")
# one record is too few settings to recommend from: a clean refusal (64) after every bound is parsed
RECOMMEND_BOUNDS = ("--max-p90-tpot-ms", "--max-p90-ttft-ms", "--min-throughput", "--min-coverage", "--repeats")
SHORTEST_WINDOW = ("--steady-seconds", repr(math.nextafter(0.0, 1.0)))  # not a Number ('auto' too): its lowest by hand
RUNS = (
    # ---- drivers, lower bounds: runs that do their work, and options whose lower bound stops or is refused
    Run("train-smallest", "python -m llm_training", ("train", *TINY_LLM, "--out-dir", "{tmp}/run", "--hidden-size",
        "2"), ("--tensor-parallel", "--pipeline-parallel", "--micro-batch-size", "--global-batch-size",
               "--seq-length", "--num-layers", "--num-attention-heads", "--ffn-hidden-size", "--vocab-size",
               "--iterations", "--warmup-iterations", "--replay-phases", "--log-interval", "--seed", "--lr",
               "--min-lr", "--lr-warmup-samples", "--lr-decay-samples", "--weight-decay", "--clip-grad",
               "--adam-beta1", "--adam-beta2", "--adam-eps", "--init-method-std", "--attention-dropout",
               "--hidden-dropout", "--initial-loss-scale", "--loss-scale-window", "--loss-scale-hysteresis",
               "--min-loss-scale"), codes=(0,), preload="llm_training.train"),
    Run("train-stops-at-once", "python -m llm_training", ("train", *TINY_LLM, "--out-dir", "{tmp}/run"),
        ("--exit-duration-mins",), codes=(124,), preload="llm_training.train"),
    Run("train-odd-head", "python -m llm_training", ("train", *TINY_LLM, "--out-dir", "{tmp}/run"),
        ("--hidden-size",), codes=(64,)),
    Run("resnet-smallest", "python -m resnet50", ("train", *RESNET, "--image-size", "64", "--out-dir", "{tmp}/run"),
        ("--global-batch-size", "--iterations", "--warmup-iterations", "--data-workers", "--log-interval", "--seed",
         "--lr", "--replay-phases"), codes=(0,)),
    Run("resnet-stops-at-once", "python -m resnet50", ("train", *RESNET, "--image-size", "64", "--global-batch-size",
        "2", "--log-interval", "1", "--out-dir", "{tmp}/run"), ("--exit-duration-mins",), codes=(124,)),
    Run("resnet-image-too-small", "python -m resnet50", ("train", *RESNET, "--out-dir", "{tmp}/run"),
        ("--image-size",), codes=(64,)),
    Run("make-data-smallest", "python -m resnet50", ("make-data", "{tmp}/data", "--format", "jpeg"),
        ("--images", "--classes", "--shards", "--image-size", "--seed"), codes=(0,)),
    Run("inference-smallest", "python -m llm_inference", ("run", *TINY_INF, *SHORTEST_WINDOW, "--out-dir", "{tmp}/run"),
        ("--batch-size", "--num-batches", "--output-length", "--seed", "--warmup-batches", "--tensor-parallel"),
        codes=(0,)),
    Run("inference-stops-at-once", "python -m llm_inference", ("run", *TINY_INF, "--out-dir", "{tmp}/run"),
        ("--exit-duration-mins",), codes=(124,)),
    Run("load-smallest", "python -m llm_inference", ("load", *TINY_INF, "--rate", "max", *SHORTEST_WINDOW, "--out-dir",
                                                     "{tmp}/run"),
        ("--max-concurrency", "--requests", "--warmup-requests", "--output-length", "--slo-ttft-ms", "--slo-tpot-ms",
         "--seed", "--tensor-parallel", "--admit-divisor"),
        codes=(0, 1)),  # 1: FAILED naming the fix where one request cannot open the load's window
    Run("load-stops-at-once", "python -m llm_inference", ("load", *TINY_INF, "--rate", "max", "--out-dir",
        "{tmp}/run"), ("--exit-duration-mins",), codes=(124,)),
    Run("load-unreachable-server", "python -m llm_inference", ("load", *TINY_INF, "--rate", "max", "--requests", "1",
        "--max-concurrency", "1", "--url", "http://127.0.0.1:9", "--out-dir", "{tmp}/run"),
        ("--request-timeout", "--retries"),
        codes=(1,)),  # FAILED: nothing listens there
    Run("load-server-never-ready", "python -m llm_inference", ("load", *TINY_INF, "--rate", "max", "--requests", "1",
        "--max-concurrency", "1", "--server-command", "sleep 30", "--out-dir", "{tmp}/run"),
        ("--server-port", "--server-ready-timeout"),
        codes=(1,)),  # FAILED: not ready within the smallest timeout
    Run("save-checkpoint-low", "python -m llm_inference", ("save-checkpoint", "--preset", "tiny", "--out",
        "{tmp}/ckpt"), ("--seed",), codes=(0,)),
    Run("save-checkpoint-high", "python -m llm_inference", ("save-checkpoint", "--preset", "tiny", "--out",
        "{tmp}/ckpt"), ("--seed",), end="high", codes=(0,)),
    Run("make-data-largest", "python -m resnet50", ("make-data", "{tmp}/data", "--format", "jpeg"),
        ("--images", "--classes", "--shards", "--image-size", "--seed"), end="high", process=True, stop_after_s=3.0,
        codes=STOPPED),
    # ---- jpwr
    Run("wrap-low", "jpwr --", JPWR_FAST, METERING, process=True,
        codes=(0,)),
    Run("wrap-high", "jpwr --", JPWR_FAST, METERING, end="high",
        process=True, codes=(0,)),
    Run("serve-low", "jpwr serve", JPWR_FAST, METERING, process=True,
        stop_after_s=0.0, codes=(0,)),
    Run("serve-high", "jpwr serve", JPWR_FAST, METERING, end="high",
        process=True, stop_after_s=0.0, codes=(0,)),
    Run("combine-low", "jpwr combine", ("{tmp}/metered/jpwr",), ("--expected-nodes",), codes=(0,)),
    Run("combine-high", "jpwr combine", ("{tmp}/metered/jpwr",), ("--expected-nodes",), end="high", codes=(0,)),
    Run("info-low", "jpwr info", (), ("--probe-seconds",), codes=(0,)),
    Run("info-high", "jpwr info", (), ("--probe-seconds",), end="high", process=True, stop_after_s=2.0,
        codes=STOPPED),
    Run("selftest-low", "jpwr selftest", ("--out", "{tmp}/s"), ("--repeats", "--seconds", "--on-fraction",
                                                                 "--interval", "--lock-offsets")),
    Run("selftest-high", "jpwr selftest", ("--out", "{tmp}/s"), ("--repeats", "--seconds", "--on-fraction",
                                                                  "--interval", "--lock-offsets"), end="high"),
    Run("qualify-low", "jpwr qualify", ("nvml", "nvml-power-poll:100ms", "--load1", "true", "--load2", "true",
                                        "--out", "{tmp}/q"),
        ("--window-seconds", "--lead-seconds", "--offset-a", "--offset-b", "--max-clock-offset", "--offset-search",
         "--pass-limit", "--target"), process=True, codes=(0, 1, 2)),  # PASS, FAIL, INVALID (too short to judge)
    Run("qualify-high", "jpwr qualify", ("nvml", "nvml-power-poll:100ms", "--load1", "true", "--load2", "true",
                                         "--out", "{tmp}/q"),
        ("--window-seconds", "--lead-seconds", "--offset-a", "--offset-b", "--max-clock-offset", "--offset-search",
         "--pass-limit", "--target"), end="high", process=True, stop_after_s=3.0, codes=STOPPED),
    Run("demo-low", "joulebench demo", ("--out", "{tmp}/demo"), ("--replay-phases",), process=True, codes=(0,)),
    Run("demo-high", "joulebench demo", ("--out", "{tmp}/demo"), ("--replay-phases",), end="high", process=True,
        stop_after_s=3.0, codes=STOPPED),
    # ---- analysis verbs on small data: a synthetic metered run, a shipped record, a two-clock profile
    Run("attribute-low", "joulebench attribute", ("{tmp}/metered", "--no-write"),
        ("--bootstrap", "--seed", "--idle-power-w"), codes=(0,)),
    Run("attribute-high", "joulebench attribute", ("{tmp}/metered", "--no-write"),
        ("--bootstrap", "--seed", "--idle-power-w"), end="high", codes=(0,)),
    Run("pareto-low", "joulebench report --pareto", (str(REPORT_RECORD),), ("--min-coverage",), codes=(0,)),
    Run("pareto-high", "joulebench report --pareto", (str(REPORT_RECORD),), ("--min-coverage",), end="high",
        codes=(0,)),
    Run("recommend-low", "joulebench recommend", (str(REPORT_RECORD),), RECOMMEND_BOUNDS, codes=(0, 64)),
    Run("recommend-high", "joulebench recommend", (str(REPORT_RECORD),), RECOMMEND_BOUNDS, end="high", codes=(0, 64)),
    Run("plan-low", "joulebench plan", ("--profile", "{tmp}/profile.csv"), ("--switch-latency",), codes=(0,)),
    Run("plan-high", "joulebench plan", ("--profile", "{tmp}/profile.csv"), ("--switch-latency",), end="high",
        codes=(0,)),
)


def _value(number: object, end: str) -> str:
    """The smallest (largest) value the range admits: the bound itself, or the next float inside an open end."""
    bound, open_end, inward = ((number.low, number.low_open, math.inf) if end == "low" else
                               (number.high, number.high_open, -math.inf))
    if number.kind is int:
        return str(int(bound) + (0 if not open_end else 1 if end == "low" else -1))
    return repr(math.nextafter(bound, inward) if open_end else float(bound))


def _types(monkeypatch: pytest.MonkeyPatch) -> dict[tuple[str, str | None, str], object]:
    """(command, sub-command, option) -> its Number, for every numeric option of every parser."""
    return {(command, path[0] if path else None, action.option_strings[-1]): action.type
            for command, path, action in _numeric(monkeypatch)}


def _argv(run: Run, types: dict, tmp: Path) -> list[str]:
    values = [f"{option}={_value(types[run.command, run.sub, option], run.end)}" for option in run.options]
    fixed = [part.replace("{tmp}", str(tmp)) for part in run.argv]
    if run.command == "jpwr --":
        return [*fixed, *values, "--", "true"]
    head = fixed[:1] if run.sub else []
    return [*head, *values, *fixed[len(head):]]


def test_every_option_is_run_at_both_ends(monkeypatch: pytest.MonkeyPatch) -> None:
    types = _types(monkeypatch)
    covered = {(run.command, run.sub, option, run.end) for run in RUNS for option in run.options}
    unknown = {(c, s, o) for c, s, o, _ in covered} - types.keys()
    assert not unknown, f"RUNS names options the parsers do not have: {sorted(map(str, unknown))}"
    validated = {key for key in types if key[1] in ("validate", "validate-load")}  # the loops below
    missing = []
    for key in types:
        command, sub, option = key
        twin = (command, TWINS.get((command, sub)), option)
        if key not in validated and (*key, "low") not in covered:
            missing.append(f"{command} {sub or ''} {option} at its lower bound")
        if key not in validated and twin not in validated and (*key, "high") not in covered:
            missing.append(f"{command} {sub or ''} {option} at its upper bound")
    assert not missing, "options no invocation covers (add them to RUNS):\n" + "\n".join(missing)


def _prepare(run: Run, tmp: Path, fake_env: Callable[..., dict[str, str]]) -> None:
    """The small inputs a run reads: a metered run (jpwr combine, attribute), a two-clock profile (plan)."""
    if any(part.startswith("{tmp}/metered") for part in run.argv):
        import pynvml  # the fake (tests/conftest.py)

        from tests.analysis import synthetic_run

        try:
            synthetic_run.run(tmp / "metered", pynvml, steady_s=6.0)
        finally:
            pynvml.reset()
    if "{tmp}/profile.csv" in run.argv:
        (tmp / "profile.csv").write_text("phase,clock,time_s,energy_j\nforward,default,0.1,10\nforward,1110,0.12,8\n"
                                         "backward,default,0.2,20\nbackward,1110,0.22,18\n")


def _subprocess(run: Run, argv: list[str], tmp: Path, env: dict[str, str]) -> tuple[int, str]:
    proc = subprocess.Popen([sys.executable, *SUBPROCESS[run.command], *argv], cwd=tmp, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        if run.stop_after_s is not None:
            ready = tmp / "o" / "n0" / "ready"  # jpwr serve says when it listens; the others run a while first
            deadline = time.monotonic() + LIMIT_S
            while run.command == "jpwr serve" and not ready.exists() and proc.poll() is None:
                assert time.monotonic() < deadline, f"{run.name}: jpwr serve not ready after {LIMIT_S} s"
                time.sleep(0.05)
            time.sleep(run.stop_after_s)
            os.killpg(proc.pid, signal.SIGTERM)  # as a terminal or Slurm does: the command and its children
        out, _ = proc.communicate(timeout=LIMIT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"{run.name}: {' '.join(argv)} did not end within {LIMIT_S} s:\n{out[-3000:]}")
    finally:  # whatever the command left running in its group (a load, a sampler) goes with it
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    return proc.returncode, out


@pytest.mark.timeout(2 * LIMIT_S)  # the run's own limit is LIMIT_S; the rest is setting up its input
@pytest.mark.parametrize("run", RUNS, ids=lambda run: run.name)
def test_each_command_ends_cleanly_at_the_ends_of_its_ranges(run: Run, tmp_path: Path, fake_env,
                                                             monkeypatch: pytest.MonkeyPatch,
                                                             capfd: pytest.CaptureFixture[str]) -> None:
    types = _types(monkeypatch)
    _prepare(run, tmp_path, fake_env)
    argv = _argv(run, types, tmp_path)
    if run.preload:
        importlib.import_module(run.preload)
    started = time.monotonic()
    if run.process:
        env = fake_env(JPWR_FAKE_NVML_TRACE=str(H100_TRACE), JPWR_ADDR=str(tmp_path / "s.sock"),
                       JPWR_NODE_NAME="n0")
        code, out = _subprocess(run, argv, tmp_path, env)
    else:
        monkeypatch.chdir(tmp_path)
        try:
            code = _in_process(run.command)(argv)
        except SystemExit as ended:
            code = ended.code
        out = "".join(capfd.readouterr())
    took = time.monotonic() - started
    said = f"{run.name}: {run.command} {' '.join(argv)} -> {code} after {took:.1f} s:\n{out[-4000:]}"
    assert code in run.codes, said
    assert took < LIMIT_S, said
    assert "Traceback" not in out and "internal error" not in out, said


def _validate_all(end: str, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> list[str]:
    """Each option of the drivers' validate and validate-load at `end`, one at a time, on the smallest config."""
    base = {"python -m llm_training": ["--model", "tiny", "--device", "cpu"],
            "python -m resnet50": ["--framework", "pytorch", "--device", "cpu"],
            "python -m llm_inference": ["--preset", "tiny", "--device", "cpu"]}
    problems, checked = [], 0
    for (command, sub, option), number in _types(monkeypatch).items():
        if sub not in ("validate", "validate-load"):
            continue
        argv = [sub, *base[command], f"{option}={_value(number, end)}", *(["--rate=1"] * (sub == "validate-load"))]
        try:
            code = _in_process(command)(argv)
        except SystemExit as ended:
            code = ended.code
        out = "".join(capfd.readouterr())
        checked += 1
        if code not in (0, 64) or "Traceback" in out or "internal error" in out:
            problems.append(f"{command} {' '.join(argv)} -> {code}: {out[-1500:]}")
    assert checked >= 60  # llm_training, resnet50 and llm_inference's validate twins
    return problems


@pytest.mark.timeout(LIMIT_S)
@pytest.mark.parametrize("end", ["low", "high"])
def test_validate_accepts_or_refuses_every_driver_option_at_each_end(end: str, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch,
                                                                      capfd: pytest.CaptureFixture[str]) -> None:
    """The upper bounds of train, run and load are checked here, through the twin that accepts exactly their
    options: a value the memory estimate or another check cannot run is refused (64) before any work."""
    monkeypatch.chdir(tmp_path)
    problems = _validate_all(end, monkeypatch, capfd)
    assert not problems, "\n\n".join(problems)


def test_value_helper_reads_open_and_closed_ends() -> None:
    from joulebench.arguments import COUNT, SECONDS

    assert (_value(COUNT, "low"), _value(COUNT, "high")) == ("1", "10000000")
    assert float(_value(SECONDS, "low")) == math.nextafter(0.0, 1.0) and _value(SECONDS, "high") == "604800.0"


@pytest.mark.parametrize(("command", "argv"), [
    ("joulebench plan", ["--profile", "{file}.csv"]),
    ("joulebench plan", ["--profile", "{file}.json"]),
    ("python -m llm_inference", ["validate-load", "--preset", "tiny", "--device", "cpu", "--trace", "{file}.jsonl"]),
])
def test_a_text_file_that_is_not_utf8_is_named_not_an_internal_error(command: str, argv: list[str], tmp_path: Path,
                                                                     capfd: pytest.CaptureFixture[str]) -> None:
    for suffix in (".csv", ".json", ".jsonl"):
        (tmp_path / f"bad{suffix}").write_bytes(b"\xff\xfe\x00\x81 not text\n")
    code = _in_process(command)([part.replace("{file}", str(tmp_path / "bad")) for part in argv])
    err = capfd.readouterr().err
    assert code in (64, 65) and "UTF-8" in err and "Fix:" in err and "internal error" not in err, err
