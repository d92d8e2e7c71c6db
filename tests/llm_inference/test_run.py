"""The driver end to end: windows, record schema, energy from the fake H100 NVML trace, report charts.

Energy comes from jpwr metering the fake pynvml (a recorded H100 trace replayed on real time): the
only fake is the GPU; the model, generation and windows are real.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from joulebench.analysis.report import write_report
from joulebench.record import RunRecord, read_run_record
from llm_inference.cli import main
from tests.driver_helpers import with_options
from tests.llm_inference.conftest import INFER, TINY, read_record, run_cmd, summaries


def test_one_point_under_jpwr_has_ordered_windows_exact_lengths_and_energy(fake_env, h100_trace_dir, tmp_path):
    out = tmp_path / "run"
    env = fake_env(JPWR_FAKE_NVML_TRACE=str(h100_trace_dir))
    jpwr = [sys.executable, "-m", "jpwr", "--methods", "nvml", "--out", str(out / "energy"), "--"]
    result = run_cmd([*jpwr, *INFER, "run", *TINY, "--batch-size", "3", "--output-length", "5",
                      "--out-dir", str(out), "--run-id", "inf-1"], env, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    data = read_record(out)
    record = RunRecord.from_dict(data)  # the shared schema reads it back
    assert record.benchmark == "llm_inference" and record.status == "OK" and record.run_id == "inf-1"
    assert record.config["task"] == "tiny" and record.config["batch_size"] == 3 and record.config["model"] == "tiny"
    # The default engine is named in the record, with its shapes and its set-up time (outside every window).
    detail = record.config["engine_detail"]
    assert record.config["engine"] == "static" and detail["engine"] == "static" and detail["cuda_graphs"] is False
    assert detail["cache_positions"] % detail["position_bucket"] == 0 and detail["build_s"] > 0
    assert record.metrics["engine_setup_s"] >= 0

    idle, warmup, prefill, steady = (record.window(n) for n in ("idle", "warmup", "prefill", "steady"))
    assert [w.name for w in record.windows] == ["idle", "warmup", "prefill", "steady"]
    assert idle.t_end_ns <= warmup.t_start_ns
    assert warmup.t_end_ns <= prefill.t_start_ns < prefill.t_end_ns <= steady.t_start_ns < steady.t_end_ns
    assert prefill.duration_s >= 0.3 and steady.duration_s >= 0.3  # --min-window-s

    # Exactly the asked output length: 2 batches × 3 requests × 5 tokens per pass (the driver also checks shapes).
    batches = record.config["batches"]
    assert [b["output_length"] for b in batches] == [5, 5] and all(len(b["input_lengths"]) == 3 for b in batches)
    passes = steady.work["passes"]
    assert steady.work["output_tokens"] == passes * 2 * 3 * 5
    assert steady.work["decode_tokens"] == passes * 2 * 3 * 4
    assert steady.work["input_tokens"] == passes * sum(sum(b["input_lengths"]) for b in batches)
    assert prefill.work["calls"] == prefill.work["passes"] * 2

    m = record.metrics
    assert m["work_unit"] == "output_tokens" and m["window"] == "steady"
    assert m["output_tokens_per_s"] == pytest.approx(steady.work["output_tokens"] / steady.duration_s)
    assert m["requests_per_s"] == pytest.approx(steady.work["requests"] / steady.duration_s)
    assert 0 < m["ttft_median_s"] <= m["ttft_p90_s"]
    assert 0 < m["per_token_latency_median_s"] <= m["per_token_latency_p90_s"]

    # Energy from jpwr on every window; per-token figures divide the steady window's energy and bound.
    for window in (warmup, prefill, steady):
        assert window.energy is not None and window.energy.energy_j > 0 and window.energy.method
    e_steady, e_prefill = steady.energy, prefill.energy
    assert m["energy_per_output_token_j"] == pytest.approx(e_steady.energy_j / steady.work["output_tokens"])
    assert m["energy_per_request_j"] == pytest.approx(e_steady.energy_j / steady.work["requests"])
    assert m["energy_per_output_token_error_bound_j"] == pytest.approx(
        e_steady.error_bound_j / steady.work["output_tokens"])
    ratio = m["steady_passes"] / m["prefill_passes"]
    assert m["decode_energy_per_token_j"] == pytest.approx(
        (e_steady.energy_j - e_prefill.energy_j * ratio) / steady.work["decode_tokens"])
    assert m["decode_energy_per_token_error_bound_j"] == pytest.approx(
        (e_steady.error_bound_j + e_prefill.error_bound_j * ratio) / steady.work["decode_tokens"])
    assert m["output_tokens_per_wh"] == pytest.approx(steady.work["output_tokens"] / (e_steady.energy_j / 3600))

    # The idle baseline (issue 16 item 4) splits each window: idle power × time, and the rest above it.
    baseline = record.meter["idle_baseline"]
    assert baseline["power_w"] == pytest.approx(idle.energy.energy_j / idle.duration_s)
    assert baseline["measured"] == "before this run's first window"
    split_s, split_p = steady.split, prefill.split
    assert split_s.idle_j == pytest.approx(baseline["power_w"] * steady.duration_s)
    assert split_s.idle_j + split_s.dynamic_j == pytest.approx(e_steady.energy_j)
    assert m["steady_idle_share"] == pytest.approx(split_s.idle_j / e_steady.energy_j)
    assert m["decode_dynamic_energy_per_token_j"] == pytest.approx(
        (split_s.dynamic_j - split_p.dynamic_j * ratio) / steady.work["decode_tokens"])
    assert m["decode_dynamic_energy_per_token_error_bound_j"] > m["decode_energy_per_token_error_bound_j"]

    (line,) = summaries(result.stdout)
    assert line["benchmark"] == "llm_inference" and line["status"] == "OK" and line["batch_size"] == "3"
    assert float(line["energy_per_output_token_j"]) == pytest.approx(m["energy_per_output_token_j"], rel=1e-5)


def test_sweep_with_in_process_metering_writes_a_record_per_point_and_charts(fake_env, h100_trace_dir, tmp_path):
    out = tmp_path / "sweep"
    env = fake_env(JPWR_FAKE_NVML_TRACE=str(h100_trace_dir))
    result = run_cmd([*INFER, "run", *TINY, "--batch-sizes", "1,2", "--output-length", "3", "--energy-methods",
                      "nvml", "--out-dir", str(out), "--run-id", "sw"], env, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = summaries(result.stdout)
    assert [(s["run_id"], s["batch_size"]) for s in lines] == [("sw-tiny-bs1", "1"), ("sw-tiny-bs2", "2")]
    first = None
    for size in (1, 2):
        record = read_run_record(out / f"tiny_bs{size}" / "run_record.json")
        assert record.metrics["batch_size"] == size and record.metrics["global_batch_size"] == size
        # one idle baseline per invocation, measured before the first point and reused by the next
        baseline = record.meter["idle_baseline"]
        first = first or baseline
        assert baseline["power_w"] == first["power_w"] and (record.window("idle") is not None) == (size == 1)
        assert record.window("steady").split.idle_power_w == first["power_w"]
        assert record.window("steady").energy.energy_j > 0
        # Latent metrics of the windows from this point's own in-process trace (fake H100 clocks).
        latents = record.metrics["latents"]
        assert latents["steady"]["sm_clock_hz"] > 0 and "utilization_gpu" in latents["prefill"]
        assert record.metrics["sm_clock_mhz"] == pytest.approx(latents["steady"]["sm_clock_hz"] / 1e6)
    page = write_report([out], tmp_path / "report")
    assert (tmp_path / "report" / "token_energy_llm_inference.png").stat().st_size > 0
    assert "J per output token and per decode token vs batch size" in page.read_text()


def test_without_a_sampler_energy_is_na_with_a_reason_never_zero(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("JPWR_ADDR", raising=False)
    handler = signal.getsignal(signal.SIGTERM)
    try:  # through the transformers baseline engine
        code = main(["run", *TINY, "--engine", "hf", "--batch-size", "2", "--output-length", "4",
                     "--out-dir", str(tmp_path)])
    finally:
        signal.signal(signal.SIGTERM, handler)
    assert code == 0
    record = read_run_record(tmp_path / "run_record.json")
    assert record.config["engine"] == "hf" and record.config["engine_detail"]["engine"] == "hf"
    m = record.metrics
    assert record.window("steady").work["output_tokens"] == m["steady_passes"] * 2 * 2 * 4
    for key in ("energy_wh", "energy_per_output_token_j", "decode_energy_per_token_j", "utilization_gpu"):
        assert m[key] is None
    assert "no jpwr sampler" in m["energy_unavailable_reason"]
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("JOULEBENCH_RESULT ") and "energy_per_output_token_j=n/a" in last


def test_sigterm_ends_the_sweep_with_a_timeout_record_and_summary(fake_env, tmp_path):
    out = tmp_path / "stopped"
    proc = subprocess.Popen([*INFER, "run", *with_options(TINY, "--min-window-s", "120"), "--batch-sizes", "1,2",
                             "--out-dir", str(out)], env=fake_env(), cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    for line in proc.stdout:  # the model is built: the first point's windows are running
        if "built on cpu" in line:
            break
    time.sleep(5.0)  # past the warm-up (first calls are slow on a loaded CPU); the prefill window lasts 120 s
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 124, stderr[-3000:]  # TIMEOUT's code (joulebench.record.EXIT_CODES)
    record = read_run_record(out / "tiny_bs1" / "run_record.json")
    assert record.status == "TIMEOUT" and "SIGTERM received" in record.status_reason
    assert record.window("warmup") is not None  # windows completed before the signal are kept
    assert not (out / "tiny_bs2").exists()  # the sweep ended
    (line,) = summaries(stdout)
    assert line["status"] == "TIMEOUT"


def test_a_local_checkpoint_replaces_the_random_weights(tmp_path):
    import torch

    from llm_inference.engine import build_model
    from llm_inference.presets import PRESETS

    checkpoint = tmp_path / "my-llama"
    build_model(PRESETS["tiny"], None, "fp32", "sdpa", torch.device("cpu"), seed=3).save_pretrained(checkpoint)
    handler = signal.getsignal(signal.SIGTERM)
    try:
        code = main(["run", *TINY, "--checkpoint", str(checkpoint), "--batch-size", "2", "--output-length", "3",
                     "--out-dir", str(tmp_path / "run")])
    finally:
        signal.signal(signal.SIGTERM, handler)
    assert code == 0
    record = read_run_record(tmp_path / "run" / "run_record.json")
    assert record.config["weights"] == "checkpoint" and record.config["model"] == "my-llama"
    assert record.metrics["parameters"] == PRESETS["tiny"].parameter_count()  # shape read from its config.json
    assert record.window("steady").work["output_tokens"] == record.metrics["steady_passes"] * 2 * 2 * 3
