"""`joulebench plan` reads what `joulebench attribute` writes: a two-run clock sweep attributed, then planned.

Issue 32 (A45): plan read a block shape attribute never wrote and answered "attribute the sweep's runs first" for
runs that were attributed. The runs are copies of the synthetic metered run (tests/analysis/conftest.py), one
labelled as locked to 1410 MHz: equal figures at both clocks, so the plan must equal the default's phases.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from joulebench.analysis import cli
from joulebench.device_settings import Request
from joulebench.device_settings.record import node_block
from jpwr.errors import ExitCode
from tests.analysis.conftest import MeteredRun


def _sweep(steady_run: MeteredRun, root: Path) -> list[Path]:
    """The run at the default setting and a copy whose record says sm_clock 1410 MHz, both attributed."""
    paths = []
    for name, clock in (("default", None), ("sm-1410", 1410)):
        run_dir = root / name
        shutil.copytree(steady_run.run_dir, run_dir)
        path = run_dir / "run_record.json"
        data = json.loads(path.read_text())
        data["run_id"] = name
        if clock is not None:
            data["config"]["device_settings"] = node_block(Request(sm_clock_mhz=clock), "nvml", "n1", None, [])
        path.write_text(json.dumps(data))
        assert cli.main(["attribute", str(run_dir), "--bootstrap", "40"]) == ExitCode.OK
        paths.append(path)
    return paths


def test_plan_plans_on_the_replay_rows_attribute_wrote(steady_run: MeteredRun, tmp_path: Path, capsys) -> None:
    paths = _sweep(steady_run, tmp_path / "sweep")
    capsys.readouterr()
    result = tmp_path / "plan.json"
    assert cli.main(["plan", "--method", "replay", *map(str, paths), "--json", str(result)]) == ExitCode.OK
    out = capsys.readouterr().out
    rows = json.loads(paths[0].read_text())["attribution"]["estimators"]["replay"]["rows"]
    plan = json.loads(result.read_text())
    assert plan["phases"] == [r["phase"] for r in rows] == ["forward", "backward", "optimizer"]
    assert plan["default"]["time_s"] == sum(r["seconds_per_step"] for r in rows)
    assert plan["default"]["energy_j"] == sum(r["energy_per_step_j"] for r in rows)
    assert plan["excluded"] == [] and "the per-phase plan saves nothing more than the best single clock" in out


def test_plan_names_the_fit_phase_below_resolution(steady_run: MeteredRun, tmp_path: Path, capsys) -> None:
    """The fit resolves forward and backward; the 20 ms optimizer step and the 20 ms unmarked gap are below
    resolution: no plan, and the refusal says why by run and phase."""
    paths = _sweep(steady_run, tmp_path / "sweep")
    capsys.readouterr()
    assert cli.main(["plan", "--method", "fit", *map(str, paths)]) == ExitCode.USAGE
    err = capsys.readouterr().err
    *details, error = err.splitlines()  # what was left out, one a line, above the one-line error
    assert error.startswith("joulebench plan: error: phases optimizer, unmarked have no figures at the default setting")
    assert "joulebench plan:   run default: phase optimizer has no energy or duration (below resolution)" in details
    assert details[0].startswith(f"joulebench plan: left out ({len(details) - 1}; ")
    assert "attribute the sweep's runs first" not in err
