"""Issue 47 item 3: real run records with their SHAPE changed (an object where a list belongs, a list where an object
belongs, null where a text or a number belongs, a text where a number belongs, a key removed, the JSON truncated),
fixed seeds,
through every analysis verb: never an internal error (exit 70) or a traceback; either a refusal naming the file (exit
64/65) or a rejected row / a left-out run saying why.

The records: three shipped drivers' records (resnet50, llm_training, llm_inference; benchmarks/results), a shipped
serving sweep (two rates with their request tables and traces), and a clock sweep written through the production
writer with the attribution block `joulebench plan` reads (no shipped record has one) and a power/clock sweep with
energy for `report --pareto` (tests/reports/test_pareto.py's model). The verbs run in-process
through the command line's error boundary (joulebench.analysis.cli.main); the full `report -o` (charts, HTML) and
`plan` also once each as a subprocess.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from joulebench.analysis.cli import main as joulebench_main
from joulebench.analysis.report import load_runs, table_rows
from joulebench.analysis.serving import serving_groups
from tests.reports.test_pareto import WORKLOADS, write_sweep
from tests.reports.test_plan import KNOWN, STEP_PHASES, write_attributed_run

REPO = Path(__file__).resolve().parents[2]
SOURCES = {  # group -> shipped directory of records that belong together
    "drivers": REPO / "benchmarks" / "results" / "2026-11-25-session9" / "lifecycle" / "new",
    "serving": REPO / "benchmarks" / "results" / "2026-11-25-session10" / "serving-final" / "sweep",
}
SEED = 47
CASES = 40  # mutations through the in-process verbs (about 0.5 s each on one core)
REFUSED = (64, 65)  # ValidationError, FormatError
REJECTED_NOTES = ("record unreadable: ", "figures rejected: ")
MUTATIONS = ("object where a list belongs", "list where an object belongs", "null where a text belongs",
             "text where a number belongs", "null where a number belongs", "missing key", "truncated JSON")


# ---- the mutations --------------------------------------------------------------------------------------------
def _applies(kind: str, node: Any, path: tuple[Any, ...]) -> bool:
    return {"object where a list belongs": isinstance(node, list),
            "list where an object belongs": isinstance(node, dict) and bool(path),
            "null where a text belongs": isinstance(node, str),
            "text where a number belongs": isinstance(node, int | float) and not isinstance(node, bool),
            "null where a number belongs": isinstance(node, int | float) and not isinstance(node, bool),
            "missing key": bool(path) and isinstance(path[-1], str)}[kind]


def _children(node: Any) -> list[tuple[Any, Any]]:
    if isinstance(node, dict):
        return list(node.items())
    return list(enumerate(node)) if isinstance(node, list) else []


def _pick(data: Any, kind: str, rng: random.Random) -> tuple[Any, ...]:
    """A random walk from the top: stops at a node the mutation applies to with probability 0.25 (so that the
    top-level blocks are chosen as often as the leaves deep inside them)."""
    for _ in range(1000):
        node, path = data, ()
        while True:
            children = _children(node)
            if _applies(kind, node, path) and (not children or rng.random() < 0.25):
                return path
            if not children:
                break
            key, node = rng.choice(children)
            path = (*path, key)
    raise AssertionError(f"no place for {kind!r}")


def mutate(text: str, rng: random.Random) -> tuple[str, str]:
    """The record's text with one change of shape, and what was done."""
    kind = rng.choice(MUTATIONS)
    if kind == "truncated JSON":
        cut = rng.randrange(1, len(text))
        return text[:cut], f"truncated at byte {cut}"
    data = json.loads(text)
    path = _pick(data, kind, rng)
    parent = data
    for key in path[:-1]:
        parent = parent[key]
    node = parent[path[-1]] if path else data
    replaced = {"object where a list belongs": lambda: {str(i): v for i, v in enumerate(node)},
                "list where an object belongs": lambda: list(node.values()),
                "null where a text belongs": lambda: None,
                "null where a number belongs": lambda: None,
                "text where a number belongs": lambda: f"{node} J"}
    if kind == "missing key":
        del parent[path[-1]]
    else:
        parent[path[-1]] = replaced[kind]()
    return json.dumps(data), f"{kind} at {'.'.join(map(str, path))}"


# ---- the records ----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def groups(tmp_path_factory) -> dict[str, list[Path]]:
    """Each group's records in a directory of its own, copied once (each test restores what it changed)."""
    root = tmp_path_factory.mktemp("mutations")
    for name, source in SOURCES.items():
        shutil.copytree(source, root / name)
    for clock in (None, 1410, 1110):
        write_attributed_run(root / "clocks", f"sm-{clock or 'default'}", clock,
                             {p: KNOWN[p][clock] for p in STEP_PHASES})
    write_sweep(root / "sweep", WORKLOADS["memory-bound"])
    return {name: sorted((root / name).rglob("run_record.json")) for name in (*SOURCES, "clocks", "sweep")}


def run(argv: list[str]) -> tuple[int, str]:
    """A verb through the command line's error boundary: its exit code and everything it printed."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        code = joulebench_main(argv)
    return code, out.getvalue()


def check(argv: list[str], path: Path, run_id: str, what: str) -> int:
    code, text = run(argv)
    assert code != 70 and "Traceback" not in text and "internal error" not in text, (what, argv, text)
    assert code in (0, *REFUSED), (what, argv, text)
    if code in REFUSED:  # the refusal names the file (or its run directory), or the run it left out
        assert str(path.parent) in text or f"run {run_id}" in text, (what, argv, text)
    return code


def check_report(path: Path, what: str) -> None:
    """What `report` reads and tabulates: the mutated record a rejected row saying why, or a usable row."""
    directory = path.parents[1] if path.parent.name == "run" else path.parent.parent
    try:
        runs = load_runs([directory])
    except Exception as exc:  # only a documented refusal of the one record, naming it
        assert getattr(exc, "exit_code", None) in REFUSED and str(path) in str(exc), (what, exc)
        return
    table_rows(runs)
    serving_groups(runs)
    mine = next(r for r in runs if r.path == path)
    if mine.rejected:
        assert mine.rejected.startswith(REJECTED_NOTES), (what, mine.rejected)
        assert mine.unreadable is None or str(path) in mine.rejected, (what, mine.rejected)


@pytest.mark.parametrize("case", range(CASES))
def test_a_record_in_another_shape_is_refused_or_rejected_by_every_verb_naming_why(groups, case) -> None:
    rng = random.Random(SEED * 1000 + case)
    name = sorted(groups)[case % len(groups)]
    path = rng.choice(groups[name])
    original = path.read_text()
    text, what = mutate(original, rng)
    pristine = path.with_name("pristine.json")
    try:
        pristine.write_text(original)
        path.write_text(text)
        check_report(path, what)
        run_id = json.loads(original)["run_id"]
        check(["report", "--compare", str(pristine), str(path)], path, run_id, what)
        check(["report", "--compare", str(path), str(pristine)], path, run_id, what)
        check(["attribute", str(path.parent), "--no-write", "--bootstrap", "20"], path, run_id, what)
        if name == "clocks":
            check(["plan", str(path.parents[1])], path, run_id, what)
        if name == "sweep":
            check(["report", "--pareto", str(path.parents[1])], path, run_id, what)
    finally:
        path.write_text(original)
        pristine.unlink()


def _subprocess(argv: list[str]) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(REPO), os.environ.get("PYTHONPATH"))))}
    return subprocess.run([sys.executable, "-m", "joulebench", *argv], capture_output=True, text=True, env=env,
                          timeout=120, check=False)


def test_the_command_line_writes_the_report_beside_two_records_in_another_shape(groups, tmp_path) -> None:
    """One shipped record a list where its `metrics` object belongs, another truncated: `joulebench report -o` exits
    0 with the good record's row, and each bad one a rejected row naming why."""
    runs = tmp_path / "runs"
    for path in groups["drivers"]:
        target = runs / path.relative_to(path.parents[2])
        target.parent.mkdir(parents=True)
        shutil.copyfile(path, target)
    listed, truncated, good = sorted(runs.rglob("run_record.json"))
    data = json.loads(listed.read_text())
    data["metrics"] = list(data["metrics"].values())
    listed.write_text(json.dumps(data))
    truncated.write_text(truncated.read_text()[:200])
    result = _subprocess(["report", str(runs), "-o", str(tmp_path / "out")])
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    rows = {row["note"].split(". Fix:")[0]: row for row in json.loads((tmp_path / "out" / "runs.json").read_text())
            ["rows"]}
    notes = sorted(rows)
    assert any(n.startswith("record unreadable: metrics is [") and n.endswith("not an object") for n in notes), notes
    assert any(n.startswith(f"record unreadable: {truncated} is not readable JSON") for n in notes), notes
    assert json.loads(good.read_text())["run_id"] in {row["run_id"] for row in rows.values()}


def test_the_command_line_plan_leaves_out_a_run_whose_attribution_is_in_another_shape(groups, tmp_path) -> None:
    sweep = tmp_path / "clocks"
    for path in groups["clocks"]:
        shutil.copytree(path.parent, sweep / path.parent.name)
    bad = sweep / "sm-1110" / "run_record.json"
    data = json.loads(bad.read_text())
    data["attribution"]["estimators"]["fit"]["rows"] = {"forward": data["attribution"]["estimators"]["fit"]["rows"]}
    bad.write_text(json.dumps(data))
    result = _subprocess(["plan", str(sweep)])
    assert result.returncode == 0, result.stderr
    assert "left out: run sm-1110: attribution.estimators.fit.rows is not a list of objects" in result.stdout


@pytest.mark.parametrize(("field", "value", "named"), [
    (("windows", 0, "t_start_ns"), None, "windows[0].t_start_ns is None, not a number"),
    (("windows", 1, "energy", "devices"), None, "windows[1].energy.devices is None, not a number"),
    (("metrics", "decode_energy_j"), "19692 J", "decode_energy_j '19692 J' is not a number"),
    (("metrics", "prefill_energy_error_bound_j"), [], "prefill_energy_error_bound_j [] is not a number"),
])
def test_attribute_refuses_what_its_split_would_compute_with_naming_the_field(groups, tmp_path, field, value,
                                                                              named) -> None:
    """Found by probing every number of the shipped inference record: these ended in exit 70 inside attribute."""
    (source,) = [p for p in groups["drivers"] if p.parent.parent.name == "llm_inference"]
    run_dir = tmp_path / "run"
    shutil.copytree(source.parent, run_dir)
    data = json.loads(source.read_text())
    parent = data
    for key in field[:-1]:
        parent = parent[key]
    parent[field[-1]] = value
    (run_dir / "run_record.json").write_text(json.dumps(data))
    code, text = run(["attribute", str(run_dir), "--no-write"])
    assert code == 65 and named in text and str(run_dir) in text and "internal error" not in text, text
