"""`python -m llm_inference load` end to end on the CPU, and every bad input refused before any device work.

Energy comes from jpwr metering the fake pynvml in-process (a recorded H100 trace replayed on real time); the
engine, the arrivals, the windows, the per-request table and the fit are real.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from benchmarks.row_waste import window_steps
from joulebench.requests_table import FILE_NAME, REQUEST_COLUMNS, STATUSES, read_requests
from llm_inference.cli import main
from tests.llm_inference.conftest import INFER, run_cmd, summaries

LOAD = ["--preset", "tiny", "--task", "tiny", "--device", "cpu", "--max-concurrency", "4"]


def test_a_two_rate_sweep_writes_a_record_and_a_request_table_per_rate(fake_env, h100_trace_dir, tmp_path):
    out = tmp_path / "load"
    result = run_cmd([*INFER, "load", *LOAD, "--rates", "40,max", "--steady-seconds", "3", "--slo-ttft-ms", "50",
                      "--slo-tpot-ms", "20", "--energy-methods", "nvml", "--out-dir", str(out), "--run-id", "ld"],
                     fake_env(JPWR_FAKE_NVML_TRACE=str(h100_trace_dir)), tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "controlled-split window" in result.stdout and "| in flight" not in result.stderr
    for label in ("40", "max"):
        record = json.loads((out / f"rate_{label}" / "run_record.json").read_text())
        metrics = record["metrics"]
        assert record["status"] == "OK" and metrics["rate"] == label and record["config"]["engine"] == "continuous"
        steady = next(w for w in record["windows"] if w["name"] == "steady")
        assert steady["work"]["output_tokens"] > 0 and steady["energy"]["energy_j"] > 0
        assert metrics["energy_per_output_token_j"] == pytest.approx(steady["energy"]["energy_j"]
                                                                     / steady["work"]["output_tokens"])
        assert metrics["requests_counted"] > 0 and metrics["ttft_p90_s"] >= metrics["ttft_p50_s"] > 0
        table = read_requests(out / f"rate_{label}" / FILE_NAME)
        # the row buckets' waste over the window, from the step log's computed rows (4 rows: buckets 1, 2, 4)
        waste = metrics["computed_rows_per_occupied_row"]
        assert 1 <= waste <= 4 / 3
        assert waste == pytest.approx(metrics["mean_computed_rows"] / metrics["mean_decode_rows"])
        assert record["config"]["admit_divisor"] == 16 and record["config"]["engine_detail"]["row_buckets"] == [1, 2, 4]
        decode = table.steps["kind"] == 1
        assert np.all(table.steps["computed_rows"][decode] >= np.diff(table.steps["member_offsets"])[decode])
        replayed = window_steps(out / f"rate_{label}")  # benchmarks/row_waste.py, as for an H100 run's files
        assert replayed["computed"].sum() / replayed["occupied"].sum() == pytest.approx(waste)
        assert set(REQUEST_COLUMNS) <= set(table.requests) and len(table) == record["requests"]["rows"]
        done = table.requests["status"] == STATUSES.index("done")
        assert np.all(table.requests["finish_s"][done] >= table.requests["first_token_s"][done])
        assert int(table.requests["counted"].sum()) == record["requests"]["counted"]
        # The fit ran on this record's own in-process trace: every finished request has a whole-lifetime idle share.
        energy = record["requests"]["energy"]
        assert energy.get("segments", 0) >= 20 and "share_rule" in energy, energy
        assert np.all(np.isfinite(table.requests["idle_j"][done]))
    later = json.loads((out / "rate_max" / "run_record.json").read_text())["requests"]["energy"]
    assert {(c["fitted_at"], c["predicted"]) for c in later["cross_rate"]} == {("max", "40"), ("40", "max")}
    assert isinstance(later["controlled_split"], list) and len(later["controlled_split"]) == 2
    # The controlled-split window before the first rate: full-size prefill steps back to back, then every row decoded
    # together; each part as long as its bound asks, here capped by the 3 s window; its own bound and card state.
    window = later["controlled_window"]
    assert window["part_seconds_planned"] == 3 and "measured window" in window["part_length_rule"]
    assert window["prefill"]["steps"] > 1 and window["prefill"]["seconds"] >= 0.9 * window["part_seconds_planned"]
    assert window["prefill_step_requests"] == 1 and window["decode_rows"] == 4  # 4 rows: steps of 1 request
    for part in ("prefill", "decode"):
        assert window[part]["bound_j"] > 0 and window[part]["sm_clock_mhz"] > 0, window[part]
        assert window[part]["capped_share"] is not None  # the fake NVML reports the clock event reasons
    prefill_check = next(c for c in later["controlled_split"] if c["part"] == "prefill")
    assert prefill_check["measured_bound_j"] == window["prefill"]["bound_j"]
    assert prefill_check["conditions"]["predicted"]["prefill_step_tokens"] == window["prefill"]["prefill_step_tokens"]
    # the client-side estimate's error, measured on the engine's own requests (llm_inference/client_estimate.py)
    error = later["client_side_estimate_error"]
    assert error["requests"] > 0 and 0 <= error["relative_error_p50"] <= error["relative_error_p90"], error
    # After the last rate both are fitted together, each record gaining the joint block (its own checks on it).
    for label in ("40", "max"):
        joint = json.loads((out / f"rate_{label}" / "run_record.json").read_text())["requests"]["energy"]["joint"]
        assert joint["rates"] == ["40", "max"] and [c["predicted"] for c in joint["cross_rate"]] == [label]
        assert isinstance(joint["controlled_split"], list) and len(joint["held_out_halves"]) == 2
        assert f"rate {label}: joint per-request fit over rates 40, max: checks failed" in result.stdout
        # The card-state term tried on the rates left out (the fake NVML's clock follows its power), adopted or why not.
        term = joint["clock_term"]
        assert [h["rate"] for h in term["held_out_rates"]] == ["40", "max"] and joint["rates_left_out"] == {}
        assert term["adopted"] == (term["unadopted_reason"] is None)
        assert all("conditions" in c for c in (*joint["controlled_split"], *joint["cross_rate"]))
    # The replay script over the sweep's files (benchmarks/joint_fit_replay.py, as for an H100 sweep) reproduces every
    # record's coefficients and checks, the controlled split's from its stored step log.
    from benchmarks.joint_fit_replay import differences

    assert differences(out) == []
    # At `max` every request arrives at the start: nobody meets a 50 ms TTFT once the queue is long.
    assert json.loads((out / "rate_max" / "run_record.json").read_text())["metrics"]["slo_attained_share"] < 1


def test_the_row_waste_of_a_record_before_issue_59_is_read_from_its_row_buckets():
    """A step log without `computed_rows` (the H100 run of main before the finer buckets): every step of its
    backlog at 256 rows occupied more than 192, the bucket below 256 then, so each computed all 256."""
    shipped = "benchmarks/results/2026-12-06-wave5-s2/issue57-behaviour/p57b/base/continuous-256/run"
    steps = window_steps(Path(__file__).resolve().parents[2] / shipped)
    assert steps["occupied"].min() > 192 and set(steps["computed"]) == {256} and len(steps["ms"]) == len(steps["here"])


@pytest.mark.parametrize(("argv", "named"), [
    (["--rate", "0"], "--rate"), (["--rate", "-2"], "--rate"), (["--rate", "nan"], "--rate"),
    (["--rate", "inf"], "--rate"), (["--rates", "1,1"], "--rates"), (["--rates", "1,,x"], "--rates"),
    (["--rate", "1", "--slo-ttft-ms", "0"], "--slo-ttft-ms"), (["--rate", "1", "--slo-tpot-ms", "-5"], "--slo-tpot-ms"),
    (["--rate", "1", "--max-concurrency", "0"], "--max-concurrency"),
    (["--rate", "1", "--admit-divisor", "0"], "--admit-divisor"),
    (["--rate", "1", "--admit-divisor", "2", "--url", "http://127.0.0.1:8000"], "--admit-divisor and --url"),
])
@pytest.mark.parametrize("command", ["load", "validate-load"])
def test_bad_numbers_are_refused_by_the_parser_naming_the_option(command, argv, named, capsys):
    with pytest.raises(SystemExit) as ended:
        main([command, *LOAD, *argv])
    assert ended.value.code == 2 and named in capsys.readouterr().err


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(["validate-load", *argv]) == 64
    return capsys.readouterr().err


def test_load_configurations_that_cannot_run_are_refused_with_the_fix(tmp_path, capsys):
    assert "no load given" in _refused(LOAD, capsys)
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"arrival_s": 0, "input_tokens": 5, "output_tokens": 3}\n')
    assert "--trace and --rate" in _refused([*LOAD, "--rate", "2", "--trace", str(trace)], capsys)
    # More slots than the memory estimate admits: the most it admits is named.
    err = _refused(["--preset", "llama-8b", "--task", "chat", "--rate", "max", "--max-concurrency", "4096",
                    "--device-memory-gib", "79"], capsys)
    assert "--max-concurrency 4096" in err and "use --max-concurrency 48" in err
    # A task whose longest request does not fit the model's context.
    assert "positions" in _refused(["--preset", "gpt2", "--task", "summarization", "--rate", "1"], capsys)


@pytest.mark.parametrize(("content", "named"), [
    (b"", "holds no requests"),
    (b'{"arrival_s": 1, "input_tokens": 5, "output_tokens": 3}\n{"arrival_s": 0.5, "input_tokens": 5, '
     b'"output_tokens": 3}\n', "line 2"),
    (b'{"arrival_s": 0, "input_tokens": 5, "output_tokens": 3}\n\xff\xfe\n', "line 2 is not UTF-8"),
    (b'{"arrival_s": 0, "input_tokens": 5000, "output_tokens": 3}\n', "request 0"),
])
def test_a_bad_trace_is_refused_naming_the_line_or_request(content, named, tmp_path, capsys):
    trace = tmp_path / "trace.jsonl"
    trace.write_bytes(content)
    assert named in _refused(["--preset", "tiny", "--device", "cpu", "--trace", str(trace)], capsys)


def test_a_replayed_trace_is_served_in_its_own_arrival_order(tmp_path, capsys):
    trace = tmp_path / "trace.jsonl"
    lines = [{"arrival_s": 0.02 * i, "prompt_ids": [3 + i, 4, 5, 6], "output_tokens": 2 + i % 3} for i in range(12)]
    trace.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    out = tmp_path / "replay"
    assert main(["load", "--preset", "tiny", "--device", "cpu", "--trace", str(trace), "--max-concurrency", "3",
                 "--steady-seconds", "0.1", "--warmup-requests", "2", "--out-dir", str(out)]) == 0
    table = read_requests(Path(out) / FILE_NAME)
    assert list(table.requests["id"]) == list(range(12)) and list(table.requests["output_tokens"]) == \
        [line["output_tokens"] for line in lines]
    assert list(table.requests["warmup"]) == [1, 1] + [0] * 10
    assert np.all(np.diff(table.requests["arrival_s"]) > 0)
    capsys.readouterr()


def test_the_run_record_doc_lists_every_column_of_the_request_table():
    from joulebench.requests_table import columns_doc

    assert columns_doc() in (Path(__file__).parents[2] / "docs" / "run-record.md").read_text()


def test_failed_model_checks_are_named_in_one_line():
    from llm_inference.serving_energy import failed_checks

    block = {"cross_rate": [{"fitted_at": "max", "predicted": "4", "passes": False},
                            {"fitted_at": "4", "predicted": "max", "passes": True}],
             "held_out_halves": [{"closes": True}, {"closes": False}],
             "controlled_split": [{"part": "prefill", "passes": True}, {"part": "decode", "passes": False}]}
    assert failed_checks(block) == "a (cross-rate): max->4; b (held-out half): 2; c (controlled split): decode"
    passing = {"cross_rate": [], "held_out_halves": [{"closes": True}], "controlled_split": "no window"}
    assert failed_checks(passing) == "none"


def test_sigterm_ends_the_load_with_a_timeout_record_and_its_request_table(fake_env, tmp_path):
    out = tmp_path / "stopped"
    proc = subprocess.Popen([*INFER, "load", *LOAD, "--rates", "20,max", "--steady-seconds", "120", "--out-dir",
                             str(out)], env=fake_env(), cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    assert proc.stdout is not None
    for line in proc.stdout:  # the load of the first rate has started: its window lasts 120 s
        if "counted poisson arrivals" in line:
            break
    time.sleep(4.0)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 124, stderr[-3000:]  # TIMEOUT's code (joulebench.record.EXIT_CODES)
    record = json.loads((out / "rate_20" / "run_record.json").read_text())
    assert record["status"] == "TIMEOUT" and "SIGTERM received" in record["status_reason"]
    table = read_requests(out / "rate_20" / FILE_NAME)  # what was served before the signal is kept
    assert len(table) == record["requests"]["rows"] > 0
    assert not (out / "rate_max").exists()  # the sweep ended
    assert summaries(stdout)[0]["status"] == "TIMEOUT"


def test_each_part_of_the_controlled_window_lasts_until_its_planned_bound_is_half_the_checks_tolerance():
    from joulebench.request_energy import SPLIT_SLACK
    from jpwr.estimator import planned_bound_j
    from llm_inference.serving_energy import CONTROLLED_BOUND_SHARE, controlled_part_seconds

    for period in (0.02, 0.1):
        seconds, rule = controlled_part_seconds(period, 60.0)
        assert planned_bound_j(1.0, period) / seconds == pytest.approx(SPLIT_SLACK * CONTROLLED_BOUND_SHARE)
        assert f"{period * 1e3:.0f} ms counter" in rule
    assert controlled_part_seconds(0.1, 3.0) == (3.0, "the rate's measured window (3 s); a planned bound <= 2.5% "
                                                      "needs 8 s")
