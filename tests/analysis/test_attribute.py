"""`joulebench attribute` on synthetic runs with known per-phase powers, metered through the fake pynvml.

Truths come from the generated schedule (tests/analysis/synthetic_run.py), never typed in: the mean power of
each phase over the steady window, each replay window's true energy per invocation.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from joulebench.analysis import cli
from joulebench.analysis.attribute import attribute
from joulebench.analysis.attribution_text import render
from joulebench.analysis.replay import inference_estimator
from joulebench.phases import BACKWARD, FORWARD, OPTIMIZER, REPLAY_PREFIX
from joulebench.record import RunRecord, read_run_record, write_run_record
from jpwr.energy import IdleBaseline, Window, WindowEnergy
from jpwr.errors import ExitCode
from tests.analysis.conftest import MeteredRun, metered
from tests.analysis.synthetic_run import IDLE_W, NS, Schedule

REPO = Path(__file__).resolve().parents[2]


def _row(estimator: dict, phase: str) -> dict:
    return next(r for r in estimator["rows"] if r["phase"] == phase)


def _steady_bounds(run_dir: Path) -> tuple[float, float]:
    steady = read_run_record(run_dir / "run_record.json").window("steady")
    assert steady is not None
    return steady.t_start_ns / NS, steady.t_end_ns / NS


def _per_invocation(schedule: Schedule, part: str) -> float:
    _, t0, t1, count = next(w for w in schedule.windows if w[0] == REPLAY_PREFIX + part)
    return schedule.true_energy(t0, t1) / count


def test_fit_recovers_the_known_phase_powers_within_its_interval(steady_run: MeteredRun) -> None:
    _, _, block = attribute(steady_run.run_dir)
    fit = block["estimators"]["fit"]
    t0, t1 = _steady_bounds(steady_run.run_dir)
    for phase in (FORWARD, BACKWARD):
        row = _row(fit, phase)
        truth = steady_run.schedule.true_mean_w(phase, t0, t1)
        assert row["status"] == "resolved", row
        low, high = row["mean_power_w_interval"]
        assert low <= truth <= high, (phase, truth, row["mean_power_w_interval"])
        low_j, high_j = row["energy_j_interval"]
        assert low_j <= truth * row["seconds"] <= high_j
        assert row["share"] == pytest.approx(row["energy_j"] / block["window_energy_j"])
    for phase in (OPTIMIZER, "unmarked"):  # 20 ms per 800 ms step under a 100 ms counter
        row = _row(fit, phase)
        assert row["status"] == "below resolution" and "energy_j" not in row
        assert "varies by only" in row["reason"]
    assert fit["closure"]["status"] == "closes" and "reason" not in fit["closure"]
    assert all(abs(f["residual_j"]) <= f["bound_j"] for f in fit["closure"]["held_out"])
    assert any("grad_reduce was not marked" in note for note in fit["notes"])


def test_replay_measures_each_phase_and_compares_the_sum_with_the_step(steady_run: MeteredRun) -> None:
    _, _, block = attribute(steady_run.run_dir)
    replay = block["estimators"]["replay"]
    schedule = steady_run.schedule
    truths = {FORWARD: _per_invocation(schedule, "forward"),
              BACKWARD: _per_invocation(schedule, "forward+backward") - _per_invocation(schedule, "forward"),
              OPTIMIZER: _per_invocation(schedule, "optimizer")}
    for phase, truth in truths.items():
        row = _row(replay, phase)
        assert abs(row["energy_per_step_j"] - truth) <= row["error_bound_j"], (phase, row, truth)
    assert _row(replay, BACKWARD)["status"] == "derived"
    check = replay["sum_vs_step"]
    true_residual = (_per_invocation(schedule, "forward+backward") + _per_invocation(schedule, "optimizer")
                     - _per_invocation(schedule, "step"))
    assert abs(check["residual_j"] - true_residual) <= check["bound_j"]
    assert check["residual_j"] == pytest.approx(check["sum_j"] - check["step_j"])


def test_unmarked_work_in_half_the_window_is_a_misfit_with_its_residual(interfered_run: MeteredRun) -> None:
    _path, record, block = attribute(interfered_run.run_dir)
    fit = block["estimators"]["fit"]
    t0, t1 = _steady_bounds(interfered_run.run_dir)
    extra_j = 60.0 * (t1 - t0) / 2  # the interference's energy in the second half
    first, second = fit["closure"]["held_out"]
    assert fit["closure"]["status"] == "misfit"
    assert first["residual_j"] < -first["bound_j"] and second["residual_j"] > second["bound_j"]
    assert 0.5 * extra_j < second["residual_j"] < 1.5 * extra_j
    assert "power drifted between them" in fit["closure"]["reason"]  # what the opposite residuals say
    text = render(record, block)
    assert "MISFIT" in text and f"residual {second['residual_j']:.3g} J" in text
    assert " ".join(f"misfit: {fit['closure']['reason']}".split()) in " ".join(text.split())  # wrapped at 160


def test_cli_prints_both_estimators_and_stores_the_block(steady_run: MeteredRun, fresh_copy, capsys) -> None:
    run_dir = fresh_copy(steady_run)
    before = read_run_record(run_dir / "run_record.json")
    assert cli.main(["attribute", str(run_dir)]) == ExitCode.OK
    out = capsys.readouterr().out
    assert "fit (phases)" in out and "replay" in out and "never mixed" in out
    after = read_run_record(run_dir / "run_record.json")
    assert set(after.attribution["estimators"]) == {"fit", "replay"}
    assert after.attribution["window"] == "steady" and after.attribution["steps"] == before.window("steady").steps
    assert [w.to_dict() for w in after.windows] == [w.to_dict() for w in before.windows]
    assert RunRecord.from_dict(after.to_dict()).attribution == after.attribution


def test_python_m_joulebench_attribute_prints_without_writing(steady_run: MeteredRun, fresh_copy) -> None:
    run_dir = fresh_copy(steady_run)
    result = subprocess.run([sys.executable, "-m", "joulebench", "attribute", str(run_dir), "--no-write",
                             "--bootstrap", "40"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "fit (phases)" in result.stdout
    assert "attribution" not in json.loads((run_dir / "run_record.json").read_text())


def test_a_run_without_phase_marks_names_the_fix(synthetic_root: Path, capsys) -> None:
    run = metered(synthetic_root, "unmarked", steady_s=6.0, mark=())
    assert cli.main(["attribute", str(run.run_dir)]) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert "has no phase marks" in err and "Fix:" in err


def test_a_run_metered_without_a_sensor_says_so(synthetic_root: Path, capsys) -> None:
    run = metered(synthetic_root, "no-sensor", steady_s=6.0, sensor=False)
    assert cli.main(["attribute", str(run.run_dir)]) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert "the sampler metered no accelerator" in err and "joulebench demo" in err
    assert "CUDA_VISIBLE_DEVICES" not in err


def test_unknown_phase_or_window_is_refused_with_the_choices(steady_run: MeteredRun, capsys) -> None:
    assert cli.main(["attribute", str(steady_run.run_dir), "--phases", "forward,bogus", "--no-write"]) == \
        ExitCode.USAGE
    err = capsys.readouterr().err
    assert "--phases names bogus" in err and "choose from backward, forward, optimizer" in err
    assert cli.main(["attribute", str(steady_run.run_dir), "--window", "nosuch", "--no-write"]) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert "no window 'nosuch'" in err and "steady" in err and "replay/optimizer" in err


def test_a_phase_that_was_not_marked_is_said_and_counted_as_unmarked(synthetic_root: Path) -> None:
    run = metered(synthetic_root, "no-optimizer", steady_s=10.0, mark=(FORWARD, BACKWARD))
    _, _, block = attribute(run.run_dir)
    fit = block["estimators"]["fit"]
    assert {r["phase"] for r in fit["rows"]} == {FORWARD, BACKWARD, "unmarked"}
    assert any(note.startswith("optimizer was not marked") for note in fit["notes"])


def test_selected_phases_leave_the_others_unmarked(steady_run: MeteredRun) -> None:
    _, _, block = attribute(steady_run.run_dir, selected=[FORWARD])
    rows = block["estimators"]["fit"]["rows"]
    assert [r["phase"] for r in rows] == [FORWARD, "unmarked and other phases"]
    assert sum(r["seconds"] for r in rows) == pytest.approx(block["window_duration_s"])


def _kernel_file(schedule: Schedule, t0: float, t1: float, path: Path, steps: int) -> Path:
    """Kernels as a profiler would see them: one per phase occurrence, and a communication kernel that only ever
    runs beside a GEMM (so it has no time of its own)."""
    names = {FORWARD: "flash_fwd_kernel", BACKWARD: "sm90_xmma_gemm_bf16bf16_bf16f32", OPTIMIZER:
             "multi_tensor_apply_kernel<FusedAdamMathFunctor>"}
    rows = []
    for piece in schedule.pieces:
        if piece.phase in names and t0 <= piece.t0 and piece.t1 <= t1:
            rows.append((names[piece.phase], piece.t0, piece.t1))
            if piece.phase == BACKWARD:
                rows.append(("ncclDevKernel_AllReduce_Sum_bf16", piece.t0, piece.t0 + 0.01))
    table = list(dict.fromkeys(name for name, _, _ in rows))
    path.write_text(json.dumps({
        "kind": "joulebench.kernel_intervals", "window": "steady", "steps": steps, "local_rank": 0,
        "names": table, "name_index": [table.index(n) for n, _, _ in rows],
        "t0_ns": [round(a * NS) for _, a, _ in rows], "t1_ns": [round(b * NS) for _, _, b in rows]}))
    return path


def test_kernel_classes_from_a_profile_are_fitted_the_same_way(steady_run: MeteredRun, fresh_copy) -> None:
    run_dir = fresh_copy(steady_run)
    t0, t1 = _steady_bounds(run_dir)
    steps = read_run_record(run_dir / "run_record.json").window("steady").steps
    profile = _kernel_file(steady_run.schedule, t0, t1, run_dir / "kernels.json", steps)
    _, _, block = attribute(run_dir, profile=profile)
    kernels = block["estimators"]["fit_kernel_classes"]
    for label, phase in (("attention", FORWARD), ("gemm", BACKWARD)):
        low, high = _row(kernels, label)["mean_power_w_interval"]
        assert low <= steady_run.schedule.true_mean_w(phase, t0, t1) <= high
    assert _row(kernels, "communication")["reason"] == "no time of its own in this window"
    assert _row(kernels, "idle (no kernel)")["status"] == "below resolution"
    assert "fit" in block["estimators"] and "replay" in block["estimators"]  # reported beside, never merged


def test_idle_power_adds_the_idle_dynamic_split(steady_run: MeteredRun) -> None:
    idle_w = 100.0
    _, _, block = attribute(steady_run.run_dir, idle_power_w=idle_w)
    assert block["idle_power_w_per_device"] == idle_w
    for row in block["estimators"]["fit"]["rows"]:
        if row["status"] == "resolved":
            assert row["dynamic_j"] == pytest.approx(row["energy_j"] - idle_w * row["device_seconds"])
    forward = _row(block["estimators"]["replay"], FORWARD)
    assert forward["dynamic_j"] == pytest.approx(forward["energy_per_step_j"] - idle_w * forward["seconds_per_step"])


def test_a_phase_below_the_idle_power_has_no_dynamic_energy_but_the_reason(steady_run: MeteredRun) -> None:
    """Issue 32 (A44): an idle power above a phase's (420 W forward at 500 W idle) printed a negative "dynamic J"
    beside "measured"; backward (640 W) keeps its number."""
    _, record, block = attribute(steady_run.run_dir, idle_power_w=500.0)
    for estimator in ("fit", "replay"):
        forward, backward = (_row(block["estimators"][estimator], phase) for phase in (FORWARD, BACKWARD))
        assert forward["dynamic_j"] is None and forward["dynamic_reason"].startswith("idle baseline 500 W above the "
                                                                                     "phase's mean power 4")
        assert backward["dynamic_j"] > 0 and "dynamic_reason" not in backward
    text = render(record, block)
    assert "n/a: idle baseline 500 W above the phase's mean power" in text
    assert not any(cell.strip().startswith("-") for line in text.splitlines() for cell in line.split("|")[5:6])


def test_the_records_idle_baseline_gives_the_split_without_an_option(steady_run: MeteredRun, fresh_copy) -> None:
    run_dir = fresh_copy(steady_run)
    _, _, plain = attribute(run_dir)
    assert plain["idle_power_w_per_device"] is None and "no idle baseline" in plain["idle_source"]
    record = read_run_record(run_dir / "run_record.json")
    record.meter["idle_baseline"] = IdleBaseline(power_w=2 * IDLE_W, error_bound_w=1.0, devices=2, duration_s=5.0,
                                                 method="counter", settled=True).to_dict()
    write_run_record(run_dir / "run_record.json", record)
    _, _, block = attribute(run_dir)
    assert block["idle_power_w_per_device"] == IDLE_W and "the record's idle baseline" in block["idle_source"]
    forward = _row(block["estimators"]["fit"], FORWARD)
    assert forward["dynamic_j"] == pytest.approx(forward["energy_j"] - IDLE_W * forward["device_seconds"])


def test_inference_records_split_prefill_and_decode_with_the_drivers_rule() -> None:
    from llm_inference.measure import PointWindows
    from llm_inference.metrics import energy_metrics

    def window(name: str, seconds: float, watts: float, work: dict[str, float]) -> Window:
        energy = WindowEnergy(energy_j=watts * seconds, mean_power_w=watts, devices=1, method="counter+power",
                              coverage=1.0, error_bound_j=0.01 * watts * seconds)
        return Window(name, 0, 1, 0, int(seconds * NS), work, energy)

    prefill = window("prefill", 2.0, 500.0, {"calls": 40.0, "input_tokens": 40_000.0})
    steady = window("steady", 8.0, 350.0, {"requests": 80.0, "output_tokens": 10_000.0, "decode_tokens": 9_920.0})
    point = PointWindows(window("warmup", 1.0, 300.0, {}), prefill, steady, 2, 4, [], setup_s=0.0)
    record = RunRecord("llm_inference", "inference", windows=[point.warmup, prefill, steady],
                       metrics=energy_metrics(point))
    result = inference_estimator(record, idle_power_w=80.0)
    prefill_row, decode_row = result["rows"]
    assert prefill_row["energy_j"] == pytest.approx(prefill.energy.energy_j * 4 / 2)  # steady passes / prefill passes
    assert prefill_row["energy_j"] + decode_row["energy_j"] == pytest.approx(steady.energy.energy_j)
    assert prefill_row["seconds"] + decode_row["seconds"] == pytest.approx(steady.duration_s)
    for row in result["rows"]:
        assert row["dynamic_j"] == pytest.approx(row["energy_j"] - 80.0 * row["seconds"])
        assert row["mean_power_w"] == pytest.approx(row["energy_j"] / row["seconds"])
    assert "n/a" not in render(record, {"window": "steady", "estimators": {"windows": result}})


def test_shares_of_the_resolved_phases_and_the_rest_add_up(steady_run: MeteredRun) -> None:
    _, _, block = attribute(steady_run.run_dir)
    fit = block["estimators"]["fit"]
    fitted = fit["closure"]["in_sample"]["fitted_j"]
    resolved = sum(r["energy_j"] for r in fit["rows"] if r["status"] == "resolved")
    assert resolved < fitted and np.isclose(fit["closure"]["in_sample"]["measured_j"], block["window_energy_j"])
