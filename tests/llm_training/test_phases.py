"""Phase marks and the replay mode of the real driver on CPU (gloo), under jpwr with the fake NVML as the GPU.

On one process megatron's timers give forward, backward and the optimizer; with two data-parallel ranks each
rank also marks the gradient reduction that finalize_model_grads waits for. `joulebench attribute` then
reads the run as written.
"""

from __future__ import annotations

import itertools
import sys
import time
from pathlib import Path

import pytest

from joulebench.analysis.plot import find_trace_sources
from joulebench.phases import BACKWARD, FORWARD, GRAD_REDUCE, OPTIMIZER, run_at_least
from jpwr.trace import load_trace
from tests.llm_training.conftest import LLM, TINY, read_record, run_cmd, torchrun

REPLAYS = ["replay/forward", "replay/forward+backward", "replay/optimizer", "replay/step"]


@pytest.mark.parametrize("processes", [1, 2], ids=["one-process", "dp2"])
def test_ranks_mark_each_steps_phases_and_replay_them(fake_env, h100_trace_dir, tmp_path: Path,
                                                      processes: int) -> None:
    run = tmp_path / "run"
    env = fake_env(JPWR_FAKE_NVML_TRACE=str(h100_trace_dir), JPWR_FAKE_NVML_DEVICES=str(processes),
                   OMP_NUM_THREADS="1")
    launcher = torchrun(2) if processes == 2 else [sys.executable]
    train = [*launcher, *LLM[1:], "train", *TINY, "--iterations", "6", "--warmup-iterations", "2",
             "--log-interval", "3", "--out-dir", str(run), "--replay-phases", "0.2"]
    jpwr = [sys.executable, "-m", "jpwr", "--methods", "nvml", "--out", str(run / "jpwr"), "--"]
    result = run_cmd([*jpwr, *train], env, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    record = read_record(run)
    windows = {w["name"]: w for w in record["windows"]}
    assert [name for name in windows if name != "idle"] == ["warmup", "steady", *REPLAYS]  # idle: the baseline
    for name in REPLAYS:  # each at least as long as asked, on every rank alike (a rank short of calls would hang)
        assert windows[name]["work"]["invocations"] >= 3 and windows[name]["energy"]["energy_j"] > 0
        assert windows[name]["duration_s"] >= 0.2, windows[name]

    steady = windows["steady"]
    (trace,) = [load_trace(source) for source in find_trace_sources(run / "jpwr")]
    batches = [b for b in trace.phases if b.window == "steady"]
    assert sorted(b.local_rank for b in batches) == list(range(processes))
    for batch in batches:
        counts = {name: 0 for name in batch.names}
        for name, _, _ in batch.intervals():
            counts[name] += 1
        steps = steady["steps"]
        assert counts[OPTIMIZER] == steps
        assert counts[FORWARD] == counts[BACKWARD] == steps * record["config"]["num_microbatches"]
        assert counts.get(GRAD_REDUCE, 0) == (steps if processes == 2 else 0)
        intervals = sorted(batch.intervals(), key=lambda i: i[1])
        assert all(a[2] <= b[1] for a, b in itertools.pairwise(intervals))  # never overlapping
        # inside this rank's own steady marks (ranks enter the window at their own times; the record's edges are
        # rank 0's, which another rank may precede by a little under load)
        edges = {m.edge: m.t_ns for m in trace.marks if m.name == "steady" and m.local_rank == batch.local_rank}
        assert edges["begin"] <= intervals[0][1] and intervals[-1][2] <= edges["end"]

    attributed = run_cmd([sys.executable, "-m", "joulebench", "attribute", str(run), "--bootstrap", "20"], env,
                         tmp_path)
    assert attributed.returncode == 0, attributed.stderr[-3000:]
    block = read_record(run)["attribution"]
    replay = {r["phase"]: r for r in block["estimators"]["replay"]["rows"]}
    assert set(replay) == {FORWARD, BACKWARD, OPTIMIZER} | ({GRAD_REDUCE} if processes == 2 else set())
    fit = block["estimators"]["fit"]
    assert "rows" in fit or "counter segments inside the window" in fit["unavailable_reason"]


def test_replay_without_a_sampler_is_refused_before_training(fake_env, tmp_path: Path) -> None:
    result = run_cmd([*LLM, "train", *TINY, "--out-dir", str(tmp_path / "run"), "--replay-phases", "2"],
                     fake_env(), tmp_path)
    assert result.returncode == 64
    assert "--replay-phases 2 without a jpwr sampler" in result.stderr and "Fix:" in result.stderr
    assert not (tmp_path / "run" / "run_record.json").exists()


def test_a_replay_window_lasts_as_long_as_asked_when_its_phase_speeds_up() -> None:
    """The count comes from invocations timed before the window; a phase that then runs faster (a CPU's first
    invocations after another phase ran up to 2x slower) is topped up until the window has lasted its seconds."""
    calls: list[float] = []

    def phase() -> None:
        calls.append(time.monotonic())
        time.sleep(0.02 if len(calls) <= 4 else 0.001)  # the four before the window slow, the rest fast

    for _ in range(4):  # replay_phases' warm-up and timed invocations
        phase()
    # sized by the slow ones: 11 calls, 11 ms at the fast pace (a loaded machine's 1 ms sleeps took 4 ms: still 44)
    count = max(3, int(0.2 / 0.02) + 1)
    started = time.monotonic()
    done, stopped = run_at_least(phase, count, 0.2, lambda: None)
    assert time.monotonic() - started >= 0.2 and done == len(calls) - 4 > count and not stopped
