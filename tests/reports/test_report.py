"""`joulebench report` over recorded runs: charts, table, offline HTML, n/a for missing energy, clear input errors."""

from __future__ import annotations

import html
import json
import re
import shutil
from pathlib import Path

import pytest

from joulebench.analysis import serving
from joulebench.analysis.cli import main as joulebench_main
from joulebench.analysis.report import (
    compare_runs,
    efficiency_figure,
    energy_figure,
    load_runs,
    render_html,
    table_rows,
    write_report,
)
from joulebench.record import SCHEMA_VERSION, RunRecord, read_run_record, steady_metrics, write_run_record
from jpwr.energy import J_PER_WH, WindowEnergy
from jpwr.errors import ExitCode, ValidationError

REPO = Path(__file__).resolve().parents[2]
DRIVER_RECORDS = sorted((REPO / "benchmarks" / "results").rglob("run_record.json"))


def _without_energy(source: Path, target: Path, reason: str = "no accelerator sensors on node n1: nvml: unavailable"
                    ) -> Path:
    """The same run as if no sensor had been found: energy unavailable with a reason, metrics recomputed."""
    record = read_run_record(source)
    for window in record.windows:
        window.energy = WindowEnergy.unavailable(reason)
    steady = record.window("steady")
    record.metrics = {**steady_metrics(steady, "steps", devices=1), "devices": 1}
    record.run_id += "-no-energy"
    return write_run_record(target / "run_record.json", record)


def test_html_page_embeds_every_chart_and_the_table(replayed_runs, tmp_path):
    index = write_report([replayed_runs], tmp_path / "report")
    page = index.read_text()
    assert page.count('src="data:image/png;base64,') == 2  # one benchmark: efficiency + energy charts
    assert not re.search(r"(src|href)=\"https?:", page)  # readable offline
    assert "replay-burst100" in page and "replay-burst37" in page
    assert "ΔE = Δt·(P̄₁+P̄₂)/2 + ΔP̄·(t₁+t₂)/2" in page and "Time per step" in page
    for png in ("efficiency_h100_replay.png", "energy_h100_replay.png"):
        assert (tmp_path / "report" / png).stat().st_size > 10_000
    data = json.loads((tmp_path / "report" / "runs.json").read_text())
    assert len(data["rows"]) == 2 and len(data["diagnoses"]) == 1


def test_energy_chart_places_each_run_at_its_recorded_values(replayed_runs):
    runs = load_runs([replayed_runs])
    fig = energy_figure(runs, "h100_replay")
    ax_util, ax_power = fig.axes
    assert ax_util.get_xlabel() == "mean GPU utilisation in the steady window (%)"
    assert ax_power.get_xlabel() == "mean power per device (W)"
    assert ax_util.get_ylabel() == ax_power.get_ylabel() == "energy per step (J)"
    points = sorted(float(v) for c in ax_power.collections for p in c.get_offsets() for v in p)
    expected = sorted(v for r in runs for v in (
        r.record.metrics["mean_power_w_per_device"],
        r.record.metrics["energy_wh"] * J_PER_WH / r.record.window("steady").work["steps"]))
    assert points == pytest.approx(expected, rel=1e-9)
    assert len([p for c in ax_util.collections for p in c.get_offsets()]) == 2
    assert sorted(t.get_text() for t in ax_power.texts) == ["replay-burst100", "replay-burst37"]  # no batch size


def test_runs_without_batch_size_or_energy_are_na_never_zero(replayed_runs, tmp_path):
    _without_energy(replayed_runs / "burst37" / "run_record.json", tmp_path / "no_energy")
    runs = load_runs([replayed_runs, tmp_path / "no_energy"])
    rows = {r["run_id"]: r for r in table_rows(runs)}
    missing = rows["replay-burst37-no-energy"]
    assert missing["per Wh"] == missing["J per unit"] == missing["mean W per device"] == missing["method"] == "n/a"
    assert "no accelerator sensors" in missing["note"]
    assert rows["replay-burst37"]["per Wh"] not in ("n/a", "0")
    fig = efficiency_figure(runs, "h100_replay")
    ax_rate, ax_wh = fig.axes
    assert ax_rate.get_ylabel() == "steps/s (all devices)" and ax_wh.get_ylabel() == "steps/Wh (accelerator energy)"
    # The replayed records carry no batch size: one bar per run instead of a batch-size axis; no bar for n/a.
    assert ax_rate.get_xlabel() == ax_wh.get_xlabel() == "run (no batch size recorded)"
    assert len(ax_rate.patches) == 3 and len(ax_wh.patches) == 2
    assert ax_wh.get_title(loc="right") == "1 run(s) n/a, not plotted"
    assert all(bar.get_height() > 0 for bar in ax_wh.patches)
    energy = energy_figure(runs, "h100_replay")
    assert energy.axes[1].get_title(loc="right") == "1 run(s) n/a, not plotted"
    assert all(y > 0 for c in energy.axes[1].collections for _, y in c.get_offsets())


def test_a_long_note_is_on_the_page_once_and_its_head_with_a_mark_in_every_row(replayed_runs, tmp_path):
    """The meter's list of every sensor it could not read (about 460 characters on a CPU machine) once, under the
    table; each row that has it shows its head and [1]; coverage in %."""
    reason = ("no accelerator sensors on node n1: nvml: unavailable: nvmlInit failed: NVML Shared Library Not Found "
              "(no NVIDIA driver or GPU?); amdsmi: unavailable: amdsmi not installed (ships with ROCm); rapl: "
              "unavailable: no RAPL zones under /sys/class/powercap (no intel_rapl driver?)")
    for run in ("burst37", "burst100"):
        _without_energy(replayed_runs / run / "run_record.json", tmp_path / run, reason)
    rows = table_rows(load_runs([replayed_runs, tmp_path]))
    page = render_html(rows, [], [], [tmp_path])
    assert page.count("nvmlInit failed") == 1 and f"[1] energy n/a: {html.escape(reason)}</p>" in page
    assert page.count("<td>energy n/a: no accelerator sensors on node n1 [1]</td>") == 2
    measured = [r for r in rows if r["method"] != "n/a"]
    assert len(measured) == 2 and all(float(r["coverage %"]) > 99 for r in measured), measured


def test_compare_prints_the_decomposition(replayed_runs, capsys):
    a, b = (str(replayed_runs / p / "run_record.json") for p in ("burst37", "burst100"))
    assert joulebench_main(["report", "--compare", a, b]) == ExitCode.OK
    out = capsys.readouterr().out
    assert "more per step than" in out and "of the difference" in out and "Moved between the runs" in out


def test_empty_directory(tmp_path, capsys):
    with pytest.raises(ValidationError, match=r"no run_record\.json under"):
        load_runs([tmp_path])
    assert joulebench_main(["report", str(tmp_path), "-o", str(tmp_path / "out")]) == ExitCode.USAGE
    assert "Fix:" in capsys.readouterr().err


def test_version_one_records_load_beside_current_ones_and_newer_ones_are_refused(replayed_runs, tmp_path):
    """The stored CPU sweep records are schema version 1; the replayed runs are written now, in the current one."""
    stored = sorted(DRIVER_SWEEP.rglob("run_record.json"))
    assert stored and {json.loads(p.read_text())["schema_version"] for p in stored} == {1}
    runs = load_runs([DRIVER_SWEEP, replayed_runs])
    assert {run.record.run_id for run in runs} >= {read_run_record(p).run_id for p in stored}
    data = json.loads((replayed_runs / "burst37" / "run_record.json").read_text())
    assert data["schema_version"] == SCHEMA_VERSION
    data["schema_version"] = SCHEMA_VERSION + 1
    (tmp_path / "run_record.json").write_text(json.dumps(data))
    with pytest.raises(ValidationError, match=f"schema_version {SCHEMA_VERSION + 1} is not supported"):
        load_runs([replayed_runs, tmp_path])


def test_not_a_run_record(h200_trace, tmp_path):
    summary = h200_trace.with_name("accuracy_summary.json")  # a jpwr node summary, not a run record
    with pytest.raises(ValidationError, match=r"is not a run record \(kind 'node'"):
        load_runs([summary])
    (tmp_path / "broken.json").write_text("{")
    with pytest.raises(ValidationError, match="not readable JSON"):
        load_runs([tmp_path / "broken.json"])
    with pytest.raises(ValidationError, match="does not exist"):
        load_runs([tmp_path / "missing"])


def test_compare_needs_one_record_per_side(replayed_runs, capsys):
    record = replayed_runs / "burst37" / "run_record.json"
    code = joulebench_main(["report", "--compare", str(replayed_runs), str(record)])
    assert code == ExitCode.USAGE
    assert "exactly one per side" in capsys.readouterr().err


@pytest.mark.skipif(not DRIVER_RECORDS, reason="no driver run records committed under benchmarks/results yet")
def test_committed_driver_records_render(tmp_path):
    index = write_report(DRIVER_RECORDS, tmp_path / "report")
    page = index.read_text()
    for path in DRIVER_RECORDS:
        assert RunRecord.from_dict(json.loads(path.read_text())).run_id in page
    records = [read_run_record(p) for p in DRIVER_RECORDS]
    # efficiency + energy charts per benchmark, and the J/token chart where inference records exist
    token_charts = len({r.benchmark for r in records if r.metrics.get("work_unit") == "output_tokens"})
    # and one serving chart per (model, task, max_concurrency) of llm_inference load records
    serving_charts = len({serving.group_key(r) for r in load_runs(DRIVER_RECORDS) if serving.is_load_record(r)})
    assert page.count('src="data:image/png;base64,') == (2 * len({r.benchmark for r in records}) + token_charts
                                                         + serving_charts)


def test_latents_come_only_from_the_records_own_trace(replayed_runs, tmp_path):
    mixed = tmp_path / "mixed"
    for phase in ("burst100", "burst37"):  # both runs' traces in one directory, one record
        shutil.copytree(replayed_runs / phase / "jpwr", mixed / phase / "jpwr")
    shutil.copy(replayed_runs / "burst37" / "run_record.json", mixed / "run_record.json")
    (alone,) = load_runs([replayed_runs / "burst37" / "run_record.json"])
    (found,) = load_runs([mixed / "run_record.json"])
    assert found.latents == alone.latents and found.latents
    shutil.rmtree(mixed / "burst37")  # only the other run's trace left: no latents rather than wrong ones
    (orphan,) = load_runs([mixed / "run_record.json"])
    assert orphan.latents == {}
    assert table_rows([orphan])[0]["GPU util %"] == "n/a"


DRIVER_SWEEP = Path(__file__).parent / "data" / "resnet50_cpu_replay"


def test_driver_records_over_batch_sizes_make_one_line_per_system():
    runs = load_runs([DRIVER_SWEEP])
    fig = efficiency_figure(runs, "resnet50")
    ax_rate, ax_wh = fig.axes
    assert ax_rate.get_xlabel() == ax_wh.get_xlabel() == "global batch size"
    assert ax_rate.get_ylabel() == "images/s (all devices)" and ax_wh.get_ylabel() == "images/Wh (accelerator energy)"
    (rate_line,) = ax_rate.lines
    (wh_line,) = ax_wh.lines
    assert list(rate_line.get_xdata()) == [2, 4, 8] and rate_line.get_label() == "cpu ×1, pytorch, fp32"
    by_batch = {r.record.config["global_batch_size"]: r.record.metrics for r in runs}
    assert list(rate_line.get_ydata()) == [by_batch[b]["images_per_s"] for b in (2, 4, 8)]
    assert list(wh_line.get_ydata()) == [by_batch[b]["images_per_wh"] for b in (2, 4, 8)]
    ax_util, _ = energy_figure(runs, "resnet50").axes
    assert sorted(t.get_text() for t in ax_util.texts) == ["no run has this value (n/a)"]  # traces not kept
    _, ax_power = energy_figure(runs, "resnet50").axes
    assert sorted(t.get_text() for t in ax_power.texts) == ["batch 2", "batch 4", "batch 8"]


def test_report_diagnosis_names_the_batch_size_without_traces(tmp_path):
    write_report([DRIVER_SWEEP], tmp_path)
    (diagnosis,) = json.loads((tmp_path / "runs.json").read_text())["diagnoses"]
    text = " ".join(diagnosis["sentences"])
    assert "per image" in text and "batch size" in text
    assert "No trace of the steady window for" in text  # the traces were not kept: latents are not guessed
    assert diagnosis["time_term_j"] + diagnosis["power_term_j"] == pytest.approx(diagnosis["delta_energy_per_unit_j"])


def test_failed_runs_stay_in_the_table_but_out_of_charts_and_diagnosis(tmp_path):
    record = read_run_record(DRIVER_SWEEP / "b8" / "run_record.json")
    record.status, record.status_reason = "FAILED", "RuntimeError: CUDA error (recorded after the steady window)"
    write_run_record(tmp_path / "failed" / "run_record.json", record)
    runs = load_runs([DRIVER_SWEEP / "b2", DRIVER_SWEEP / "b4", tmp_path / "failed"])
    rows = {r["run_id"]: r for r in table_rows(runs)}
    assert rows[record.run_id]["status"] == "FAILED" and "CUDA error" in rows[record.run_id]["note"]
    ax_rate, _ = efficiency_figure(runs, "resnet50").axes
    assert list(ax_rate.lines[0].get_xdata()) == [2, 4]
    assert ax_rate.get_title(loc="right") == "1 run(s) n/a, not plotted"
    write_report([DRIVER_SWEEP / "b2", DRIVER_SWEEP / "b4", tmp_path / "failed"], tmp_path / "out")
    (diagnosis,) = json.loads((tmp_path / "out" / "runs.json").read_text())["diagnoses"]
    assert record.run_id not in diagnosis["title"]


@pytest.mark.skipif(len(DRIVER_RECORDS) < 2, reason="fewer than two driver run records under benchmarks/results")
def test_committed_gpu_records_decompose_to_their_measured_difference():
    # the driver's own energy figure is the independent path: a run stopped inside its window (a TIMEOUT record of
    # llm_inference) has a cost from that window but no energy_wh of the driver's
    runs = [r for r in load_runs(DRIVER_RECORDS)
            if r.cost.energy_per_unit_j is not None and r.record.metrics.get("energy_wh") is not None]
    pairs = [(a, b) for a in runs for b in runs if a is not b and a.record.benchmark == b.record.benchmark]
    assert pairs, "no two committed runs of one benchmark with energy"

    def measured(run):  # independent path: the record's steady energy (Wh) over its work count
        return run.record.metrics["energy_wh"] * J_PER_WH / run.record.window("steady").work[run.cost.work_unit]

    for a, b in pairs:
        d = compare_runs(a, b).decomposition
        assert d.time_term + d.power_term == pytest.approx(measured(b) - measured(a), rel=1e-9)
    with_trace = [r for r in runs if any(p.name != (r.record.requests or {}).get("file")  # a request table: no trace
                                         for p in r.path.parent.glob("*.h5"))]
    for run in with_trace:  # a trace kept beside the record supplies the steady window's latent metrics
        assert 0 <= run.latents["utilization_gpu"] <= 1 and run.latents["sm_clock_hz"] > 0
