"""Issue 61, named cases of the record reader (joulebench.record.parse_record): a steady window whose energy is null or
missing gives n/a in every energy-derived column, with the reason; two windows of one name and an energy domain no
meter writes are refused naming the field; a load record whose offered rate is a word is rejected with the reason.

Each case is a shipped record (benchmarks/results) with one field changed, read through `joulebench report -o`,
`report --pareto` and the serving section as a user runs them (in-process, through the command line's boundary).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from joulebench.analysis.cli import main as joulebench_main
from tests.reports.test_pareto import WORKLOADS, write_sweep

REPO = Path(__file__).resolve().parents[2]
TRAINING = REPO / "benchmarks/results/2026-11-25-session9/lifecycle/new/llm_training/run/run_record.json"
SERVING = REPO / "benchmarks/results/2026-11-25-session10/serving-final/sweep"
ENERGY_COLUMNS = ("per Wh", "J per unit", "mean W per device", "method", "energy domain", "coverage %", "bound J")


def run(argv: list[str]) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        code = joulebench_main(argv)
    return code, out.getvalue()


def steady(data: dict[str, Any]) -> dict[str, Any]:
    return next(w for w in data["windows"] if w["name"] == "steady")


def changed(tmp_path: Path, name: str, change) -> Path:
    """The shipped training record with `change` applied, in a run directory of its own."""
    data = json.loads(TRAINING.read_text())
    change(data)
    path = tmp_path / name / "run_record.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(data))
    return path.parent


def report_rows(tmp_path: Path, *paths: Path) -> list[dict[str, str]]:
    out = tmp_path / "out"
    code, text = run(["report", *map(str, paths), "-o", str(out)])
    assert code == 0 and "Traceback" not in text, text
    return json.loads((out / "runs.json").read_text())["rows"]


@pytest.mark.parametrize("how", ["null", "missing"])
def test_a_steady_window_without_energy_leaves_every_energy_column_na_with_the_reason(tmp_path, how) -> None:
    """The metrics still say 9.5 Wh and 692 W; the window they come from has no energy: none of it is shown."""
    def drop(data: dict[str, Any]) -> None:
        if how == "null":
            steady(data)["energy"] = None
        else:
            del steady(data)["energy"]

    original = json.loads(TRAINING.read_text())["metrics"]
    assert original["energy_wh"] and original["mean_power_w_per_device"] and original["energy_coverage"]
    (row,) = report_rows(tmp_path, changed(tmp_path, how, drop))
    assert {column: row[column] for column in ENERGY_COLUMNS} == dict.fromkeys(ENERGY_COLUMNS, "n/a")
    assert row["per s"] != "n/a"  # the work and time of the window stand
    assert "energy n/a: the steady window's energy is missing from the record" in row["note"]


def test_a_second_steady_window_is_rejected_naming_it_in_report_and_pareto(tmp_path) -> None:
    def twice(data: dict[str, Any]) -> None:
        data["windows"].append(dict(steady(data)))

    good = changed(tmp_path, "good", lambda data: None)
    rows = report_rows(tmp_path, changed(tmp_path, "twice", twice), good)
    rejected = next(r for r in rows if "twice" in r["note"])
    assert rejected["per Wh"] == "rejected"
    assert "is a second 'steady' window (the first is windows[" in rejected["note"]
    assert next(r for r in rows if r is not rejected)["per Wh"] != "rejected"

    sweep = tmp_path / "sweep"
    write_sweep(sweep, WORKLOADS["memory-bound"])
    path = sweep / "clock-1230" / "run_record.json"
    data = json.loads(path.read_text())
    twice(data)
    path.write_text(json.dumps(data))
    code, text = run(["report", "--pareto", str(sweep)])
    assert code == 0, text
    excluded = " ".join(text[text.index("excluded (energy not trustworthy): run clock-1230"):].split())
    assert "is a second 'steady' window" in excluded


def test_an_unknown_energy_domain_is_refused_naming_the_field_and_the_known_ones(tmp_path) -> None:
    from jpwr.energy import HEADLINE_DOMAINS

    directory = changed(tmp_path, "bananas", lambda data: data.update(energy_domain="bananas"))
    code, text = run(["report", str(directory), "-o", str(tmp_path / "out")])
    assert code == 64, text  # the only record: nothing to report, the refusal names the file and the field
    assert str(directory) in text and "energy_domain 'bananas' is not a known energy domain" in text
    assert all(repr(domain) in text for domain in HEADLINE_DOMAINS)
    window = changed(tmp_path, "window-bananas", lambda data: steady(data)["energy"].update(domain="bananas"))
    rows = report_rows(tmp_path, window, changed(tmp_path, "ok", lambda data: None))
    row = next(r for r in rows if "window-bananas" in r["note"])
    assert row["per Wh"] == "rejected" and ".energy.domain 'bananas' is not a known energy domain" in row["note"]


def test_a_load_record_whose_offered_rate_is_a_word_is_rejected_with_the_reason(tmp_path) -> None:
    sweep = tmp_path / "sweep"
    shutil.copytree(SERVING, sweep)
    path = sweep / "rate_8" / "run_record.json"
    data = json.loads(path.read_text())
    data["metrics"]["rate"] = "fast"
    path.write_text(json.dumps(data))
    out = tmp_path / "out"
    code, text = run(["report", str(sweep), "-o", str(out)])
    assert code == 0 and "Traceback" not in text, text
    written = json.loads((out / "runs.json").read_text())
    (row,) = [r for section in written["serving"] for r in section["rows"] if r["run_id"] == data["run_id"]]
    assert row["offered req/s"] == row["J/request p50"] == "rejected"
    assert "rate 'fast' is neither 'max', 'trace' nor a number of requests/s" in row["note"]
    assert "fast" not in text.split("left out")[0]  # never among the rates that meet the SLO


def test_a_run_directory_whose_name_is_not_utf8_is_reported_with_the_name_escaped(tmp_path) -> None:
    """Once an internal error (exit 70: the page could not be encoded); the bytes show as \\xff\\xfe."""
    runs = os.fsencode(tmp_path / "runs")
    for name in (b"run-\xff\xfe", b"bad-\xff"):
        os.makedirs(runs + b"/" + name)
        shutil.copyfile(TRAINING, runs + b"/" + name + b"/run_record.json")
    bad = runs + b"/bad-\xff/run_record.json"
    with open(bad, "w") as handle:
        handle.write(json.dumps({**json.loads(TRAINING.read_text()), "metrics": [1]}))
    out = tmp_path / "out"
    for given in (runs, runs + b"/run-\xff\xfe"):
        result = subprocess.run([sys.executable, "-m", "joulebench", "report", given, "-o", out], capture_output=True,
                                env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120, check=False)
        assert result.returncode == 0, result.stderr
        assert result.stdout.decode().startswith(f"joulebench report: wrote {out}"), result.stdout
    page = (out / "index.html").read_text()
    assert "run-\\xff\\xfe" in page
    result = subprocess.run([sys.executable, "-m", "joulebench", "report", bad, "-o", out], capture_output=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120, check=False)
    assert result.returncode == 64 and b"Traceback" not in result.stderr, result.stderr
    assert "bad-\\xff/run_record.json is not a valid run record" in result.stderr.decode()


def _report_process(paths: list[Path], out: Path) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "joulebench", "report", *map(str, paths), "-o", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)})


def _stderr_until(proc: subprocess.Popen[str], text: str) -> str:
    """What the process wrote to stderr up to and including the first line holding `text` (all of it, should it end
    first)."""
    assert proc.stderr is not None
    lines = []
    while line := proc.stderr.readline():
        lines.append(line)
        if text in line:
            break
    return "".join(lines)


def test_reports_into_one_directory_write_one_at_a_time_and_each_is_whole(tmp_path) -> None:
    """Four reports of different runs into one OUTDIR at once (once two reports' files mixed): each waits for the
    one writing, and the directory ends holding one report's table, page and charts, all of the same runs."""
    from joulebench.out_dir import one_writer

    drivers = sorted(TRAINING.parents[2].glob("*/run/run_record.json"))  # three drivers' records
    sets = [drivers[:1], drivers[1:2], drivers[2:], drivers]
    out = tmp_path / "out"
    waiting = "joulebench report: waiting for another joulebench report writing to"
    with one_writer(out, "test"):  # a report that is writing: the others must wait, not write beside it
        procs = [_report_process(paths, out) for paths in sets]
        said = [_stderr_until(p, waiting) for p in procs]  # each says it waits (however slowly the four start)
        assert all(waiting in text for text in said), said
        assert [p.poll() for p in procs] == [None] * 4 and sorted(os.listdir(out)) == [".joulebench.lock"]
    results = [p.communicate(timeout=240) for p in procs]
    for proc, before, (stdout, stderr) in zip(procs, said, results, strict=True):
        assert proc.returncode == 0 and "Traceback" not in before + stderr, before + stderr
        assert f"joulebench report: wrote {out / 'index.html'}\nnext: " in stdout  # then the next command
    rows = json.loads((out / "runs.json").read_text())["rows"]
    page = (out / "index.html").read_text()
    ids = {row["run_id"] for row in rows}
    assert ids in [{json.loads(p.read_text())["run_id"] for p in paths} for paths in sets]
    shown = {run_id for run_id in (json.loads(p.read_text())["run_id"] for p in drivers) if run_id in page}
    assert shown == ids  # the page lists the runs of the table beside it, no other report's


@pytest.mark.parametrize(("change", "reason"), [
    ({"requests_counted": 0}, "no request was counted in the window (too short for its rates, latencies and energy "
                              "per request)"),
    ({"window_counter_periods": 0.99}, "the window spans 0.99 energy counter periods, fewer than 10: too short for "
                                       "its energy figures"),
], ids=["no request counted", "under ten counter periods"])
def test_a_window_too_short_for_its_figures_is_a_rejected_row_never_ok_figures(tmp_path, change, reason) -> None:
    """Issue 61, from a newcomer's run: a JUBE serving row read OK, 5,151 tokens/s, from a 0.099 s window with one
    decode step and no request counted. The figures of such a window are rejected with the reason, in the table and
    in the serving section (never ranked, never the cheapest rate)."""
    sweep = tmp_path / "sweep"
    shutil.copytree(SERVING, sweep)
    path = sweep / "rate_16" / "run_record.json"
    data = json.loads(path.read_text())
    data["metrics"].update(change)
    path.write_text(json.dumps(data))
    rows = report_rows(tmp_path, sweep)
    row = next(r for r in rows if r["run_id"] == data["run_id"])
    assert row["per s"] == row["J per unit"] == "rejected" and reason in row["note"], row
    written = json.loads((tmp_path / "out" / "runs.json").read_text())
    (served,) = [r for s in written["serving"] for r in s["rows"] if r["run_id"] == data["run_id"]]
    assert served["J/request p50"] == "rejected" and reason in served["note"]
