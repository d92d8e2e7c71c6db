"""Bad configurations are refused before any device work, with the bad value and the fix in the message."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from jpwr.errors import ExitCode
from resnet50.cli import main


def refused(capsys: pytest.CaptureFixture, argv: list[str], *fragments: str) -> None:
    assert main(argv) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert "Fix:" in err, err
    for fragment in fragments:
        assert fragment in err, err


def test_global_batch_must_divide_over_devices(capsys: pytest.CaptureFixture) -> None:
    refused(capsys, ["validate", "--framework", "pytorch", "--global-batch-size", "16", "--world-size", "3"],
            "--global-batch-size 16", "3 devices", "15 or 18")
    refused(capsys, ["validate", "--framework", "tensorflow", "--global-batch-size", "100", "--nodes", "2",
                     "--devices-per-node", "4"], "8 devices", "96 or 104")


def test_validate_accepts_and_prints_plan(capsys: pytest.CaptureFixture) -> None:
    assert main(["validate", "--framework", "pytorch", "--global-batch-size", "512", "--nodes", "2",
                 "--devices-per-node", "4"]) == 0
    out = capsys.readouterr().out
    assert "8 devices x 64" in out and "torchvision resnet50 v1.5" in out and "24.54 GFLOP" in out


@pytest.mark.parametrize(("argv", "fragment"), [
    (["--framework", "pytorch", "--xla"], "--xla with --framework pytorch"),
    (["--framework", "tensorflow", "--compile"], "--compile with --framework tensorflow"),
    (["--framework", "pytorch", "--data-format", "tfrecord"], "--data-format tfrecord with --framework pytorch"),
    (["--framework", "tensorflow", "--data-format", "jpeg"], "--data-format jpeg with --framework tensorflow"),
    (["--framework", "pytorch", "--image-size", "16"], "--image-size 16"),
    (["--framework", "pytorch", "--data", "/nonexistent/imagenet"], "/nonexistent/imagenet is not a directory"),
])
def test_bad_options(capsys: pytest.CaptureFixture, argv: list[str], fragment: str) -> None:
    refused(capsys, ["validate", *argv, "--world-size", "1"], fragment)


@pytest.mark.parametrize(("option", "value"), [("--iterations", "0"), ("--warmup-iterations", "-1"), ("--lr", "0"),
                                               ("--lr", "nan"), ("--exit-duration-mins", "0")])
def test_out_of_range_values_end_at_the_parser(capsys: pytest.CaptureFixture, option: str, value: str) -> None:
    with pytest.raises(SystemExit) as ended:
        main(["validate", "--framework", "pytorch", option, value, "--world-size", "1"])
    assert ended.value.code == 2 and option in capsys.readouterr().err


def test_data_dirs_without_the_expected_layout(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    (tmp_path / "README").write_text("not a data set")
    refused(capsys, ["validate", "--framework", "tensorflow", "--data", str(tmp_path)], "train-*-of-*", "make-data")
    refused(capsys, ["validate", "--framework", "pytorch", "--data", str(tmp_path)], "class sub-directories")


def test_tensorflow_on_cpu_needs_channels_last(capsys: pytest.CaptureFixture) -> None:
    refused(capsys, ["validate", "--framework", "tensorflow", "--device", "cpu", "--no-channels-last",
                     "--world-size", "1"], "NHWC")


def test_train_refuses_uneven_batch_before_process_group(capsys: pytest.CaptureFixture,
                                                         monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Under a 2-rank launcher the batch check runs before torch.distributed or any model exists."""
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    refused(capsys, ["train", "--framework", "pytorch", "--device", "cpu", "--global-batch-size", "7",
                     "--out-dir", str(tmp_path)], "--global-batch-size 7", "2 devices")
    assert not (tmp_path / "run_record.json").exists()
    if "torch" in sys.modules:
        assert not sys.modules["torch"].distributed.is_initialized()


def test_train_refuses_cuda_on_a_cpu_only_host(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this host has a GPU")
    refused(capsys, ["train", "--framework", "pytorch", "--device", "cuda", "--out-dir", str(tmp_path)],
            "--device cuda")


def test_train_refuses_unwritable_out_dir(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    code = main(["train", "--framework", "pytorch", "--device", "cpu", "--out-dir", str(blocker / "run")])
    assert code == ExitCode.CANT_CREATE
    assert "--out-dir" in capsys.readouterr().err


# ---- issue 33: torch.compile is on by default on GPUs (reduce-overhead + coordinate-descent tuning), off on the CPU

def test_compile_defaults_follow_the_device(capsys: pytest.CaptureFixture) -> None:
    """validate plans a GPU run unless --device cpu: the README command compiles there, eager on the CPU."""
    assert main(["validate", "--framework", "pytorch", "--world-size", "1"]) == 0
    assert "torch.compile mode reduce-overhead, coordinate-descent tuning" in capsys.readouterr().out
    assert main(["validate", "--framework", "pytorch", "--device", "cpu", "--world-size", "1"]) == 0
    out = capsys.readouterr().out
    assert "eager" in out and "torch.compile" not in out
    assert main(["validate", "--framework", "pytorch", "--no-compile", "--world-size", "1"]) == 0
    out = capsys.readouterr().out
    assert "eager" in out and "torch.compile" not in out
    assert main(["validate", "--framework", "pytorch", "--compile-mode", "default", "--no-coordinate-descent-tuning",
                 "--world-size", "1"]) == 0
    assert "torch.compile mode default," in capsys.readouterr().out
    assert main(["validate", "--framework", "pytorch", "--device", "cpu", "--compile", "--world-size", "1"]) == 0
    assert "torch.compile mode default," in capsys.readouterr().out  # forced on the CPU: mode default as before
    assert main(["validate", "--framework", "tensorflow", "--world-size", "1"]) == 0  # auto is simply off for TF
    assert "tf.function" in capsys.readouterr().out


def test_resolve_compile_fills_auto_values_per_device(monkeypatch: pytest.MonkeyPatch) -> None:
    from resnet50.cli import build_parser
    from resnet50.config import CDT_ENV, TrainConfig, resolve_compile

    def resolved(device_kind: str, *argv: str) -> TrainConfig:
        config = TrainConfig.from_args(build_parser().parse_args(["train", "--framework", "pytorch", *argv]))
        resolve_compile(config, device_kind)
        resolve_compile(config, device_kind)  # idempotent (the backend resolves again)
        return config

    parsed = TrainConfig.from_args(build_parser().parse_args(["train", "--framework", "pytorch"]))
    assert (parsed.compile, parsed.compile_mode, parsed.coordinate_descent_tuning) == (None, None, None)  # auto
    flags = build_parser().parse_args(["train", "--framework", "pytorch", "--no-compile",
                                       "--no-coordinate-descent-tuning"])
    assert (flags.compile, flags.coordinate_descent_tuning) == (False, False)
    monkeypatch.delenv(CDT_ENV, raising=False)
    cuda = resolved("cuda")
    assert (cuda.compile, cuda.compile_mode, cuda.coordinate_descent_tuning, cuda.compile_label) == (
        True, "reduce-overhead", True, "reduce-overhead")
    cpu = resolved("cpu")
    assert (cpu.compile, cpu.compile_mode, cpu.coordinate_descent_tuning, cpu.compile_label) == (
        False, None, None, "eager")
    eager = resolved("cuda", "--no-compile")
    assert (eager.compile, eager.compile_label) == (False, "eager")
    forced = resolved("cpu", "--compile")
    assert (forced.compile, forced.compile_mode, forced.coordinate_descent_tuning) == (True, "default", False)
    monkeypatch.setenv(CDT_ENV, "1")  # inductor's own switch still counts where the option is left auto on the CPU
    assert resolved("cpu", "--compile").coordinate_descent_tuning is True
    assert resolved("cuda", "--no-coordinate-descent-tuning").coordinate_descent_tuning is False
    chosen = resolved("cuda", "--compile-mode", "max-autotune")
    assert (chosen.compile, chosen.compile_mode, chosen.compile_label) == (True, "max-autotune", "max-autotune")


@pytest.mark.parametrize(("argv", "fragments"), [
    # compile on by default on GPUs: a warm-up of 0 would put compilation into the measured window
    (["--framework", "pytorch", "--warmup-iterations", "0", "--iterations", "5"],
     ("--warmup-iterations 0 with torch.compile (the default on GPUs)", "--warmup-iterations 2", "--no-compile")),
    (["--framework", "pytorch", "--device", "cpu", "--compile", "--warmup-iterations", "1", "--iterations", "5"],
     ("--warmup-iterations 1 with torch.compile", "at least 2 warm-up iterations")),
    (["--framework", "tensorflow", "--compile-mode", "default"], ("--compile-mode with --framework tensorflow",)),
    (["--framework", "tensorflow", "--coordinate-descent-tuning"],
     ("--coordinate-descent-tuning with --framework tensorflow",)),
    (["--framework", "pytorch", "--no-compile", "--compile-mode", "reduce-overhead"],
     ("--compile-mode without compilation (--no-compile)", "add --compile")),
    (["--framework", "pytorch", "--device", "cpu", "--coordinate-descent-tuning"],
     ("--coordinate-descent-tuning without compilation", "on the CPU compilation is off unless --compile")),
])
def test_contradictory_compile_options_are_refused(capsys: pytest.CaptureFixture, argv: list[str],
                                                   fragments: tuple[str, ...]) -> None:
    refused(capsys, ["validate", *argv, "--world-size", "1"], *fragments)


def test_eager_runs_may_skip_the_warm_up(capsys: pytest.CaptureFixture) -> None:
    assert main(["validate", "--framework", "pytorch", "--no-compile", "--warmup-iterations", "0", "--iterations",
                 "5", "--world-size", "1"]) == 0
    assert "0 warm-up + 5 measured iterations, eager" in capsys.readouterr().out


def test_train_refuses_compile_without_warm_up_before_any_work(capsys: pytest.CaptureFixture,
                                                              tmp_path: Path) -> None:
    refused(capsys, ["train", "--framework", "pytorch", "--device", "cpu", "--compile", "--warmup-iterations", "0",
                     "--iterations", "2", "--out-dir", str(tmp_path)],
            "--warmup-iterations 0 with torch.compile", "would land in the measured window", "--no-compile")
    assert not (tmp_path / "run_record.json").exists()
