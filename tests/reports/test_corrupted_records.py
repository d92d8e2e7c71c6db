"""Analysis never believes an impossible number: real run records and profiles, one figure corrupted at random.

Sources: the records the drivers wrote in benchmarks/results (2026-11-25-session9 lifecycle: llm_training,
llm_inference, resnet50 on an H100) and tests/reports/data (resnet50 on CPU at three batch sizes), the clock sweep
of test_pareto and the attributed clock sweep of test_plan. One figure a verb reads (a window edge or step, the
steady work, a window's energy, power, coverage or bound, a headline metric, a batch size or device count) becomes
0, negative, NaN, infinite, text, a fraction above 1, an edge before its start, or a unit mix-up (Wh × 3600, rates,
W and J per unit × 1000), or the steady window the headline figures come from is removed. Every verb that reads it
must then: exit 0 or with a documented error code (64, 65), never 70 or a traceback; show the run flagged with the
reason; and never rank it, diagnose with it, put it on a front or plan on it. The blocks beside the figures,
`disturbed` and `energy_domain`, take any JSON value: a wrong type is a FormatError naming the field, never an
internal error.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from joulebench.analysis import pareto, plan
from joulebench.analysis.cli import main as joulebench_main
from joulebench.analysis.report import extreme_pair, load_runs, table_rows
from joulebench.figures import REJECTED, rejection
from joulebench.record import RunRecord, read_run_record
from jpwr import FormatError
from tests.jube.test_record_fields import jbrecord

from .test_pareto import WORKLOADS, write_sweep
from .test_plan import KNOWN, STEP_PHASES, write_attributed_run

REPO = Path(__file__).resolve().parents[2]
LIFECYCLE = REPO / "benchmarks" / "results" / "2026-11-25-session9" / "lifecycle" / "new"
CPU_REPLAY = REPO / "tests" / "reports" / "data" / "resnet50_cpu_replay"
DOCUMENTED_ERRORS = (64, 65)  # ValidationError, FormatError
# The headline figures the verbs read from `metrics` (report and JUBE table columns, --pareto, the diagnosis).
METRICS = ("iterations", "duration_s", "time_per_iteration_s", "{unit}_per_s", "{unit}_per_s_per_device",
           "{unit}_per_wh", "energy_wh", "mean_power_w_per_device", "mfu", "model_tflops_per_device", "devices",
           "global_batch_size", "decode_energy_per_token_j", "energy_per_output_token_j", "requests_per_s",
           "ttft_median_s")
ZERO_ALLOWED_METRICS = ("energy_error_bound_j",)
# The headline figures derived from the steady window alone, checked against it: each gets a unit mix-up.
UNIT_METRICS = ("energy_wh", "{unit}_per_s", "{unit}_per_wh", "mean_power_w_per_device", "duration_s",
                "time_per_iteration_s", "energy_per_output_token_j", "energy_per_request_j")

NOT_POSITIVE = st.one_of(st.sampled_from([0, 0.0, -0.0, -1, math.nan, math.inf, -math.inf, "12.5 J", True]),
                         st.floats(max_value=0, allow_nan=False), st.integers(max_value=0))
NEGATIVE = st.one_of(st.sampled_from([math.nan, math.inf, -math.inf, "0", [], False]),
                     st.floats(max_value=-1e-9, allow_nan=False), st.integers(max_value=-1))
ABOVE_ONE = st.one_of(NEGATIVE, st.floats(min_value=1.0001, max_value=1e9))


def figure_fields(data: dict[str, Any]) -> list[tuple[tuple[Any, ...], str]]:
    """(JSON path, kind) of every figure present in a record that a verb reads."""
    fields: list[tuple[tuple[Any, ...], str]] = []
    for i, window in enumerate(data.get("windows", [])):
        fields += [(("windows", i, "t_start_ns"), "zero_allowed"), (("windows", i, "t_end_ns"), "edge"),
                   (("windows", i, "first_step"), "zero_allowed"), (("windows", i, "last_step"), "step")]
        if window["name"] == "steady":
            fields += [(("windows", i, "work", unit), "positive") for unit in window.get("work", {})]
        energy = window.get("energy") or {}
        kinds = {"energy_j": "positive", "mean_power_w": "positive", "coverage": "fraction",
                 "error_bound_j": "zero_allowed"}
        fields += [(("windows", i, "energy", key), kind) for key, kind in kinds.items() if energy.get(key) is not None]
    metrics = data.get("metrics", {})
    unit = metrics.get("work_unit") or ("images" if data["benchmark"] == "resnet50" else "tokens")
    fields += [(("metrics", key.format(unit=unit)), "positive") for key in METRICS
               if metrics.get(key.format(unit=unit)) is not None]
    fields += [(("metrics", key), "zero_allowed") for key in ZERO_ALLOWED_METRICS if metrics.get(key) is not None]
    if metrics.get("energy_coverage") is not None:
        fields.append((("metrics", "energy_coverage"), "fraction"))
    fields += [(("metrics", name), "units") for key in UNIT_METRICS if metrics.get(name := key.format(unit=unit))]
    fields += [(("windows", i), "gone") for i, window in enumerate(data.get("windows", []))
               if window["name"] == "steady"]
    fields += [((block, key), "positive") for block, key in (("config", "global_batch_size"), ("config", "devices"),
                                                            ("config", "per_device_batch_size"),
                                                            ("hardware", "devices"))
               if data.get(block, {}).get(key) is not None]
    return fields


def _get(data: Any, path: tuple[Any, ...]) -> Any:
    for key in path:
        data = data[key]
    return data


@st.composite
def corruption(draw, data: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """A deep copy of `data` with one figure made impossible, and what was done."""
    path, kind = draw(st.sampled_from(figure_fields(data)))
    bad = json.loads(json.dumps(data))
    parent, key = _get(bad, path[:-1]), path[-1]
    if kind == "gone":
        del parent[key]
        return bad, f"{'.'.join(map(str, path))} (the steady window) removed"
    if kind == "edge":
        value = parent["t_start_ns"] - draw(st.integers(0, 10**12))
    elif kind == "step":
        value = parent["first_step"] - draw(st.integers(1, 10**6))
    elif kind == "units":
        value = parent[key] * draw(st.sampled_from([3600, 1 / 3600, 1000, 1e-3]))
    else:
        value = draw({"positive": NOT_POSITIVE, "zero_allowed": NEGATIVE, "fraction": ABOVE_ONE}[kind])
    parent[key] = value
    return bad, f"{'.'.join(map(str, path))} = {value!r}"


def run(argv: list[str]) -> tuple[int, str]:
    """A verb through the command line's error boundary: its exit code and everything it printed."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = joulebench_main(argv)
    text = out.getvalue() + err.getvalue()
    assert "Traceback" not in text and "internal error" not in text, text
    return code, text


# ---- records: report, --compare, --pareto, attribute, the JUBE table -----------------------------------------------
@pytest.fixture(scope="module")
def groups(tmp_path_factory) -> tuple[Path, dict[str, list[Path]]]:
    """Directories of records that belong together, each record also kept pristine under `pristine/`."""
    root = tmp_path_factory.mktemp("records")
    write_sweep(root / "sweep", WORKLOADS["memory-bound"])
    for source, name in ((LIFECYCLE, "lifecycle"), (CPU_REPLAY, "cpu")):
        for record in sorted(source.rglob("run_record.json")):
            target = root / name / record.relative_to(source)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(record, target)
    found = {name: sorted((root / name).rglob("run_record.json")) for name in ("sweep", "lifecycle", "cpu")}
    for paths in found.values():
        for path in paths:
            assert rejection(read_run_record(path)) is None, path  # the real records pass as they are
            keep = root / "pristine" / path.relative_to(root)
            keep.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, keep)
    return root, found


def _check_report(group: list[Path], run_id: str, what: str) -> None:
    runs = load_runs(group)
    pair = extreme_pair(runs)
    assert pair is None or run_id not in {r.record.run_id for r in pair}, what
    row = next(r for r in table_rows(runs) if r["run_id"] == run_id)
    assert row["note"].startswith("figures rejected: ") and row["J per unit"] == REJECTED, what
    target = next(r for r in runs if r.record.run_id == run_id)
    assert target.cost.energy_per_unit_j is None and target.metric("mean_power_w_per_device") is None, what


def _check_pareto(directory: Path, run_id: str, what: str) -> None:
    code, text = run(["report", "--pareto", str(directory)])
    assert code in (0, *DOCUMENTED_ERRORS), (what, text)
    if code == 0:
        assert f"excluded (energy not trustworthy): run {run_id} " in text and "figures rejected" in text, what
        points = pareto.sweep_points(load_runs([directory]))
        base = pareto.baseline(points)
        best = pareto.waste_free(points, base, 0.01)
        assert run_id not in {p.name for p in pareto.pareto_front(points)}, what
        assert best is None or best.name != run_id, what
        assert run_id not in base.runs, what


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(choice=st.data())
def test_a_corrupted_record_is_flagged_and_never_ranked(groups, choice) -> None:
    root, found = groups
    name = choice.draw(st.sampled_from(sorted(found)))
    path = choice.draw(st.sampled_from(found[name]))
    original = path.read_text()
    bad, what = choice.draw(corruption(json.loads(original)))
    run_id = bad["run_id"]
    try:
        path.write_text(json.dumps(bad))
        record = RunRecord.from_dict(bad)
        assert rejection(record) is not None, what  # the one check sees every corruption
        _check_report(found[name], run_id, what)
        code, text = run(["report", "--compare", str(root / "pristine" / path.relative_to(root)), str(path)])
        assert code == 0 and "n/a (figures rejected: " in text, (what, text)
        if name == "sweep":
            _check_pareto(path.parents[1], run_id, what)
        fields = jbrecord.table_fields(read_run_record(path), {})
        assert fields["energy_wh"] == REJECTED and "figures rejected: " in fields["note"], what
        assert jbrecord.main(["fields", str(path)]) == 0
        code, text = run(["attribute", str(path), "--no-write"])
        assert code == 65 and "figures rejected" in text, (what, text)
    finally:
        path.write_text(original)


def test_the_report_flags_a_rejected_run_and_leaves_it_out_of_charts_and_diagnoses(groups, tmp_path) -> None:
    """The whole `joulebench report -o`: an energy of 0 J would be the cheapest run; it is named, not chosen."""
    path = groups[1]["cpu"][0]
    original = path.read_text()
    bad = json.loads(original)
    steady = next(w for w in bad["windows"] if w["name"] == "steady")
    steady["energy"]["energy_j"] = 0.0
    try:
        path.write_text(json.dumps(bad))
        code, text = run(["report", str(path.parents[1]), "-o", str(tmp_path / "out")])
        assert code == 0, text
        data = json.loads((tmp_path / "out" / "runs.json").read_text())
        row = next(r for r in data["rows"] if r["run_id"] == bad["run_id"])
        assert row["per Wh"] == REJECTED and "window 'steady' energy_j 0 is not positive" in row["note"]
        assert data["diagnoses"] and all(bad["run_id"] not in d["title"] for d in data["diagnoses"])
    finally:
        path.write_text(original)


def test_the_jube_compare_step_leaves_a_rejected_run_out(groups, tmp_path) -> None:
    """jbrecord.py compare (slowdown and saving per sweep point) reads the sweep as --pareto does."""
    jbsettings = sys.modules["jbsettings"]  # loaded with jbrecord
    for number, path in enumerate(groups[1]["sweep"]):
        work = tmp_path / f"{number:06d}_submit" / "work"
        (work / "run").mkdir(parents=True)
        data = json.loads(path.read_text())
        if data["run_id"] == "clock-1680":  # the waste-free point while its figures are intact
            data["windows"][0]["energy"]["energy_j"] = -1.0
        (work / "run" / "run_record.json").write_text(json.dumps(data))
        jbsettings.write_settings(work / "job.env", {"JB_OUT_DIR": str(work / "run"), "JB_RUN_ID": data["run_id"],
                                                     "JB_SYSTEM": "CI", "JB_MODEL": "tiny", "JB_SWEEP": "sm_clock"})
    rows = jbrecord.compare(tmp_path)
    assert rows["clock-1680"] == {"slowdown": "n/a", "energy_saving": "n/a"}
    assert rows["clock-1830"]["energy_saving"].startswith("+") and rows["default"]["slowdown"] == "+0.00%"


# ---- plan: attributed records and profile files --------------------------------------------------------------------
@pytest.fixture(scope="module")
def attributed(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("plan")
    for clock in (None, 1410, 1110):
        write_attributed_run(root / "runs", f"sm-{clock or 'default'}", clock,
                             {p: KNOWN[p][clock] for p in STEP_PHASES})
    profile = root / "profile.json"
    assert joulebench_main(["plan", str(root / "runs"), "--write-profile", str(profile)]) == 0
    return root / "runs", profile


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(choice=st.data())
def test_a_corrupted_figure_is_never_planned_on(attributed, choice) -> None:
    runs, profile = attributed
    source = choice.draw(st.sampled_from(["record", "phase", "profile"]))
    target = profile if source == "profile" else choice.draw(st.sampled_from(sorted(runs.rglob("run_record.json"))))
    original = target.read_text()
    data = json.loads(original)
    if source == "record":
        bad, what = choice.draw(corruption(data))
    else:
        bad = json.loads(original)
        entries = bad["points"] if source == "profile" else bad["attribution"]["estimators"]["fit"]["rows"]
        number = choice.draw(st.integers(0, len(entries) - 1))
        key = choice.draw(st.sampled_from(["time_s", "energy_j"] if source == "profile" else
                                          ["energy_per_step_j", "seconds_per_step", "mean_power_w"]))
        entries[number][key] = choice.draw(NOT_POSITIVE)
        what = f"{source} {number} {key} = {entries[number][key]!r}"
    try:
        target.write_text(json.dumps(bad))
        if source == "profile":
            code, text = run(["plan", "--profile", str(target)])
            assert code == 65 and f"point {number + 1}" in text, (what, text)
            return
        code, text = run(["plan", str(runs)])
        assert code in (0, *DOCUMENTED_ERRORS), (what, text)
        run_id = bad["run_id"]
        built = plan.profile_from_records([runs], "fit")
        used = {s for by_clock in built.options.values() for option in by_clock.values() for s in option.sources}
        assert f"run {run_id}" not in used, what
        assert any(reason.startswith(f"run {run_id}: ") for reason in built.excluded), what
        if code == 0:
            assert f"left out: run {run_id}: " in text, (what, text)
    finally:
        target.write_text(original)


# ---- the cases, by name ------------------------------------------------------------------------------------
@pytest.mark.parametrize("energy_j", [0.0, -5.0, math.nan, math.inf])
def test_an_impossible_steady_energy_is_not_the_waste_free_point(groups, energy_j) -> None:
    """Issue 32: a run with 0, negative, NaN or infinite energy was called cheapest, "−100 % energy"."""
    _, found = groups
    path = next(p for p in found["sweep"] if p.parent.name == "clock-780")
    original = path.read_text()
    bad = json.loads(original)
    bad["windows"][0]["energy"]["energy_j"] = energy_j
    try:
        path.write_text(json.dumps(bad))
        code, text = run(["report", "--pareto", str(path.parents[1])])
        assert code == 0, text
        assert "(run clock-780)" not in text and "-100.00 %" not in text
        assert f"run clock-780 (780 MHz): figures rejected: window 'steady' energy_j {energy_j:g} is not" in text
    finally:
        path.write_text(original)


@pytest.mark.parametrize(("time_s", "energy_j", "problem"), [(0, 0, "time_s 0 is not positive; energy_j 0 is not"),
                                                             (0.3, -1, "energy_j -1 is not positive"),
                                                             ("NaN", 100, "time_s nan is not finite")])
def test_a_profile_point_that_cannot_be_planned_on_is_refused_naming_it(tmp_path, time_s, energy_j, problem) -> None:
    """Issue 32: a zero-time point made `plan` promise "0 s, 0 J"."""
    profile = tmp_path / "clocks.csv"
    profile.write_text("phase,clock,time_s,energy_j\nforward,default,0.3,100\n"
                       f"forward,1410,{time_s},{energy_j}\n")
    code, text = run(["plan", "--profile", str(profile)])
    assert code == 65
    assert f"joulebench plan: error: {profile} point 2 cannot be planned on: {problem}" in text
    assert "Fix: give every point a positive, finite time_s and energy_j per step" in text


def test_the_check_names_an_edited_figure_a_missing_window_and_a_power_below_idle(groups) -> None:
    """Issue 32 (A16-A18, A23): tokens/Wh × 10, W per device / 10, headline figures without their steady window
    and a steady window of 1 J over ~50 s beside a 124 W idle baseline were shown, plotted and compared."""
    data = json.loads(next(p for p in groups[1]["lifecycle"] if "llm_training" in p.parts).read_text())

    def rejected(edit) -> str:
        bad = json.loads(json.dumps(data))
        edit(bad)
        return rejection(RunRecord.from_dict(bad)) or ""

    metrics = data["metrics"]
    assert f"tokens_per_wh {10 * metrics['tokens_per_wh']:g} is inconsistent with the window's" in rejected(
        lambda d: d["metrics"].update(tokens_per_wh=10 * metrics["tokens_per_wh"]))
    assert "mean_power_w_per_device" in rejected(
        lambda d: d["metrics"].update(mean_power_w_per_device=metrics["mean_power_w_per_device"] / 10))
    assert "time_per_iteration_s" in rejected(
        lambda d: d["metrics"].update(time_per_iteration_s=2 * metrics["time_per_iteration_s"]))
    assert rejected(lambda d: d.update(windows=[w for w in d["windows"] if w["name"] != "steady"])).startswith(
        "figures rejected: no steady window to check duration_s, time_per_iteration_s, tokens_per_s")

    steady = next(w for w in data["windows"] if w["name"] == "steady")
    seconds = (steady["t_end_ns"] - steady["t_start_ns"]) / 1e9

    def starve(d: dict[str, Any]) -> None:
        """1 J over the window, the headline figures following it as a driver's would."""
        energy = next(w for w in d["windows"] if w["name"] == "steady")["energy"]
        energy.update(energy_j=1.0, error_bound_j=1.0, mean_power_w=1.0 / seconds)
        d["metrics"].update(energy_wh=1.0 / 3600, tokens_per_wh=steady["work"]["tokens"] * 3600,
                            mean_power_w_per_device=1.0 / seconds)

    idle = data["meter"]["idle_baseline"]["power_w"]
    assert f"steady power {1.0 / seconds:.4g} W below a tenth of the idle baseline {idle:.4g} W" in rejected(starve)


def test_an_idle_baseline_without_power_is_no_baseline_to_check_against(groups) -> None:
    """An idle baseline whose power is null (unread) on the window's devices raised a TypeError in the below-idle
    check (found by mypy): it is no baseline, so the check has nothing to compare, and the record stays usable."""
    data = json.loads(next(p for p in groups[1]["lifecycle"] if "llm_training" in p.parts).read_text())
    steady = next(w for w in data["windows"] if w["name"] == "steady")
    assert data["meter"]["idle_baseline"]["devices"] == steady["energy"]["devices"]  # the check compares them
    assert rejection(RunRecord.from_dict(data)) is None
    data["meter"]["idle_baseline"]["power_w"] = None
    assert rejection(RunRecord.from_dict(data)) is None


def test_the_check_names_disordered_edges_and_mixed_units(groups) -> None:
    data = json.loads(groups[1]["lifecycle"][0].read_text())
    steady = next(w for w in data["windows"] if w["name"] == "steady")
    edges = json.loads(json.dumps(data))
    next(w for w in edges["windows"] if w["name"] == "steady")["t_end_ns"] = steady["t_start_ns"]
    assert rejection(RunRecord.from_dict(edges)) == (
        f"figures rejected: window 'steady' ends (t_end_ns {steady['t_start_ns']}) before it starts "
        f"(t_start_ns {steady['t_start_ns']})")
    kwh = json.loads(json.dumps(data))
    kwh["metrics"]["energy_wh"] /= 1000
    assert "energy_wh" in rejection(RunRecord.from_dict(kwh)) and "units mixed up or edited" in rejection(
        RunRecord.from_dict(kwh))


# ---- the blocks beside the figures: `disturbed` and `energy_domain` of any JSON shape ------------------------------
TEXTS = st.sampled_from(["step-time spread: CV 57%", "", "yes"])
ANY_JSON = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), TEXTS, st.lists(TEXTS, max_size=2),
                     st.dictionaries(TEXTS, st.integers(), max_size=2))
DISTURBED = st.one_of(ANY_JSON, st.fixed_dictionaries({"disturbed": ANY_JSON},
                                                      optional={"reasons": ANY_JSON, "checks": ANY_JSON}))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(choice=st.data())
def test_a_corrupted_disturbed_or_energy_domain_field_is_named_never_an_internal_error(groups, choice) -> None:
    """A record whose `disturbed` or `energy_domain` has a wrong type is a FormatError naming the field or, where its
    types are right, read as it is: `--compare` exits 0 or with a documented error, never 70, and the JUBE table's
    fields are made."""
    root, found = groups
    path = choice.draw(st.sampled_from(found["lifecycle"]))
    original = path.read_text()
    bad = json.loads(original)
    field = choice.draw(st.sampled_from(["disturbed", "energy_domain"]))
    bad[field] = choice.draw(DISTURBED if field == "disturbed" else ANY_JSON)
    try:
        path.write_text(json.dumps(bad))
        code, text = run(["report", "--compare", str(root / "pristine" / path.relative_to(root)), str(path)])
        assert code in (0, *DOCUMENTED_ERRORS), (field, bad[field], text)
        assert code == 0 or field in text or "energy domains" in text, (field, bad[field], text)
        try:
            record = read_run_record(path)
        except FormatError as exc:
            assert f"{field}" in str(exc), (bad[field], exc)
        else:
            fields = jbrecord.table_fields(record, {})
            said = field == "disturbed" and isinstance(bad[field], dict) and bad[field].get("disturbed") is True
            assert ("disturbed: " in fields["note"]) == said, (bad[field], fields["note"])
    finally:
        path.write_text(original)
