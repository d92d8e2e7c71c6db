"""Coverage gates the headline (issue 22 item 3): a window whose GPU fell off the bus half-way is PARTIAL.

The window's energy comes from the real sampler and estimator over the recorded H100 trace, with the fake
NVML losing the device 1 s into a 3 s window (tests/jpwr/test_estimator_faults.py does the same).
"""

from __future__ import annotations

from pathlib import Path

from joulebench.analysis.report import load_runs, table_rows
from joulebench.analysis.report import main as report_main
from joulebench.record import RunRecord, read_run_record, steady_metrics, write_run_record
from jpwr.energy import Window
from tests.jpwr.test_estimator_faults import SLEEP, S, _replay


def _record(energy, out: Path, run_id: str) -> Path:
    steady = Window("steady", 0, 10, SLEEP[0], SLEEP[1], {"tokens": 40_960.0}, energy)
    record = RunRecord("llm_training", run_id, windows=[steady], hardware={"device_name": "H100"})
    record.metrics = steady_metrics(steady, "tokens", devices=1)
    path = out / run_id / "run_record.json"
    path.parent.mkdir(parents=True)
    write_run_record(path, record)
    return path


def _lost_and_whole(fake_pynvml, h100_trace_dir, tmp_path):
    lost = _replay(fake_pynvml, h100_trace_dir, tmp_path / "lost", fake_pynvml.Faults(lost_at_ns=S))[2]
    whole = _replay(fake_pynvml, h100_trace_dir, tmp_path / "whole")[2]
    return lost, whole


def test_untrusted_steady_energy_makes_the_run_partial_with_headline_figures_na(fake_pynvml, h100_trace_dir,
                                                                                 tmp_path):
    lost, whole = _lost_and_whole(fake_pynvml, h100_trace_dir, tmp_path)
    assert not lost.trusted and whole.trusted
    partial = read_run_record(_record(lost, tmp_path / "runs", "lost"))
    ok = read_run_record(_record(whole, tmp_path / "runs", "whole"))
    assert ok.status == "OK" and ok.metrics["tokens_per_wh"] is not None
    assert partial.status == "PARTIAL"
    assert "GPU_IS_LOST" in partial.status_reason and "coverage" in partial.status_reason
    m = partial.metrics
    assert m["tokens_per_wh"] is None and m["energy_wh"] is None and m["mean_power_w_per_device"] is None
    assert m["partial_tokens_per_wh"] > 0 and m["partial_mean_power_w_per_device"] > 0
    assert ok.metrics["partial_tokens_per_wh"] is None


def test_report_shows_partial_figures_only_when_asked_and_labels_them(fake_pynvml, h100_trace_dir, tmp_path,
                                                                      capsys):
    lost, whole = _lost_and_whole(fake_pynvml, h100_trace_dir, tmp_path)
    lost_path = _record(lost, tmp_path / "runs", "lost")
    whole_path = _record(whole, tmp_path / "runs", "whole")
    runs = load_runs([tmp_path / "runs"])
    hidden = {r["run_id"]: r for r in table_rows(runs)}
    shown = {r["run_id"]: r for r in table_rows(runs, allow_partial=True)}
    assert hidden["lost"]["per Wh"] == "n/a" and hidden["lost"]["mean W per device"] == "n/a"
    assert shown["lost"]["per Wh"].endswith("(partial)") and shown["lost"]["mean W per device"].endswith("(partial)")
    assert hidden["whole"]["per Wh"] == shown["whole"]["per Wh"] != "n/a"
    assert report_main(["--compare", str(whole_path), str(lost_path)]) == 0
    out = capsys.readouterr().out
    assert "lost" in out and "is PARTIAL" in out and "left out of the diagnosis" in out


def test_plot_labels_an_untrusted_window_partial_only_when_asked(fake_pynvml, h100_trace_dir, tmp_path):
    from joulebench.analysis.plot import energy_label

    lost, _ = _lost_and_whole(fake_pynvml, h100_trace_dir, tmp_path)
    assert "energy n/a (untrusted" in energy_label("steady", lost, 3.0)
    shown = energy_label("steady", lost, 3.0, allow_partial=True)
    assert "partial: covered time only" in shown and "n/a" not in shown
