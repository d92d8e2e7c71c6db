"""benchmarks/attribution_h100.py without a GPU: the compact table it prints last, from attributed records."""

from __future__ import annotations

import shutil
from pathlib import Path

from benchmarks.attribution_h100 import summary_rows
from joulebench.analysis.attribute import attribute
from joulebench.record import write_run_record
from tests.analysis.conftest import metered


def test_the_table_has_one_row_per_estimator_and_phase_and_the_closures(tmp_path: Path) -> None:
    run = metered(tmp_path / "metered", "run", steady_s=10.0)
    target = tmp_path / "out" / "llm" / "run"
    shutil.copytree(run.run_dir, target)
    path, record, block = attribute(target, draws=40)
    record.attribution = block
    write_run_record(path, record)
    rows = summary_rows("llm", tmp_path / "out" / "llm")
    phases = {(r.split(" | ")[1], r.split(" | ")[2]) for r in rows}
    assert {("fit", "forward"), ("fit", "backward"), ("replay", "optimizer"), ("fit", "closure"),
            ("replay", "closure")} <= phases
    below = next(r for r in rows if r.startswith("| llm | fit | optimizer |"))
    assert "n/a" in below and "below resolution" in below
    assert summary_rows("resnet50", tmp_path / "out" / "resnet50") == []  # nothing ran: no rows, no error
