"""`joulebench plot` on recorded traces: the committed H200 run and the replayed H100 trace (one and two nodes)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg

from joulebench.analysis.cli import main as joulebench_main
from joulebench.analysis.plot import find_trace_sources, load_nodes, plot_trace, save_figure
from jpwr.errors import ExitCode, ValidationError

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _legend_texts(ax) -> list[str]:
    return [t.get_text() for t in ax.get_legend().get_texts()]


def test_h200_trace_has_power_clock_and_utilisation_panels_with_windows(h200_trace, tmp_path):
    fig = plot_trace(load_nodes(h200_trace))
    ax_power, ax_clock, ax_util = fig.axes
    assert ax_power.get_ylabel() == "accelerator power (W)"
    assert ax_clock.get_ylabel() == "clock (MHz)"
    assert ax_util.get_ylabel() == "GPU utilisation (%)"
    assert ax_util.get_xlabel().startswith("time since first reading (s)")
    legend = _legend_texts(ax_power)
    steady = next(t for t in legend if t.startswith("steady:"))
    assert " J (" in steady and "Wh), counter+power, coverage 100%" in steady  # energy carries its method
    assert any(t.startswith("warmup:") for t in legend) and any(t.startswith("command:") for t in legend)
    assert any("instant power" in t for t in legend) and any("counter ΔE/Δt" in t for t in legend)
    assert len(ax_power.patches) == 3  # warmup, steady, command shaded
    labels = [t.get_text().strip() for t in ax_power.texts]
    assert {"warmup", "steady", "command"} <= set(labels)
    assert ax_clock.lines and ax_util.lines
    out = save_figure(fig, tmp_path / "h200.png")
    assert out.read_bytes()[:8] == PNG_MAGIC and out.stat().st_size > 10_000


def _rename_gpu(node_dir, suffix: str) -> None:
    """Give a copied node's GPU another UUID in its summary, as a second node's own GPU would have."""
    summary = node_dir / "summary.json"
    data = json.loads(summary.read_text())
    for window in data["windows"].values():
        for device in window["energy"]["per_device"]:
            device["uuid"] += suffix
    summary.write_text(json.dumps(data))


def steady_joules(fig) -> float:
    text = next(t for t in _legend_texts(fig.axes[0]) if t.startswith("steady:"))
    return float(text.split(", ")[1].split(" J")[0])


def test_window_labels_lie_above_every_curve(h200_trace):
    """The labels at the top of the power axis: the axis is raised so that no power reading reaches their rows."""
    fig = plot_trace(load_nodes(h200_trace))
    ax_power = fig.axes[0]
    FigureCanvasAgg(fig).draw()  # as save_figure renders it: the constrained layout sets the axes' final size
    renderer = fig.canvas.get_renderer()
    lowest = min(ax_power.transData.inverted().transform(t.get_window_extent(renderer).p0)[1]
                 for t in ax_power.texts)
    highest = max(float(np.nanmax(line.get_ydata())) for line in ax_power.lines)
    assert len(ax_power.texts) == 3 and highest < lowest, (highest, lowest)


def test_two_nodes_share_one_time_axis_and_energies_add(replayed_runs, tmp_path):
    # Two node directories of one run: the same replayed node copied under a second name, with its own GPU.
    run = tmp_path / "run"
    shutil.copytree(replayed_runs / "burst100" / "jpwr" / "n1", run / "n1")
    shutil.copytree(replayed_runs / "burst100" / "jpwr" / "n1", run / "n2")
    _rename_gpu(run / "n2", "-n2")
    one = plot_trace(load_nodes(run / "n1"))
    two = plot_trace(load_nodes(run))
    assert len(find_trace_sources(run)) == 2
    assert "nodes aligned by wall clock" in two.axes[2].get_xlabel()
    assert len(two.axes[0].lines) == 2 * len(one.axes[0].lines)
    assert steady_joules(two) == pytest.approx(2 * steady_joules(one), rel=1e-3)


def test_a_gpu_seen_by_two_nodes_is_counted_once_in_the_legend(replayed_runs, tmp_path):
    run = tmp_path / "run"
    for node in ("n1", "n2"):  # two samplers on one host, both metering the same GPU
        shutil.copytree(replayed_runs / "burst100" / "jpwr" / "n1", run / node)
    single = steady_joules(plot_trace(load_nodes(run / "n1")))
    assert steady_joules(plot_trace(load_nodes(run))) == pytest.approx(single)


def test_cli_writes_the_png(replayed_runs, tmp_path):
    out = tmp_path / "trace.png"
    assert joulebench_main(["plot", str(replayed_runs / "burst37"), "-o", str(out)]) == ExitCode.OK
    assert out.read_bytes()[:8] == PNG_MAGIC


def test_empty_directory_is_a_validation_error(tmp_path, capsys):
    with pytest.raises(ValidationError, match="no jpwr trace") as info:
        find_trace_sources(tmp_path)
    assert "Fix:" in str(info.value)
    assert joulebench_main(["plot", str(tmp_path), "-o", str(tmp_path / "x.png")]) == ExitCode.USAGE
    assert "no jpwr trace" in capsys.readouterr().err


def test_unknown_image_suffix_is_refused_before_reading(h200_trace, tmp_path, capsys):
    assert joulebench_main(["plot", str(h200_trace), "-o", str(tmp_path / "trace.jpeg2")]) == ExitCode.USAGE
    assert ".png" in capsys.readouterr().err


def test_traces_of_several_runs_are_not_plotted_together(replayed_runs, capsys):
    assert joulebench_main(["plot", str(replayed_runs), "-o", "unused.png"]) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert "holds traces of 2 runs (replay-burst100, replay-burst37)" in err and "Fix:" in err
