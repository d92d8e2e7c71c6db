"""Phase marks and the replay mode of the torch backend on CPU: DDP over gloo under one jpwr sampler."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from joulebench.analysis.plot import find_trace_sources
from joulebench.phases import BACKWARD, FORWARD, GRAD_REDUCE, OPTIMIZER
from jpwr.trace import load_trace
from resnet50.cli import main
from tests.resnet50.conftest import LAUNCH_VARS, REPO, SMALL, free_port, read_record, run_cmd

pytest.importorskip("torchvision")


def test_ddp_ranks_mark_gradient_reduction_inside_each_step_and_replay_phases(tmp_path: Path, fake_env,
                                                                              h100_trace_dir: Path) -> None:
    cmd = [sys.executable, "-m", "jpwr", "--methods", "nvml", "--out", str(tmp_path / "jpwr"), "--",
           sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
           "--master-port", str(free_port()), "-m", "resnet50", "train", "--framework", "pytorch", *SMALL,
           "--precision", "fp32", "--warmup-iterations", "1", "--iterations", "4", "--out-dir", str(tmp_path),
           "--replay-phases", "0.2"]
    env = fake_env(JPWR_FAKE_NVML_TRACE=str(h100_trace_dir), JPWR_FAKE_NVML_DEVICES="2", OMP_NUM_THREADS="1")
    result = run_cmd(cmd, {k: v for k, v in env.items() if k not in LAUNCH_VARS}, REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    record = read_record(tmp_path)
    names = [w["name"] for w in record["windows"] if w["name"] != "idle"]  # idle: the baseline, when taken
    assert names == ["warmup", "steady", "replay/forward", "replay/forward+backward", "replay/optimizer",
                     "replay/step"]
    (trace,) = [load_trace(source) for source in find_trace_sources(tmp_path / "jpwr")]
    steady = [b for b in trace.phases if b.window == "steady"]
    assert sorted(b.local_rank for b in steady) == [0, 1]
    for batch in steady:
        order = [name for name, _, _ in sorted(batch.intervals(), key=lambda i: i[1])]
        # each step: forward, backward until the input layer's gradient, then the exposed all-reduce, optimizer
        assert order == [FORWARD, BACKWARD, GRAD_REDUCE, OPTIMIZER] * 4
    replays = [b for b in trace.phases if b.window.startswith("replay/")]
    assert GRAD_REDUCE not in {name for b in replays for name, _, _ in b.intervals() if b.window != "replay/step"}


def test_one_process_marks_no_gradient_reduction(tmp_path: Path, fake_env, h100_trace_dir: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in fake_env(JPWR_FAKE_NVML_TRACE=str(h100_trace_dir)).items():
        monkeypatch.setenv(name, value)
    import pynvml

    pynvml.configure(h100_trace_dir)
    try:
        assert main(["train", "--framework", "pytorch", *SMALL, "--precision", "fp32", "--warmup-iterations", "1",
                     "--iterations", "3", "--out-dir", str(tmp_path), "--energy-methods", "nvml"]) == 0
    finally:
        pynvml.reset()
    (trace,) = [load_trace(source) for source in find_trace_sources(tmp_path / "jpwr")]
    steady = next(b for b in trace.phases if b.window == "steady")
    assert [name for name, _, _ in steady.intervals()] == [FORWARD, BACKWARD, OPTIMIZER] * 3


def test_replay_needs_the_torch_backend_and_a_sampler(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["validate", "--framework", "tensorflow", "--replay-phases", "3"]) == 64
    assert "--replay-phases with --framework tensorflow" in capsys.readouterr().err
    assert main(["train", "--framework", "pytorch", *SMALL, "--out-dir", str(tmp_path), "--replay-phases", "3"]) == 64
    assert "without a jpwr sampler" in capsys.readouterr().err
