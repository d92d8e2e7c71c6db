"""torchvision backend on the CPU: training, JPEG input, DDP over gloo, early stops, the run record."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from joulebench.record import RunRecord
from resnet50.cli import main
from resnet50.flops import resnet50_flops
from tests.driver_helpers import with_options
from tests.resnet50.conftest import (
    LAUNCH_VARS,
    REPO,
    RESNET,
    SMALL,
    assert_loss_decreased,
    clean_env,
    free_port,
    parse_summary,
    read_record,
    run_cmd,
)

pytest.importorskip("torchvision")


def test_fixed_batch_training_writes_record_and_caraml_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    code = main(["train", "--framework", "pytorch", *SMALL, "--precision", "fp32", "--warmup-iterations", "1",
                 "--iterations", "5", "--caraml-output", "--out-dir", str(tmp_path), "--run-id", "t-torch"])
    out = capsys.readouterr().out
    assert code == 0
    record = read_record(tmp_path)
    assert_loss_decreased(record)
    assert RunRecord.from_dict(record).window("steady") is not None  # the shared schema reads it back
    assert record["benchmark"] == "resnet50" and record["status"] == "OK" and record["run_id"] == "t-torch"
    assert record["config"]["bn_kernels"] == "inductor"  # the default; --bn-kernels triton is refused on the CPU
    assert [w["name"] for w in record["windows"]] == ["warmup", "steady"]
    warmup, steady = record["windows"]
    assert (warmup["first_step"], warmup["last_step"], steady["first_step"], steady["last_step"]) == (0, 1, 1, 6)
    assert steady["work"] == {"images": 5 * 8}
    metrics = record["metrics"]
    assert metrics["work_unit"] == "images" and metrics["iterations"] == 5
    assert metrics["images_per_s"] == pytest.approx(40 / steady["duration_s"])
    assert metrics["warmup_excluded"]["iterations"] == 1
    assert metrics["variant"] == "v1.5" and "torchvision resnet50 v1.5" in metrics["architecture"]
    assert metrics["flops_per_image_training"] == 3 * resnet50_flops("v1.5", 64).forward
    assert metrics["model_flops_per_unit"] == metrics["flops_per_image_training"]
    # no sampler here: energy is missing with a reason, never 0
    assert metrics["energy_wh"] is None and metrics["images_per_wh"] is None
    assert "no jpwr sampler" in metrics["energy_unavailable_reason"]
    assert record["config"]["per_device_batch_size"] == 8 and record["hardware"]["device_kind"] == "cpu"
    assert record["hardware"]["inductor_coordinate_descent_tuning"] is None  # eager: no inductor kernels
    # no compile flag: the auto default resolves to eager on the CPU, and the record says so (issue 33)
    assert (record["config"]["compile"], record["config"]["compile_mode"]) == (False, None)
    assert metrics["compile_mode"] == "eager"
    assert metrics["warmup_s"] == pytest.approx(warmup["duration_s"]) == metrics["warmup_excluded"]["duration_s"]
    assert 0 < metrics["first_step_s"] <= warmup["duration_s"] + 1e-3  # the one warm-up step, synced
    assert record["software"]["torch"] and record["launch"]["launcher"] == "single"
    summary = parse_summary(out)
    assert summary["status"] == "OK" and summary["energy_wh"] == "n/a"
    assert float(summary["images_per_s"]) == pytest.approx(metrics["images_per_s"], rel=1e-5)
    caraml = [line for line in out.splitlines() if line.startswith("total images/sec: ")]
    assert len(caraml) == 1 and float(caraml[0].split(": ")[1]) == pytest.approx(metrics["images_per_s"], abs=0.01)
    progress = [line for line in out.splitlines() if line.startswith("[resnet50] step ")]
    assert len(progress) == 6 and all("ETA" in line and "images/s" in line for line in progress)


@pytest.mark.parametrize("tuning", [False, True])
def test_compiled_backend_records_inductor_kernel_tuning(tuning: bool) -> None:
    """The record says whether inductor tuned its kernels (TORCHINDUCTOR_COORDINATE_DESCENT_TUNING)."""
    from torch._inductor import config as inductor_config

    from joulebench.launch import LaunchEnv
    from resnet50.cli import build_parser
    from resnet50.config import TrainConfig
    from resnet50.torch_backend import TorchBackend

    args = build_parser().parse_args(["train", "--framework", "pytorch", *SMALL, "--compile"])
    config = TrainConfig.from_args(args)
    backend = TorchBackend(config, LaunchEnv.from_env())  # torch.compile wraps lazily
    try:
        assert (config.compile, config.compile_mode) == (True, "default")  # forced on the CPU: mode default
        with inductor_config.patch(coordinate_descent_tuning=tuning):
            assert backend.hardware()["inductor_coordinate_descent_tuning"] is tuning
    finally:
        backend.close()


@pytest.mark.parametrize("flag", ["--coordinate-descent-tuning", "--no-coordinate-descent-tuning"])
def test_backend_sets_inductor_tuning_for_its_compile_and_restores_it(flag: str) -> None:
    """--coordinate-descent-tuning is inductor's config while the backend lives (it compiles at the first calls),
    reported in the record's hardware, and put back at close (issue 33)."""
    from torch._inductor import config as inductor_config

    from joulebench.launch import LaunchEnv
    from resnet50.cli import build_parser
    from resnet50.config import TrainConfig
    from resnet50.torch_backend import TorchBackend

    wanted = flag == "--coordinate-descent-tuning"
    with inductor_config.patch(coordinate_descent_tuning=not wanted):
        args = build_parser().parse_args(["train", "--framework", "pytorch", *SMALL, "--compile", flag])
        backend = TorchBackend(TrainConfig.from_args(args), LaunchEnv.from_env())
        try:
            assert inductor_config.coordinate_descent_tuning is wanted
            assert backend.hardware()["inductor_coordinate_descent_tuning"] is wanted
        finally:
            backend.close()
        assert inductor_config.coordinate_descent_tuning is (not wanted)


def test_bf16_channels_first_trains(tmp_path: Path) -> None:
    code = main(["train", "--framework", "pytorch", *with_options(SMALL, "--image-size", "32"), "--precision", "bf16",
                 "--no-channels-last", "--no-compile", "--warmup-iterations", "0", "--iterations", "2",
                 "--out-dir", str(tmp_path)])
    record = read_record(tmp_path)
    assert code == 0 and record["config"]["channels_last"] is False and record["config"]["precision"] == "bf16"
    assert record["config"]["compile"] is False and record["metrics"]["compile_mode"] == "eager"
    assert record["metrics"]["warmup_s"] is None and record["metrics"]["first_step_s"] is None  # no warm-up
    assert [w["name"] for w in record["windows"]] == ["steady"]  # no warm-up window when it is 0
    assert all(abs(loss) < 1e6 for _step, loss in record["metrics"]["losses"])


def test_jpeg_tree_input(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    data = tmp_path / "jpeg"
    assert main(["make-data", str(data), "--format", "jpeg", "--images", "16", "--classes", "4",
                 "--image-size", "48"]) == 0
    # a line before the import that can take 20 s (TensorFlow's, for tfrecords), heartbeats meanwhile, then the result
    said = [line for line in capsys.readouterr().out.splitlines() if not line.startswith("make-data: 16 jpeg images: ")]
    assert said == [f"make-data: loading torchvision, then writing 16 jpeg images under {data}",
                    f"wrote 16 jpeg images under {data}"]
    assert sorted(p.suffix for p in (data / "train").rglob("*") if p.is_file()) == [".jpg"] * 16  # no temporaries
    code = main(["train", "--framework", "pytorch", *SMALL, "--data", str(data), "--data-workers", "0",
                 "--precision", "fp32", "--warmup-iterations", "1", "--iterations", "2", "--out-dir", str(tmp_path)])
    record = read_record(tmp_path)
    assert code == 0 and record["config"]["data"] == str(data) and record["config"]["data_format"] == "jpeg"
    assert record["metrics"]["iterations"] == 2


def test_exit_duration_stops_cleanly_with_timeout_status(tmp_path: Path) -> None:
    # the budget is spent before the first step ends, so the loop stops at the first log point (step 1)
    code = main(["train", "--framework", "pytorch", *SMALL, "--precision", "fp32", "--warmup-iterations", "0",
                 "--iterations", "50", "--exit-duration-mins", "0.0001", "--out-dir", str(tmp_path)])
    record = read_record(tmp_path)
    assert code == 124  # TIMEOUT's code; a clean stop: the steady window is a valid measurement of the steps done
    assert record["status"] == "TIMEOUT" and "--exit-duration-mins reached" in record["status_reason"]
    assert "after 1 of 50 measured iterations" in record["status_reason"]
    (steady,) = record["windows"]
    assert steady["name"] == "steady" and steady["steps"] == 1 and steady["work"] == {"images": 8}
    assert record["metrics"]["iterations"] == 1 and record["metrics"]["images_per_s"] > 0


def test_sigterm_writes_timeout_record(tmp_path: Path) -> None:
    cmd = [*RESNET, "train", "--framework", "pytorch", *SMALL, "--precision", "fp32", "--warmup-iterations", "1",
           "--iterations", "1000", "--out-dir", str(tmp_path)]
    proc = subprocess.Popen(cmd, env=clean_env(), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:  # wait until the loop runs, then stop it like Slurm does at the time limit
        if line.startswith("[resnet50] step 3/"):
            break
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    record = read_record(tmp_path)
    assert proc.returncode == 124, err
    assert record["status"] == "TIMEOUT" and "SIGTERM" in record["status_reason"]
    assert 3 <= record["metrics"]["iterations_completed"] < 1001
    assert parse_summary(out)["status"] == "TIMEOUT"


def test_ddp_two_processes_gloo_under_jpwr(tmp_path: Path, fake_env, h100_trace_dir: Path) -> None:
    """torchrun with 2 ranks under one `jpwr` node sampler (fake NVML replaying the H100 trace, 2 devices)."""
    port = free_port()
    cmd = [sys.executable, "-m", "jpwr", "--methods", "nvml", "--out", str(tmp_path / "jpwr"), "--",
           sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
           "--master-port", str(port), "-m", "resnet50", "train", "--framework", "pytorch", *SMALL,
           "--precision", "fp32", "--warmup-iterations", "1", "--iterations", "4", "--out-dir", str(tmp_path)]
    env = fake_env(JPWR_FAKE_NVML_TRACE=str(h100_trace_dir), JPWR_FAKE_NVML_DEVICES="2", OMP_NUM_THREADS="1")
    result = run_cmd(cmd, {k: v for k, v in env.items() if k not in LAUNCH_VARS}, REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    record = read_record(tmp_path)
    assert record["launch"]["launcher"] == "torchrun" and record["launch"]["world_size"] == 2
    assert record["config"]["devices"] == 2 and record["config"]["per_device_batch_size"] == 4
    assert record["metrics"]["images_per_s_per_device"] == pytest.approx(record["metrics"]["images_per_s"] / 2)
    assert_loss_decreased(record)
    assert parse_summary(result.stdout)["status"] == "OK"
    assert result.stdout.count("JOULEBENCH_RESULT") == 1  # rank 0 only
    # energy: the node leader asked the sampler, rank 0 put it on the windows; images/Wh from the same window
    steady = record["windows"][-1]
    assert steady["energy"]["devices"] == 2 and steady["energy"]["energy_j"] > 0 and steady["energy"]["method"]
    metrics = record["metrics"]
    assert metrics["energy_wh"] == pytest.approx(steady["energy"]["energy_j"] / 3600)
    assert metrics["images_per_wh"] == pytest.approx(steady["work"]["images"] / metrics["energy_wh"])
    assert metrics["mean_power_w_per_device"] > 0 and record["meter"]["sampler"] is True
    # idle baseline first (both ranks idle, one collective), then every window split by it
    assert [w["name"] for w in record["windows"]] == ["idle", "warmup", "steady"]
    idle = record["meter"]["idle_baseline"]
    assert idle["devices"] == 2 and idle["power_w"] > 0 and idle["settle_note"]
    split = steady["energy_split"]
    assert split["idle_j"] == pytest.approx(idle["power_w"] * steady["duration_s"])
    assert split["dynamic_j"] == pytest.approx(steady["energy"]["energy_j"] - split["idle_j"])
    assert metrics["idle_power_w"] == idle["power_w"]
    assert record["meter"]["steady_plan"]["rule"] == "iterations" and steady["end_reason"].startswith("planned")


def test_steady_window_sized_by_time_from_the_samplers_update_period(tmp_path: Path, fake_pynvml,
                                                                      h100_trace_dir: Path) -> None:
    fake_pynvml.configure(h100_trace_dir)
    code = main(["train", "--framework", "pytorch", *SMALL, "--precision", "fp32", "--warmup-iterations", "3",
                 "--steady-seconds", "1.5", "--energy-methods", "nvml", "--no-idle-baseline",
                 "--out-dir", str(tmp_path)])
    assert code == 0
    record = read_record(tmp_path)
    plan = record["meter"]["steady_plan"]
    steady = record["windows"][-1]
    assert plan["rule"] == "steady-seconds" and plan["update_period_source"] == "sampler"
    assert plan["update_period_s"] == pytest.approx(0.1)  # the fake NVML counter's declared period
    assert steady["steps"] == plan["iterations"] == record["metrics"]["iterations"]
    assert plan["iterations"] * plan["step_s"] >= 1.5  # whole iterations, no more: an asked length is never lengthened
    assert (plan["iterations"] - 1) * plan["step_s"] < 1.5 and "lengthened to" not in plan["reason"]
    assert steady["end_reason"] == f"planned length reached: {plan['iterations']} iterations ({plan['reason']})"
    assert [w["name"] for w in record["windows"]] == ["warmup", "steady"]
    assert record["meter"]["idle_baseline"]["unavailable_reason"] == "skipped (--no-idle-baseline)"
    assert "skipped" in steady["energy_split"]["unavailable_reason"] and record["metrics"]["idle_power_w"] is None


def test_cpu_runs_keep_a_small_fixed_count_unless_told_otherwise() -> None:
    from joulebench.loop import steady_plan
    from resnet50.config import CPU_ITERATIONS, TrainConfig

    default = steady_plan(TrainConfig("pytorch", device="cpu").loop_spec(), "cpu")
    assert default.rule == "cpu default" and default.iterations == CPU_ITERATIONS
    assert steady_plan(TrainConfig("pytorch", iterations=7).loop_spec(), "cuda").iterations == 7  # a count wins
    assert steady_plan(TrainConfig("pytorch").loop_spec(), "cuda") is None  # on a GPU: timed after the warm-up
    assert steady_plan(TrainConfig("pytorch", steady_seconds=2.0).loop_spec(), "cpu") is None
