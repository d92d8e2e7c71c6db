"""The real driver on CPU (gloo): 1 and 2 processes, run record and summary line, TIMEOUT/FAILED paths.

Energy comes from jpwr metering the fake NVML library (recorded H100 trace): the only fake is the GPU.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from joulebench.record import RunRecord, summary_line
from tests.llm_training.conftest import LLM, TINY, free_port, parse_summary, read_record, run_cmd, torchrun


def _losses(record: dict) -> list[float]:
    return [point["loss"] for point in record["metrics"]["loss_curve"]]


def test_single_process_learns_and_writes_a_consistent_record(fake_env, h100_trace_dir, tmp_path):
    out = tmp_path / "run"
    env = fake_env(JPWR_FAKE_NVML_TRACE=str(h100_trace_dir))
    result = run_cmd([*LLM, "train", *TINY, "--overfit-batch", "--iterations", "27", "--warmup-iterations", "3",
                      "--log-interval", "5", "--out-dir", str(out), "--run-id", "tiny-1", "--energy-methods", "nvml"],
                     env, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    data = read_record(out)
    record = RunRecord.from_dict(data)  # the shared schema reads it back
    assert record.benchmark == "llm_training" and record.status == "OK" and record.run_id == "tiny-1"

    # Loss falls on a fixed batch (log-uniform start ~ ln 1024 = 6.93); logged at the warm-up's end and every 5 steps.
    losses = _losses(data)
    assert len(losses) == 7
    assert losses[0] > 6.0 and losses[-1] < losses[0] - 1.0

    # The record says where the MBS came from (the preset's on the CPU: no device memory to choose by).
    assert (data["config"]["micro_batch_size"], data["config"]["micro_batch_size_from"]) == (2, "preset")

    # Windows: idle baseline, 3 warm-up + 27 steady iterations, tokens = iterations × GBS 4 × seq 64.
    assert [w.name for w in record.windows] == ["idle", "warmup", "steady"]
    warmup, steady = record.window("warmup"), record.window("steady")
    assert (warmup.first_step, warmup.last_step, steady.first_step, steady.last_step) == (0, 3, 3, 30)
    assert steady.work["tokens"] == 27 * 4 * 64
    m = record.metrics
    assert m["iterations"] == 27 and m["work_unit"] == "tokens"
    assert m["tokens_per_s"] == pytest.approx(steady.work["tokens"] / steady.duration_s)
    assert m["model_tflops_per_device"] == pytest.approx(m["tokens_per_s"] * m["model_flops_per_unit"] / 1e12)
    assert m["model_flops_per_unit"] == 6 * m["parameters"] + 12 * 2 * 64 * 64
    assert m["mfu"] is None  # no peak for a CPU
    assert m["caraml_x4_tflops_per_device"] > m["model_tflops_per_device"]

    # Energy of the steady window from jpwr (fake H100 trace): tokens/Wh divides that window's work and energy.
    assert steady.energy is not None and steady.energy.energy_j > 0 and steady.energy.method
    assert m["energy_wh"] == pytest.approx(steady.energy.energy_j / 3600)
    assert m["tokens_per_wh"] == pytest.approx(steady.work["tokens"] / m["energy_wh"])
    assert (out / "jpwr").is_dir()

    # The count decided the steady window; the idle baseline splits every window's energy.
    assert data["meter"]["steady_plan"]["rule"] == "iterations" and steady.end_reason.startswith("planned length")
    idle = data["meter"]["idle_baseline"]
    assert idle["devices"] == 1 and idle["power_w"] > 0 and idle["method"] == "counter+power"
    assert record.window("idle").energy.energy_j == pytest.approx(idle["power_w"] * idle["duration_s"])
    assert steady.split.idle_j == pytest.approx(idle["power_w"] * steady.duration_s)
    assert steady.split.dynamic_j == pytest.approx(steady.energy.energy_j - steady.split.idle_j)
    assert m["idle_power_w"] == idle["power_w"]
    assert m["dynamic_energy_wh"] == pytest.approx(steady.split.dynamic_j / 3600)

    # Progress lines, then the summary line last, matching the record.
    lines = result.stdout.strip().splitlines()
    progress = [line for line in lines if " | loss " in line]
    assert len(progress) == 7 and "s/iter" in progress[0] and "tokens/s" in progress[0] and "ETA" in progress[0]
    summary = parse_summary(result.stdout)
    assert lines[-1] == summary_line(record)
    assert summary["status"] == "OK" and summary["iterations"] == "27"
    assert float(summary["tokens_per_s"]) == pytest.approx(m["tokens_per_s"], rel=1e-5)
    assert float(summary["tokens_per_wh"]) == pytest.approx(m["tokens_per_wh"], rel=1e-5)


def test_steady_window_sized_by_time_is_planned_after_the_warmup(fake_env, h100_trace_dir, tmp_path):
    out = tmp_path / "run"
    env = fake_env(JPWR_FAKE_NVML_TRACE=str(h100_trace_dir))
    result = run_cmd([*LLM, "train", *TINY, "--overfit-batch", "--warmup-iterations", "3", "--steady-seconds", "1.5",
                      "--log-interval", "5", "--out-dir", str(out), "--energy-methods", "nvml", "--no-idle-baseline"],
                     env, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    data = read_record(out)
    plan = data["meter"]["steady_plan"]
    steady = next(w for w in data["windows"] if w["name"] == "steady")
    assert plan["rule"] == "steady-seconds" and plan["update_period_source"] == "sampler"
    assert steady["steps"] == plan["iterations"] == data["metrics"]["iterations"]
    assert plan["iterations"] * plan["step_s"] >= 1.5  # whole iterations, no more: an asked length is never lengthened
    assert (plan["iterations"] - 1) * plan["step_s"] < 1.5 and "lengthened to" not in plan["reason"]
    assert f"steady window: {plan['reason']}" in result.stdout
    assert data["status"] == "OK" and steady["end_reason"].startswith("planned length reached")
    assert data["meter"]["idle_baseline"]["unavailable_reason"] == "skipped (--no-idle-baseline)"
    assert [w["name"] for w in data["windows"]] == ["warmup", "steady"]


def test_cpu_runs_keep_a_small_fixed_count_unless_told_otherwise():
    import torch

    from joulebench.loop import steady_plan
    from llm_training.cli import build_parser, resolve_checked
    from llm_training.config import CPU_ITERATIONS

    def plan(*args: str, device: str = "cpu"):
        cfg = resolve_checked(build_parser().parse_args(["train", *TINY, *args]), 1)
        return steady_plan(cfg.loop_spec(), torch.device(device).type)

    default = plan()
    assert default.rule == "cpu default" and default.iterations == CPU_ITERATIONS  # measured, warm-up on top
    assert plan("--iterations", "12").iterations == 12  # a count wins, and means measured iterations
    assert plan("--steady-seconds", "2") is None and plan(device="cuda") is None  # timed after the warm-up


# Dropout off and one fixed batch, so every layout computes the same training problem.
SAME_PROBLEM = ["--overfit-batch", "--iterations", "12", "--warmup-iterations", "2", "--log-interval", "4",
                "--attention-dropout", "0", "--hidden-dropout", "0", "--global-batch-size", "4"]


def srun_like(train: list[str], env: dict[str, str], cwd) -> subprocess.CompletedProcess:
    """Two tasks with the variables `srun -n 2` sets on one node; returns rank 0's result (rank 1 must succeed)."""
    slurm = {"SLURM_NTASKS": "2", "SLURM_JOB_NUM_NODES": "1", "SLURM_NODEID": "0", "SLURM_TASKS_PER_NODE": "2",
             "SLURM_JOB_NODELIST": "127.0.0.1", "SLURM_JOB_ID": "4242", "MASTER_PORT": str(free_port())}
    procs = [
        subprocess.Popen([sys.executable, *train], cwd=cwd, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         env={**env, **slurm, "SLURM_PROCID": str(rank), "SLURM_LOCALID": str(rank)})
        for rank in (0, 1)
    ]
    outputs = [proc.communicate(timeout=240) for proc in procs]
    assert procs[1].returncode == 0, outputs[1][1][-3000:]
    return subprocess.CompletedProcess(procs[0].args, procs[0].returncode, *outputs[0])


@pytest.fixture(scope="module")
def single_process_losses(tmp_path_factory) -> list[float]:
    from tests.conftest import FAKES_DIR, TESTS_DIR

    tmp = tmp_path_factory.mktemp("reference")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(FAKES_DIR), str(TESTS_DIR.parent)])}
    result = run_cmd([*LLM, "train", *TINY, *SAME_PROBLEM, "--out-dir", str(tmp / "run")], env, tmp)
    assert result.returncode == 0, result.stderr[-3000:]
    return _losses(read_record(tmp / "run"))


@pytest.mark.parametrize(
    ("layout", "tolerance"),
    [
        # CPU initialisation builds full weights then splits them, so DP and TP runs match one process.
        (["--tensor-parallel", "1"], 1e-3),  # DP = 2: distributed optimizer, overlapped grad reduce
        # with the compiled cross-entropy: its vocab-parallel statistics are combined over the 2 TP ranks
        (["--tensor-parallel", "2", "--sequence-parallel", "--precision", "bf16", "--cross-entropy-fusion"], 0.02),
        # Pipeline stages draw their initial weights from different RNG positions: close, not equal.
        (["--pipeline-parallel", "2", "--precision", "fp16", "--recompute", "selective"], 0.02),
    ],
    ids=["dp2", "tp2-sp-bf16", "pp2-fp16-srun"],
)
def test_two_processes_reproduce_the_single_process_losses(fake_env, h100_trace_dir, tmp_path, layout, tolerance,
                                                          single_process_losses):
    out = tmp_path / "run"
    # The DP case runs under `jpwr --`: one sampler for the node, both ranks mark windows, the node
    # leader reports energy (only once: the wrapper costs CI seconds).
    metered = layout == ["--tensor-parallel", "1"]
    env = fake_env(JPWR_FAKE_NVML_TRACE=str(h100_trace_dir), JPWR_FAKE_NVML_DEVICES="2")
    jpwr = [sys.executable, "-m", "jpwr", "--methods", "nvml", "--out", str(tmp_path / "jpwr"), "--"]
    train = ["-m", "llm_training", "train", *TINY, *layout, *SAME_PROBLEM, "--out-dir", str(out)]
    if "--pipeline-parallel" in layout:
        result = srun_like(train, env, tmp_path)  # the launch path of `srun` (no torchrun)
    else:
        command = [*torchrun(2), *train]
        result = run_cmd([*jpwr, *command] if metered else command, env, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    data = read_record(out)
    cfg = data["config"]
    assert data["status"] == "OK"
    assert cfg["tensor_parallel"] * cfg["pipeline_parallel"] * cfg["data_parallel"] == 2
    assert data["launch"]["launcher"] == ("slurm" if "--pipeline-parallel" in layout else "torchrun")
    losses = _losses(data)
    assert losses == pytest.approx(single_process_losses, abs=tolerance)
    assert losses[-1] < losses[0] - 0.3
    steady = next(w for w in data["windows"] if w["name"] == "steady")
    if metered:
        assert steady["energy"]["devices"] == 2 and steady["energy"]["energy_j"] > 0
        tokens_per_wh = steady["work"]["tokens"] / steady["energy"]["energy_wh"]
        assert data["metrics"]["tokens_per_wh"] == pytest.approx(tokens_per_wh)
    else:
        assert steady["energy"]["energy_j"] is None and "no jpwr sampler" in steady["energy"]["unavailable_reason"]
    assert data["metrics"]["tokens_per_s_per_device"] == pytest.approx(data["metrics"]["tokens_per_s"] / 2)
    assert parse_summary(result.stdout)["status"] == "OK"


def test_fused_cross_entropy_and_fused_adam_reproduce_the_unfused_bf16_losses(fake_env, tmp_path):
    """The CUDA defaults (megatron's native fused cross-entropy, torch's fused AdamW) are the same math."""
    runs = {}
    for name, flags in {"fused": ["--cross-entropy-fusion", "--fused-optimizer", "--compile-cache",
                                  str(tmp_path / "cache")],
                        "unfused": ["--no-cross-entropy-fusion", "--no-fused-optimizer"]}.items():
        out = tmp_path / name
        result = run_cmd([*LLM, "train", *TINY, *SAME_PROBLEM, "--precision", "bf16", *flags, "--out-dir", str(out)],
                         fake_env(), tmp_path)
        assert result.returncode == 0, result.stderr[-3000:]
        runs[name] = read_record(out)
    fused, unfused = (runs[name]["config"]["active_fusions"] for name in ("fused", "unfused"))
    assert fused["cross_entropy"] and fused["fused_adam"]
    assert not unfused["cross_entropy"] and not unfused["fused_adam"]
    assert _losses(runs["fused"]) == pytest.approx(_losses(runs["unfused"]), abs=2e-3)
    # the compiled cross-entropy's compile: the warm-up window, and the caches it filled (joulebench.compile_cache)
    fused_metrics, unfused_metrics = runs["fused"]["metrics"], runs["unfused"]["metrics"]
    assert fused_metrics["compile_s"] == fused_metrics["warmup_duration_s"] > 0
    assert fused_metrics["compile_cache"]["dir"] == str(tmp_path / "cache")
    assert fused_metrics["compile_cache"]["fx_graph_misses"] >= 1
    assert unfused_metrics["compile_s"] is None and unfused_metrics["compile_cache"] is None  # nothing compiled


def test_sigterm_stops_cleanly_with_status_timeout_and_a_steady_window(fake_env, tmp_path):
    out = tmp_path / "run"
    proc = subprocess.Popen([*LLM, "train", *TINY, "--iterations", "100000", "--warmup-iterations", "2",
                             "--log-interval", "1", "--out-dir", str(out)],
                            env=fake_env(), cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if "step 8/" in line:
            os.kill(proc.pid, signal.SIGTERM)
            break
    rest, _ = proc.communicate(timeout=120)
    assert proc.returncode == 124  # TIMEOUT's code (joulebench.record.EXIT_CODES)
    data = read_record(out)
    assert data["status"] == "TIMEOUT"
    assert "SIGTERM" in data["status_reason"] and "of 100000 measured iterations" in data["status_reason"]
    steady = next(w for w in data["windows"] if w["name"] == "steady")
    assert steady["name"] == "steady" and steady["first_step"] == 2 and steady["last_step"] >= 8
    assert data["metrics"]["tokens_per_s"] > 0
    assert parse_summary(rest)["status"] == "TIMEOUT"


def test_exit_duration_ends_run_early_on_a_preprocessed_dataset(fake_env, tmp_path):
    from tests.llm_training.test_preprocess import preprocessed_dataset

    prefix = preprocessed_dataset(tmp_path)
    env = fake_env()
    out = tmp_path / "run"
    # The deadline counts from the driver's start; 0.01 min passes during initialisation.
    result = run_cmd([*LLM, "train", *TINY, "--vocab-size", "400", "--data-path", str(prefix),
                      "--iterations", "200", "--warmup-iterations", "1", "--exit-duration-mins", "0.01",
                      "--out-dir", str(out)], env, tmp_path)
    assert result.returncode == 124, result.stderr[-3000:]
    data = read_record(out)
    assert data["status"] == "TIMEOUT" and "--exit-duration-mins reached" in data["status_reason"]
    assert data["config"]["data_path"] == str(prefix)
    assert sum(w["steps"] for w in data["windows"]) < 200


def test_failure_still_writes_a_failed_record(fake_env, tmp_path):
    prefix = tmp_path / "broken"
    for suffix in (".bin", ".idx"):
        (tmp_path / f"broken{suffix}").write_bytes(b"not a megatron index")
    out = tmp_path / "run"
    result = run_cmd([*LLM, "train", *TINY, "--data-path", str(prefix), "--iterations", "10",
                      "--out-dir", str(out)], fake_env(), tmp_path)
    assert result.returncode != 0
    data = read_record(out)
    assert data["status"] == "FAILED" and data["status_reason"]
    assert parse_summary(result.stdout)["status"] == "FAILED"
