"""The report's stacked bar per run (phases) and the plot's phase strip, on a synthetic attributed run."""

from __future__ import annotations

from pathlib import Path

import pytest
from matplotlib.collections import PolyCollection

from joulebench.analysis.attribute import attribute
from joulebench.analysis.plot import load_nodes, plot_trace
from joulebench.analysis.report import attribution_figure, load_runs, write_report
from joulebench.record import read_run_record, write_run_record
from tests.analysis.conftest import metered


@pytest.fixture(scope="module")
def attributed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = metered(tmp_path_factory.mktemp("charts"), "run", steady_s=12.0)
    path, record, block = attribute(run.run_dir, draws=40)
    record.attribution = block
    write_run_record(path, record)
    return run.run_dir


def test_report_draws_one_bar_per_estimator_and_embeds_it(attributed: Path, tmp_path: Path) -> None:
    (run,) = load_runs([attributed])
    fig = attribution_figure([run], "synthetic_training")
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert [label.rsplit("\n", 1)[1] for label in labels] == ["fit", "replay"]  # never one mixed bar
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert {"forward", "backward"} <= set(legend) and "below resolution or n/a" in legend
    block = read_run_record(attributed / "run_record.json").attribution
    fit_widths = [p.get_width() for p in ax.patches if p.get_y() < 0.5]  # bar 0: fit
    resolved = [100 * r["share"] for r in block["estimators"]["fit"]["rows"] if r["status"] == "resolved"]
    assert fit_widths[:len(resolved)] == pytest.approx(resolved)
    page = write_report([attributed], tmp_path / "report")
    assert (tmp_path / "report" / "attribution_synthetic_training.png").is_file()
    assert "energy per phase" in page.read_text()


def test_runs_without_attribution_draw_no_phase_chart(replayed_runs) -> None:
    assert attribution_figure(load_runs([replayed_runs]), "h100_replay") is None


def test_plot_marks_each_phase_along_the_power_axis(attributed: Path) -> None:
    fig = plot_trace(load_nodes(attributed / "jpwr"))
    ax_power = fig.axes[0]
    legend = [t.get_text() for t in ax_power.get_legend().get_texts()]
    assert {"phase: forward (strip at the bottom)", "phase: backward (strip at the bottom)",
            "phase: optimizer (strip at the bottom)"} <= set(legend)
    strips = [c for c in ax_power.collections if isinstance(c, PolyCollection)]
    assert len(strips) == 3 and all(len(c.get_paths()) > 10 for c in strips)
