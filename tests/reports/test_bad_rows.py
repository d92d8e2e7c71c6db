"""Issue 47 item 4: one record that cannot be read is a rejected row naming why; the rest of the report is written.

The records are copies of a shipped serving sweep (two rates of one H100 load run), one of them broken in a tmp dir.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from joulebench.analysis.report import main
from jpwr import ExitCode, ValidationError

REPO = Path(__file__).resolve().parents[2]
SWEEP = REPO / "benchmarks" / "results" / "2026-11-25-session10" / "serving-final" / "sweep"
GOOD, BAD = "rate_8", "rate_4"


def _edit(key_path: tuple[str, ...], value: Any) -> Callable[[Path], None]:
    """A breakage that sets one field of the bad record (a nested key given as its path)."""
    def apply(run_dir: Path) -> None:
        path = run_dir / "run_record.json"
        data = json.loads(path.read_text())
        block = data
        for key in key_path[:-1]:
            block = block[key]
        block[key_path[-1]] = value
        path.write_text(json.dumps(data))
    return apply


SHAPES = {  # breakage -> what the row's note names
    "request table reference wrong": (_edit(("requests", "file"), "elsewhere.h5"), "requests.h5"),
    "object where a list belongs": (_edit(("windows",), {"steady": {}}), "windows is {'steady': {}}, not a list"),
    "null id": (_edit(("run_id",), None), "run_id is None"),
    "text where a number belongs": (_edit(("metrics", "mean_power_w_per_device"), "abc"), "'abc' is not a number"),
}


def _sweep(tmp_path: Path, breakage: Callable[[Path], None]) -> Path:
    runs = tmp_path / "runs"
    for name in (GOOD, BAD):
        shutil.copytree(SWEEP / name, runs / name)
    breakage(runs / BAD)
    return runs


def _report(runs: Path, out: Path) -> list[dict[str, str]]:
    assert main([str(runs), "-o", str(out)]) == ExitCode.OK
    assert (out / "index.html").is_file()
    return json.loads((out / "runs.json").read_text())["rows"]


def _good_run_id() -> str:
    return json.loads((SWEEP / GOOD / "run_record.json").read_text())["run_id"]


@pytest.mark.parametrize("case", sorted(SHAPES))
def test_a_record_in_the_wrong_shape_is_a_rejected_row_and_the_rest_is_written(tmp_path: Path, case: str) -> None:
    breakage, named = SHAPES[case]
    rows = _report(_sweep(tmp_path, breakage), tmp_path / "out")
    good = [row for row in rows if row["run_id"] == _good_run_id()]
    bad = [row for row in rows if row["run_id"] != _good_run_id()]
    assert len(good) == 1 and good[0]["per Wh"] not in ("rejected", "n/a")
    assert len(bad) == 1 and bad[0]["per Wh"] == bad[0]["J per unit"] == "rejected"
    assert named in bad[0]["note"]


@pytest.mark.parametrize("damage", ["missing", "corrupt"])
def test_a_missing_or_corrupt_request_table_does_not_stop_the_report(tmp_path: Path, damage: str) -> None:
    def breakage(run_dir: Path) -> None:
        table = run_dir / "requests.h5"
        if damage == "missing":
            table.unlink()
        else:
            table.write_bytes(b"not an HDF5 file" * 8)

    rows = _report(_sweep(tmp_path, breakage), tmp_path / "out")
    assert len(rows) == 2 and _good_run_id() in {row["run_id"] for row in rows}


def test_compare_refuses_the_unreadable_record_it_names(tmp_path: Path) -> None:
    runs = _sweep(tmp_path, SHAPES["null id"][0])
    with pytest.raises(ValidationError, match=r"is not a valid run record.*run_id is None"):
        main(["--compare", str(runs / GOOD / "run_record.json"), str(runs / BAD / "run_record.json")])


def test_a_report_of_unreadable_records_only_is_refused(tmp_path: Path) -> None:
    runs = _sweep(tmp_path, SHAPES["null id"][0])
    shutil.rmtree(runs / GOOD)
    with pytest.raises(ValidationError, match=r"is not a valid run record.*run_id is None"):
        main([str(runs), "-o", str(tmp_path / "out")])


def test_pareto_names_the_unreadable_record_as_excluded(tmp_path: Path) -> None:
    from joulebench.analysis.pareto import sweep_points
    from joulebench.analysis.report import load_runs

    points = sweep_points(load_runs([_sweep(tmp_path, SHAPES["object where a list belongs"][0])]))
    excluded = [p for p in points if p.excluded]
    assert len(excluded) == 1 and "record unreadable" in str(excluded[0].excluded)
