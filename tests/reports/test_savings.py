"""Issue 47 item 1: a difference in energy per unit is named a saving only beyond the two runs' combined bounds.

joulebench.savings on its own (the rule: relative bounds add), then through `report --pareto` and `report --compare`
on records of the DVFS model of test_pareto whose window energies carry a small or a huge (±1e9 J) bound.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from joulebench.analysis.cli import main as joulebench_main
from joulebench.device_settings import Request
from joulebench.savings import WITHIN_BOUNDS, relative_bound, saving

from .test_pareto import F0, model, write_run

HUGE_BOUND_J = 1e9
CHEAPER_CLOCK = 1380  # of the memory-bound model: less energy per token, a slowdown below 1 %
MEMORY_BOUND = (0.05, 100, 500)


def test_the_relative_bounds_add() -> None:
    base, new, bound = 10.0, 9.7, 0.02  # a 3 % saving against bounds of 2 % each: each alone is below it
    inside = saving(base, bound, new, bound)  # combined 4 %
    beyond = saving(base, bound / 4, new, bound / 4)  # combined 1 %
    assert inside.fraction == pytest.approx(1 - new / base) and inside.bound == pytest.approx(2 * bound)
    assert inside.beyond_bounds is False and inside.words().startswith(WITHIN_BOUNDS)
    assert beyond.beyond_bounds is True and WITHIN_BOUNDS not in beyond.words()
    assert saving(base, None, new, bound).beyond_bounds is None
    assert saving(base, None, new, bound).words().startswith(WITHIN_BOUNDS)


@pytest.mark.parametrize(("energy", "bound"), [(None, 1.0), (1.0, None), (0.0, 1.0), (1.0, -1.0)])
def test_a_bound_that_cannot_be_related_is_na(energy: float | None, bound: float | None) -> None:
    assert relative_bound(energy, bound) is None


def _sweep(root: Path, bound_j: float) -> tuple[Path, Path]:
    write_run(root, "default", Request(), *model(F0, *MEMORY_BOUND), bound_j=bound_j)
    write_run(root, "cheaper", Request(sm_clock_mhz=CHEAPER_CLOCK), *model(CHEAPER_CLOCK, *MEMORY_BOUND),
              bound_j=bound_j)
    return root / "default" / "run_record.json", root / "cheaper" / "run_record.json"


def _model_saving() -> float:
    (t0, p0), (t1, p1) = model(F0, *MEMORY_BOUND), model(CHEAPER_CLOCK, *MEMORY_BOUND)
    return 1 - (t1 * p1) / (t0 * p0)


def _pareto(tmp_path: Path, bound_j: float) -> dict:
    _sweep(tmp_path / "runs", bound_j)
    assert joulebench_main(["report", "--pareto", str(tmp_path / "runs"), "--max-slowdown", "50%",
                            "-o", str(tmp_path / "out")]) == 0
    return json.loads((tmp_path / "out" / "pareto.json").read_text())


def test_pareto_names_a_saving_beyond_small_bounds(tmp_path: Path) -> None:
    result = _pareto(tmp_path, bound_j=0.5)
    row = next(r for r in result["rows"] if r["run"] == "cheaper")
    assert _model_saving() > 0.05 and row["saving"].startswith(f"{100 * _model_saving():+.2f} %")
    assert result["waste_free"] == "cheaper"


def test_pareto_never_names_a_saving_beside_a_huge_bound(tmp_path: Path) -> None:
    result = _pareto(tmp_path, bound_j=HUGE_BOUND_J)
    assert all(r["saving"].startswith(WITHIN_BOUNDS) for r in result["rows"])
    assert result["waste_free"] == "default"
    assert any("no setting saves energy beyond the runs' combined bounds" in line for line in result["summary"])


@pytest.mark.parametrize(("bound_j", "named"), [(0.5, True), (HUGE_BOUND_J, False)])
def test_compare_names_a_difference_only_beyond_the_bounds(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                           bound_j: float, named: bool) -> None:
    a, b = _sweep(tmp_path, bound_j)
    assert joulebench_main(["report", "--compare", str(a), str(b)]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert ("less per token" in first) is named
    assert (WITHIN_BOUNDS in first) is not named
