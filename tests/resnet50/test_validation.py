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
