"""`joulebench recommend`: the cheapest software setting of a sweep that meets a target, on recorded fronts.

The front: llama-1b chat at batch 1 on one H100 (issue 46, docs/BENCHMARKS.md), ms and J per output token of the two
decode variants, written as run records of the settings that run them (the default `auto`+speed runs the faster
variant, `--objective energy` and the pinned coordinate-descent the cheaper one). Each expectation follows from those
figures and the stated bounds, not from the code under test. Records it must leave out or refuse sit beside them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from joulebench.analysis import knobs, recommend, remeasure
from joulebench.analysis.cli import main as joulebench_main
from joulebench.analysis.report import Run, load_runs
from joulebench.record import RunRecord, steady_metrics, write_run_record
from jpwr.energy import Window, WindowEnergy
from jpwr.errors import ValidationError

TOKENS = 4000  # output tokens of each steady window
FASTER = (1.274e-3, 0.662)  # s and J per output token: the default variant
CHEAPER = (1.420e-3, 0.525)  # coordinate-descent
BOUND = 0.004  # the meter's relative bound of each run
DEFAULT = {"decode_tuning": "auto", "objective": None}
ENERGY = {"decode_tuning": "auto", "objective": "energy"}
PINNED = {"decode_tuning": "coordinate-descent", "objective": None}


def write_point(root: Path, run_id: str, knob_values: dict[str, Any], figures: tuple[float, float],
                bound: float = BOUND, tpot_s: float | None = None, coverage: float = 1.0, status: str = "OK",
                disturbed: bool = False, **config: Any) -> None:
    seconds, joules = figures[0] * TOKENS, figures[1] * TOKENS
    energy = WindowEnergy(energy_j=joules, mean_power_w=joules / seconds, devices=1, method="counter",
                          coverage=coverage, error_bound_j=bound * joules)
    window = Window("steady", 0, 20, 10**9, 10**9 + round(seconds * 1e9), {"output_tokens": TOKENS}, energy)
    metrics = {**steady_metrics(window, "output_tokens", devices=1), "devices": 1,
               "per_token_latency_p90_s": tpot_s if tpot_s is not None else figures[0], "ttft_p90_s": 0.02}
    record = RunRecord("llm_inference", run_id, status=status, status_reason="OOM" if status == "FAILED" else None,
                       config={"model": "llama-1b", "preset": "llama-1b", "task": "chat", "batch_size": 1,
                               "precision": "bf16", "engine": "static", **knob_values, **config},
                       hardware={"devices": 1}, windows=[window], metrics=metrics)
    if disturbed:
        record.disturbed = {"disturbed": True, "reasons": ["host load: planted"]}
    write_run_record(root / run_id / "run_record.json", record)


@pytest.fixture
def front(tmp_path: Path) -> Path:
    write_point(tmp_path, "default-1", DEFAULT, FASTER)
    write_point(tmp_path, "default-2", DEFAULT, (FASTER[0], FASTER[1] * 1.002))
    write_point(tmp_path, "energy", ENERGY, CHEAPER)
    write_point(tmp_path, "pinned", PINNED, (CHEAPER[0] * 1.001, CHEAPER[1] * 1.01))
    write_point(tmp_path, "gappy", {"decode_tuning": "default"}, (1.0e-3, 0.3), coverage=0.8)
    write_point(tmp_path, "crashed", {"decode_tuning": "default"}, (1.0e-3, 0.3), status="FAILED")
    write_point(tmp_path, "noisy", {"decode_tuning": "default"}, (1.0e-3, 0.3), disturbed=True)
    return tmp_path


def run_recommend(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert joulebench_main(["recommend", *args]) == 0
    return capsys.readouterr().out


def test_the_cheaper_variant_is_recommended_with_its_bounded_saving(front, capsys) -> None:
    out = run_recommend(capsys, str(front), "--max-slowdown", "15%")
    expected = 1 - CHEAPER[1] / ((FASTER[1] + FASTER[1] * 1.002) / 2)
    saving = f"saving {100 * expected:+.2f} % (bound ±{100 * 2 * BOUND:.2f} %)"
    slowdown = CHEAPER[0] / FASTER[0] - 1
    assert ("recommended (PREDICTED from the sweep, not re-measured): decode_tuning=auto objective=energy\n"
            f"  0.525 J per output_token, {saving}, time {100 * slowdown:+.2f} % against the default") in out
    assert "apply (driver options): python -m llm_inference ... --objective energy" in out
    assert "apply (JUBE): JOULEBENCH_SWEEP_OBJECTIVE=energy jube run jube/inference_benchmark.xml --tag llama-1b" in out
    assert ("default setting: decode_tuning=auto objective=speed: 0.6627 J per output_token (runs default-1, "
            "default-2)") in out
    # what the recommendation must not rest on: named, each with its reason
    assert "left out: run gappy: energy coverage 80 % is below 99 %" in out
    assert "left out: run crashed: status FAILED: OOM" in out
    assert "left out: run noisy: disturbed: host load: planted" in out
    assert all(len(line) <= 160 for line in out.splitlines())


def test_a_slowdown_limit_the_cheaper_variant_exceeds_keeps_the_default(front, capsys) -> None:
    out = run_recommend(capsys, str(front), "--max-slowdown", "5%")
    assert "recommended: the default; no setting that meets the target saves energy beyond" in out
    slowdown = CHEAPER[0] / FASTER[0] - 1
    assert f"decode_tuning=auto objective=energy misses the target: slowdown {100 * slowdown:+.2f} % > 5.00 %" in out
    assert "apply" not in out


def test_a_tpot_limit_picks_the_cheapest_setting_that_meets_it(tmp_path, capsys) -> None:
    write_point(tmp_path, "default", DEFAULT, FASTER)
    write_point(tmp_path, "energy", ENERGY, CHEAPER, tpot_s=2.0e-3)  # its p90 TPOT breaks a 1.6 ms limit
    write_point(tmp_path, "pinned", PINNED, (CHEAPER[0], 0.55), tpot_s=1.5e-3)
    out = run_recommend(capsys, str(tmp_path), "--max-p90-tpot-ms", "1.6")
    assert "not re-measured): decode_tuning=coordinate-descent objective=speed\n  0.55 J per output_token" in out
    assert "decode_tuning=auto objective=energy misses the target: p90 TPOT 2 ms > 1.6 ms" in out
    assert "--decode-tuning coordinate-descent" in out and "JOULEBENCH_SWEEP_DECODE_TUNING=coordinate-descent" in out


def test_a_difference_inside_the_bounds_is_no_saving(tmp_path) -> None:
    write_point(tmp_path, "default", DEFAULT, FASTER, bound=0.15)
    write_point(tmp_path, "energy", ENERGY, CHEAPER, bound=0.15)  # 20.7 % < 15 % + 15 %
    rec = recommend.recommend(load_runs([tmp_path]), recommend.Target())
    assert rec.is_default and not rec.rows[0].saving.beyond_bounds
    assert "within bounds" in rec.rows[0].saving.words()


def test_a_setting_that_changes_what_is_computed_is_offered_only_when_allowed(tmp_path, capsys) -> None:
    write_point(tmp_path, "default", DEFAULT, FASTER)
    write_point(tmp_path, "energy", ENERGY, CHEAPER)
    write_point(tmp_path, "fp8", DEFAULT, (1.0e-3, 0.30), precision="fp8")
    out = run_recommend(capsys, str(tmp_path), "--default", "precision=bf16")
    assert "left out: setting objective=speed precision=fp8: changes what is computed (precision bf16 -> fp8)" in out
    assert "not re-measured): objective=energy precision=bf16\n  0.525 J" in out
    allowed = run_recommend(capsys, str(tmp_path), "--default", "precision=bf16", "--allow-semantic-changes")
    assert "objective=speed precision=fp8 [CHANGES WHAT IS COMPUTED]" in allowed
    assert "NOTE: it changes what is computed (precision bf16 -> fp8): allowed by --allow-semantic-changes" in allowed
    assert "--precision fp8" in allowed


@pytest.mark.parametrize(("points", "args", "message"), [
    ([("default", DEFAULT, {}), ("energy", ENERGY, {"status": "FAILED"})], [],
     ("too few settings to choose from: 1 with trustworthy runs (1 left out, above)",
      "joulebench recommend: left out: run energy: status FAILED")),
    ([("energy", ENERGY, {}), ("pinned", PINNED, {})], [],
     "no trustworthy run of the default setting (decode_tuning=auto objective=speed)"),
    ([("default", DEFAULT, {"disturbed": True}), ("energy", ENERGY, {})], [],
     ("no trustworthy run of the default setting (objective=speed) (1 left out, above)",
      "joulebench recommend: left out: run default: disturbed: host load: planted\n")),
    ([("default", DEFAULT, {}), ("other-task", ENERGY, {"task": "code"})], [],
     ("the runs form 2 different workloads (listed above)", ": other-task\n", "workload 1: ", ": default\n")),
    ([("bs1", DEFAULT, {}), ("bs8", DEFAULT, {"batch_size": 8})], [],
     "the sweep varies batch_size (1, 8), which has no driver default. Fix: name the site's current value: "
     "--default batch_size=1"),
    ([("bs1", DEFAULT, {}), ("bs8", DEFAULT, {"batch_size": 8})], ["--default", "precision=bf16,batch=1"],
     "--default 'batch=1' is not KNOB=VALUE of a llm_inference knob"),
])
def test_sweeps_it_cannot_recommend_from_are_refused_naming_why(points, args, message, tmp_path, capsys) -> None:
    for run_id, knob_values, extra in points:
        write_point(tmp_path, run_id, knob_values, FASTER, **extra)
    assert joulebench_main(["recommend", str(tmp_path), *args]) == 64
    err = capsys.readouterr().err
    messages = (message,) if isinstance(message, str) else message  # the error and the lines it puts above it
    assert all(text in err for text in messages) and "Fix:" in err, err
    assert all(len(line) <= 160 for line in err.splitlines()[:-1]), err  # the lines above the error


def test_a_batch_sweep_names_its_default_and_writes_json(tmp_path, capsys) -> None:
    write_point(tmp_path, "bs1", DEFAULT, FASTER)
    write_point(tmp_path, "bs8", DEFAULT, (0.3e-3, 0.2), batch_size=8, tpot_s=2.4e-3)
    out = run_recommend(capsys, str(tmp_path), "--default", "batch_size=1", "--max-p90-tpot-ms", "5",
                        "--json", str(tmp_path / "rec.json"))
    assert "recommended (PREDICTED" in out and "batch_size=8" in out and "--batch-size 8" in out
    data = json.loads((tmp_path / "rec.json").read_text())
    assert data["recommended"]["setting"]["batch_size"] == "8" and data["default"]["runs"] == ["bs1"]
    assert data["recommended"]["saving"] == pytest.approx(1 - 0.2 / FASTER[1])
    assert data["recommended"]["beyond_bounds"] is True and "remeasured" not in data


def test_each_knob_is_an_option_of_its_driver_and_a_dimension_of_its_workflow() -> None:
    """The table is data (analysis imports no driver): checked here against the drivers' parsers and jube."""
    import argparse
    import importlib

    from tests.jube.test_profile import jbworkloads

    for benchmark, table in knobs.KNOBS.items():
        parser = importlib.import_module(f"{benchmark}.cli").build_parser()
        subparsers = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        options = {o for p in [parser, *(s for sub in subparsers for s in sub.choices.values())]
                   for a in p._actions for o in a.option_strings}
        workflow = jbworkloads.BY_DRIVER[benchmark]
        for knob in table:
            assert knob.option in options, (benchmark, knob.option)
            assert knob.sweep is None or knob.sweep in workflow.sweep_keys, (benchmark, knob.sweep)
    assert {o for o, _ in [(o, k) for k, o in remeasure.INFERENCE_RUN_OPTIONS]} <= {
        o for a in importlib.import_module("llm_inference.cli").build_parser()._actions
        if isinstance(a, argparse._SubParsersAction) for a2 in a.choices["run"]._actions for o in a2.option_strings}


# ---- re-measuring ---------------------------------------------------------------------------------------------------
def test_remeasured_saving_combines_the_meter_s_bound_and_the_repeats_spread(front, tmp_path) -> None:
    """The re-runs' records come from a stand-in for the driver (the subprocess boundary) holding stated figures."""
    rec = recommend.recommend(load_runs([front]), recommend.Target(max_slowdown=0.15))
    measured_j = {"default": [0.660, 0.664, 0.662], "recommended": [0.530, 0.524, 0.527]}
    issued: list[list[str]] = []

    def driver(command: list[str], out_dir: Path) -> Run:
        issued.append(command)
        name, repeat = out_dir.name.rsplit("-", 1)
        figures = (FASTER[0] if name == "default" else CHEAPER[0], measured_j[name][int(repeat) - 1])
        write_point(out_dir.parent, out_dir.name, DEFAULT if name == "default" else ENERGY, figures)
        return load_runs([out_dir])[0]

    result = remeasure.remeasure(rec, 3, tmp_path / "again", "nvml", 0.99, driver)
    assert [c[c.index("--run-id") + 1] for c in issued] == ["default-1", "recommended-1", "default-2",
                                                           "recommended-2", "default-3", "recommended-3"]
    assert all(c[c.index("--energy-methods") + 1] == "nvml" for c in issued)
    assert all(c[c.index("--objective") + 1] == "energy" for c in issued[1::2])
    assert all("--objective" not in c for c in issued[::2])  # the default's objective: unset, as it ran
    mean = {k: sum(v) / 3 for k, v in measured_j.items()}
    half_range = {k: (max(v) - min(v)) / 2 / mean[k] for k, v in measured_j.items()}
    assert result.measured is not None
    assert result.measured.fraction == pytest.approx(1 - mean["recommended"] / mean["default"])
    assert result.measured.bound == pytest.approx(2 * BOUND + half_range["default"] + half_range["recommended"])
    assert result.agrees is True and result.problems == []
    text = "\n".join(result.lines())
    assert f"measured saving {result.measured.words()} (bound: meter + repeats' spread): agrees with the prediction" \
        in text
    assert result.slowdown == pytest.approx(CHEAPER[0] / FASTER[0] - 1) and result.confirmed
    assert f"re-measured time per unit {100 * result.slowdown:+.2f} % against the default: meets the target" in text


def test_a_remeasure_whose_recommendation_misses_the_target_is_not_confirmed(front, tmp_path) -> None:
    """The saving holds but the re-runs are slower than the sweep said (seen on an H100 at batch 1: +4.3 % predicted,
    +11.9 % re-measured): the target is checked on the re-runs, not only the saving."""
    rec = recommend.recommend(load_runs([front]), recommend.Target(max_slowdown=0.15))
    slower = (FASTER[0] * 1.20, CHEAPER[1])

    def driver(command: list[str], out_dir: Path) -> Run:
        figures = FASTER if out_dir.name.startswith("default") else slower
        write_point(out_dir.parent, out_dir.name, DEFAULT if out_dir.name.startswith("default") else ENERGY, figures)
        return load_runs([out_dir])[0]

    result = remeasure.remeasure(rec, 2, tmp_path / "again", "nvml", 0.99, driver)
    assert result.agrees is True and result.slowdown == pytest.approx(0.20)
    assert result.misses == ["slowdown +20.00 % > 15.00 %"] and not result.confirmed
    assert ("re-measured time per unit +20.00 % against the default: MISSES the target (slowdown +20.00 % > "
            "15.00 %): the recommendation is not confirmed") in "\n".join(result.lines())
    assert result.as_json()["confirmed"] is False


def test_a_remeasure_that_disagrees_or_fails_says_so(front, tmp_path) -> None:
    rec = recommend.recommend(load_runs([front]), recommend.Target(max_slowdown=0.15))

    def same_energy(command: list[str], out_dir: Path) -> Run | str:
        if out_dir.name == "recommended-2":
            return "recommended-2: exit 1: RuntimeError: out of memory"
        write_point(out_dir.parent, out_dir.name, DEFAULT, FASTER)  # no saving at all
        return load_runs([out_dir])[0]

    failed = remeasure.remeasure(rec, 2, tmp_path / "a", "nvml", 0.99, same_energy)
    assert failed.measured is None and failed.problems == ["recommended-2: exit 1: RuntimeError: out of memory"]
    assert "the recommendation stays PREDICTED" in "\n".join(failed.lines())

    def no_saving(command: list[str], out_dir: Path) -> Run:
        write_point(out_dir.parent, out_dir.name, DEFAULT, FASTER)
        return load_runs([out_dir])[0]

    flat = remeasure.remeasure(rec, 2, tmp_path / "b", "nvml", 0.99, no_saving)
    assert flat.measured is not None and flat.measured.fraction == pytest.approx(0) and flat.agrees is False
    assert "DISAGREES with the prediction" in "\n".join(flat.lines())


def test_remeasure_refuses_records_it_cannot_rerun(front, tmp_path) -> None:
    with pytest.raises(ValidationError, match="pass --energy-methods"):
        remeasure.rerun_command({"preset": "tiny", "batch_size": 1}, None)
    with pytest.raises(ValidationError, match="static-batch `llm_inference run` points only"):
        remeasure.rerun_command({"preset": "tiny", "rate": "2", "max_concurrency": 4}, "nvml")


TINY_CPU = {"preset": "tiny", "model": "tiny", "task": "tiny", "num_batches": 2, "output_length": 3,
            "precision": "fp32", "attention": "sdpa", "seed": 1234, "warmup_batches": 1, "steady_seconds": 0.3,
            "device": "cpu", "idle_baseline": False, "energy_methods": "nvml", **DEFAULT}


@pytest.mark.slow
def test_remeasure_reruns_both_settings_through_the_driver(fake_env, h100_trace_dir, tmp_path, capsys,
                                                           monkeypatch) -> None:
    """End to end on the CPU: the tiny preset's batch-size sweep (recorded), re-run by `llm_inference run` under the
    fake NVML (a replayed H100 trace), twice per setting."""
    sweep = tmp_path / "sweep"
    write_point(sweep, "bs1", {}, FASTER, **{**TINY_CPU, "batch_size": 1})
    write_point(sweep, "bs2", {}, (FASTER[0] / 2, FASTER[1] / 2), **{**TINY_CPU, "batch_size": 2})
    for key, value in fake_env(JPWR_FAKE_NVML_TRACE=str(h100_trace_dir)).items():
        monkeypatch.setenv(key, value)
    again = tmp_path / "again"
    out = run_recommend(capsys, str(sweep), "--default", "batch_size=1", "--remeasure", "--repeats", "2",
                        "--remeasure-dir", str(again), "--json", str(tmp_path / "rec.json"))
    assert "recommended (re-measured below): batch_size=2" in out
    reruns = {path.parent.name: path for path in again.rglob("run_record.json")}
    assert sorted(reruns) == ["default-1", "default-2", "recommended-1", "recommended-2"]
    runs = {name: load_runs([path])[0] for name, path in reruns.items()}
    for name, run in runs.items():  # each re-run is its setting's point, metered in-process
        assert run.record.config["batch_size"] == (1 if name.startswith("default") else 2)
        assert (run.record.config["preset"], run.record.config["energy_methods"]) == ("tiny", "nvml")
    left_out = {name: reason for name, run in runs.items() if (reason := recommend.untrusted(run, 0.99))}
    remeasured = json.loads((tmp_path / "rec.json").read_text())["remeasured"]
    if left_out:  # this machine's load may disturb a run: then nothing is called measured, and each is named
        assert remeasured["measured"] is None and "the recommendation stays PREDICTED" in out
        assert all(f"{name}: {reason}" in out for name, reason in left_out.items())
    else:
        energy = {n: r.cost.energy_per_unit_j for n, r in runs.items()}
        expected = 1 - (energy["recommended-1"] + energy["recommended-2"]) / (energy["default-1"] + energy["default-2"])
        assert remeasured["measured"]["fraction"] == pytest.approx(expected)
        assert "measured saving" in out and "(bound: meter + repeats' spread)" in out


def test_report_pareto_marks_the_default_and_the_recommended_setting(front, tmp_path, capsys) -> None:
    assert joulebench_main(["report", "--pareto", str(front), "--max-slowdown", "15%", "-o", str(tmp_path / "p")]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line for line in out.splitlines() if line.split() and line.split()[0] in (
        "default-1", "default-2", "energy", "pinned")}
    assert all(rows[name].rstrip().endswith("default") for name in ("default-1", "default-2"))
    assert rows["energy"].rstrip().endswith("recommended") and "objective=energy" in rows["energy"]
    assert not rows["pinned"].rstrip().endswith(("default", "recommended"))
    assert ("software settings: default decode_tuning=auto objective=speed; recommended (PREDICTED from the sweep, not "
            "re-measured): decode_tuning=auto objective=energy") in out
    # the saving column is against the default setting's runs, not the mean of every run at default device settings
    assert f"default setting: {FASTER[0]:.4g} s" in out
    data = json.loads((tmp_path / "p" / "pareto.json").read_text())
    assert data["software"] == {"default": ["default-1", "default-2"], "recommended": ["energy"]}
    assert data["baseline"]["runs"] == ["default-1", "default-2"]


def test_remeasured_reads_reruns_made_elsewhere(front, tmp_path_factory, capsys) -> None:
    """Any driver's re-runs (e.g. a second JUBE sweep, twice): the two settings' runs compared, other runs ignored."""
    again = tmp_path_factory.mktemp("again")  # beside the sweep, not inside it
    for run_id, knob_values, joules in (("d1", DEFAULT, 0.661), ("d2", DEFAULT, 0.665), ("e1", ENERGY, 0.523),
                                        ("e2", ENERGY, 0.529), ("other", PINNED, 0.4)):
        write_point(again, run_id, knob_values, (FASTER[0], joules))
    out = run_recommend(capsys, str(front), "--max-slowdown", "15%", "--remeasured", str(again))
    expected = 1 - (0.523 + 0.529) / (0.661 + 0.665)
    bound = 2 * BOUND + (0.665 - 0.661) / 2 / 0.663 + (0.529 - 0.523) / 2 / 0.526
    assert f"measured saving {100 * expected:+.2f} % (bound ±{100 * bound:.2f} %)" in out
    assert "agrees with the prediction" in out and "default runs: d1, d2; recommended runs: e1, e2" in out
    write_point(again, "e2", ENERGY, (FASTER[0], 0.529), disturbed=True)
    out = run_recommend(capsys, str(front), "--max-slowdown", "15%", "--remeasured", str(again))
    assert "measured saving n/a (2 problem(s) below)\nproblem: e2: disturbed: host load: planted\nproblem: 1 " \
           "trustworthy re-run(s) of the recommended setting; at least 2 are needed" in out
    assert joulebench_main(["recommend", str(front), "--remeasure", "--remeasured", str(again)]) == 64
    assert "--remeasure and --remeasured both given" in capsys.readouterr().err


def test_report_pareto_without_a_default_for_a_swept_knob_draws_the_front_unmarked(tmp_path, capsys) -> None:
    for run_id, mbs, joules in (("mbs4", 4, 0.010), ("mbs8", 8, 0.009)):
        write_point(tmp_path, run_id, {}, (1e-3, joules), micro_batch_size=mbs)
        record = json.loads((tmp_path / run_id / "run_record.json").read_text())
        record["benchmark"] = "llm_training"
        (tmp_path / run_id / "run_record.json").write_text(json.dumps(record))
    assert joulebench_main(["report", "--pareto", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "software settings not marked: the sweep varies micro_batch_size (4, 8), which has no driver default" in out
    assert "marked" not in out.splitlines()[0]


def test_remeasured_counts_only_new_runs_of_the_sweep_and_fails_when_none_is(front, tmp_path_factory, capsys) -> None:
    """Issue 61: the sweep's own records given as re-runs were "re-measured (2 + 2 runs) ... agrees ... meets the
    target"; one record given as its directory and its file counted twice. A re-run is a new run: its run id outside
    the sweep, given once, started after the sweep's runs, of its workload, on its node; the others are named, and
    with no re-run left the re-measurement fails (exit 1)."""
    assert joulebench_main(["recommend", str(front), "--max-slowdown", "15%", "--remeasured",
                            str(front / "default-1"), str(front / "default-2"), str(front / "energy"),
                            str(front / "energy" / "run_record.json")]) == 1
    captured = capsys.readouterr()
    for run_id in ("default-1", "default-2", "energy"):
        assert f"problem: {run_id}: is a run of the sweep itself, not a re-run" in captured.out
    assert "re-measured (0 + 0 runs" in captured.out and "the recommendation stays PREDICTED" in captured.out
    assert "the re-measurement FAILED" in captured.err

    again = tmp_path_factory.mktemp("again")
    for run_id, knob_values, joules in (("d1", DEFAULT, 0.661), ("d2", DEFAULT, 0.665), ("e1", ENERGY, 0.523),
                                        ("e2", ENERGY, 0.529)):
        write_point(again, run_id, knob_values, (FASTER[0], joules))
    early = json.loads((again / "d2" / "run_record.json").read_text())
    early["started_at"] = "2020-01-01T00:00:00+00:00"
    (again / "d2" / "run_record.json").write_text(json.dumps(early))
    write_point(again, "other-task", DEFAULT, (FASTER[0], 0.66), task="summarization")
    out = run_recommend(capsys, str(front), "--max-slowdown", "15%", "--remeasured", str(again),
                        str(again / "e1" / "run_record.json"))
    assert "problem: d2: started 2020-01-01T00:00:00+00:00, before the sweep's last run" in out
    assert "problem: other-task: runs another workload (task 'summarization', the sweep's 'chat')" in out
    assert "problem: e1: " in out and "is given twice (as its directory and as its file?)" in out
    assert "re-measured (1 + 2 runs" in out  # d1 alone on its side: n/a, the others named, not failed (exit 0)


def test_remeasured_runs_of_another_node_are_no_remeasurement_of_the_sweep(tmp_path, tmp_path_factory,
                                                                          capsys) -> None:
    def on_node(root: Path, run_id: str, knob_values: dict[str, Any], joules: float, node: str) -> None:
        write_point(root, run_id, knob_values, (FASTER[0], joules))
        path = root / run_id / "run_record.json"
        record = json.loads(path.read_text())
        record["launch"] = {"node_name": node}
        path.write_text(json.dumps(record))

    for run_id, knob_values, joules in (("default-1", DEFAULT, 0.662), ("default-2", DEFAULT, 0.663),
                                        ("energy", ENERGY, 0.525)):
        on_node(tmp_path, run_id, knob_values, joules, "n1")
    again = tmp_path_factory.mktemp("again")
    for run_id, knob_values, joules in (("d1", DEFAULT, 0.661), ("d2", DEFAULT, 0.665), ("e1", ENERGY, 0.523),
                                        ("e2", ENERGY, 0.529)):
        on_node(again, run_id, knob_values, joules, "n2")
    assert joulebench_main(["recommend", str(tmp_path), "--max-slowdown", "15%", "--remeasured", str(again)]) == 1
    out = capsys.readouterr().out
    assert all(f"problem: {r}: ran on node n2, the sweep on n1: re-measure on the sweep's node" in out
               for r in ("d1", "d2", "e1", "e2"))


def test_a_remeasure_whose_every_rerun_failed_exits_non_zero(front, tmp_path, capsys) -> None:
    """Issue 61: `--remeasure` exited 0 when every re-run failed. The re-runs here are the driver's own command lines,
    refused at once (an energy method no meter has)."""
    assert joulebench_main(["recommend", str(front), "--max-slowdown", "15%", "--remeasure", "--energy-methods",
                            "no-such-meter", "--remeasure-dir", str(tmp_path / "again")]) == 1
    captured = capsys.readouterr()
    assert captured.out.count("problem: ") >= 4 and "exit 2: " in captured.out
    assert "no re-run left a record of a new run (each failed, or is no re-run): the re-measurement FAILED" in \
        captured.err


@pytest.mark.parametrize("batch", [-4, "four", 4.5, 0])
def test_an_impossible_configuration_value_never_reaches_a_recommendation(tmp_path, capsys, batch) -> None:
    """Issue 61: a record's batch size of -4 became "RECOMMENDED batch_size=-4" with its command line. Such a run's
    figures are rejected (joulebench.figures: the knobs' config values are positive whole numbers), and it is left
    out, named."""
    write_point(tmp_path, "bs1-a", DEFAULT, FASTER)
    write_point(tmp_path, "bs1-b", DEFAULT, (FASTER[0], FASTER[1] * 1.002))
    write_point(tmp_path, "bs8", DEFAULT, (FASTER[0] * 1.01, 0.60), batch_size=8)
    write_point(tmp_path, "impossible", DEFAULT, (FASTER[0], 0.2), batch_size=batch)
    out = run_recommend(capsys, str(tmp_path), "--default", "batch_size=1", "--max-slowdown", "15%")
    assert f"batch_size={batch}" not in out.split("left out")[0] and f"--batch-size {batch}" not in out
    assert "recommended (PREDICTED from the sweep, not re-measured): batch_size=8" in out
    assert "left out: run impossible: figures rejected: config batch_size " in out


def test_a_sweep_left_with_the_default_alone_after_the_semantic_filter_is_too_few_settings(tmp_path, capsys) -> None:
    """Issue 61: "no setting saves energy" was said where the only other setting changes what is computed."""
    write_point(tmp_path, "default", DEFAULT, FASTER)
    write_point(tmp_path, "fp8", DEFAULT, (1.0e-3, 0.30), precision="fp8")
    assert joulebench_main(["recommend", str(tmp_path), "--default", "precision=bf16"]) == 64
    err = capsys.readouterr().err
    assert "too few settings to choose from: only the default is left once the settings that change what is " \
           "computed are left out (1 left out, above)" in err
    assert "joulebench recommend: left out: setting precision=fp8: changes what is computed" in err
