"""benchmarks/gpu_doc_lines.py: which `# GPU only` lines of the docs it runs, how it runs them, what passes."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from benchmarks import gpu_doc_lines as script

REPO = Path(__file__).resolve().parents[2]
SHIPPED_RECORD = REPO / "tests/reports/data/resnet50_cpu_replay/b2/run_record.json"


def test_every_gpu_line_runs_or_says_why_not():
    lines = script.gpu_lines()
    assert len(lines) >= 20  # the marks are found (a broken reader would run nothing)
    reasons = {line.where: line.excluded for line in lines}
    quick_start = next(line.where for line in lines if line.where.startswith("README.md:")
                       and "train --model 800M --out-dir runs/gpt" in line.command)
    assert reasons[quick_start] is None  # the quick start's GPU line always runs
    assert "power limits" in str(reasons[next(w for w, line in zip(reasons, lines, strict=True)
                                              if "device_settings apply" in line.command)])
    excluded = [r for r in reasons.values() if r]
    assert excluded and all(r in {why for _, why in script.EXCLUDED} for r in excluded)
    assert sum(r is None for r in reasons.values()) >= 12


def test_a_line_runs_literally_with_this_interpreter_and_filled_placeholders(tmp_path: Path):
    line = script.DocLine("docs/x.md:1", "jpwr --methods nvml --out RUN/jpwr -- python -m llm_training train "
                          "--out-dir RUN --replay-phases 4", "GPU only")
    assert line.argv(tmp_path) == [sys.executable, "-m", "jpwr", "--methods", "nvml", "--out", f"{tmp_path}/RUN/jpwr",
                                   "--", sys.executable, "-m", "llm_training", "train", "--out-dir",
                                   f"{tmp_path}/RUN", "--replay-phases", "4"]
    wheel = script.DocLine("d:2", "python benchmarks/llm_h100.py --wheel 'PATH/m.whl' --out-dir '$OUT/llm'", "")
    assert wheel.argv(tmp_path)[2:] == ["--wheel", ".whl/m.whl", "--out-dir", f"{tmp_path}/llm"]


def test_a_record_passes_only_when_ok_with_energy(tmp_path: Path):
    data = json.loads(SHIPPED_RECORD.read_text())
    assert script.record_row(SHIPPED_RECORD, None)["ok"] == (data["status"] == "OK"
                                                            and data["metrics"].get("energy_wh") is not None)
    data["metrics"]["energy_wh"] = None
    data["status"] = "OK"
    unmeasured = tmp_path / "run_record.json"
    unmeasured.write_text(json.dumps(data))
    row = script.record_row(unmeasured, None)
    assert (row["status"], row["energy_wh"], row["ok"]) == ("OK", None, False)


def test_a_command_shown_in_several_docs_runs_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert script.main(["--list"]) == 0
    listed = capsys.readouterr().out
    assert "docs/llm_training.md:" in listed  # the quick start again: its run counts for it
    assert "runs once: the same command as README.md:" in listed
    first = {"line": "README.md:58", "exit": 0, "wall s": 190.0, "records": 1, "gpu": "GPU-1", "result": "pass",
             "detail": [{"status": "OK", "energy_wh": 8.0, "steady s": 41.0, "bound %": 0.2, "deviation %": 0.05}]}
    again = script.same_run(script.DocLine("docs/llm_training.md:23", "jpwr ...", "GPU only"), first)
    assert (again["line"], again["same as"], again["wall s"], again["result"]) == ("docs/llm_training.md:23",
                                                                                 "README.md:58", 0.0, "pass")
    table = script.write_tables([first, again], tmp_path)
    assert (tmp_path / "results.md").read_text() == table  # the rows as written: the table, the JSON list of rows
    assert json.loads((tmp_path / "results.json").read_text()) == [first, again]
    assert "| docs/llm_training.md:23 | README.md:58 |" in table
    assert "wall s summed (one GPU running them in turn): 190" in table  # the run counted once
