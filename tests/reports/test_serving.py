"""The serving section of `joulebench report` on copies of the real H100 Poisson sweep (llama-8b, chat, 256 slots,
rates 4, 8, 16, 24, 32 and max; benchmarks/results/2026-11-25-session10/serving-sweep): the table by rate, the chart,
and the sentence naming the cheapest rate that meets the SLO, also with planted changes to the records.

The recorded SLOs are p90 TTFT <= 1000 ms and p90 TPOT <= 50 ms. Read from the records: every finite rate meets them
(p90 TTFT 80 to 323 ms, p90 TPOT 8 to 29 ms), `max` does not (p90 TTFT 29.8 s: all requests queued at the start),
and J/request p50 falls with the rate (110.4 J at 4/s to 21.87 J at 32/s), so 32/s is the cheapest rate meeting them
(`max` is cheaper still, 21.59 J, but misses the TTFT SLO).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from joulebench.analysis import serving
from joulebench.analysis.cli import main as joulebench_main
from joulebench.analysis.report import load_runs, write_report
from joulebench.requests_table import read_requests
from jpwr.output import fmt

pytest.importorskip("matplotlib")

REPO = Path(__file__).resolve().parents[2]
SWEEP = REPO / "benchmarks" / "results" / "2026-11-25-session10" / "serving-sweep" / "sweep"
RATES = ("4", "8", "16", "24", "32", "max")
STATIC = REPO / "benchmarks" / "results" / "2026-11-23-session3" / "inference-engine" / "llama-1b" / "static"

pytestmark = pytest.mark.skipif(not (SWEEP / "rate_4" / "run_record.json").is_file(),
                                reason="the H100 serving sweep records are not committed")
SWEEP_ID = "load-llama-8b-20261125T153322Z-8b4b66"  # the sweep's run id (its records' config.run_id)


@pytest.fixture
def sweep(tmp_path) -> Path:
    """Copies of the six real records (record and request table; the originals are never touched)."""
    target = tmp_path / "sweep"
    for rate in RATES:
        (target / f"rate_{rate}").mkdir(parents=True)
        for name in ("run_record.json", "requests.h5"):
            shutil.copy(SWEEP / f"rate_{rate}" / name, target / f"rate_{rate}" / name)
    return target


def _edit(sweep: Path, rate: str, **metrics) -> dict:
    path = sweep / f"rate_{rate}" / "run_record.json"
    data = json.loads(path.read_text())
    for key, value in metrics.items():
        if value is ...:
            data["metrics"].pop(key, None)
        else:
            data["metrics"][key] = value
    path.write_text(json.dumps(data))
    return data


def _section(sweep: Path) -> tuple[str, list[serving.RateRow], serving.RateRow | None]:
    (rows,) = serving.serving_groups(load_runs([sweep])).values()
    sentence, best = serving.cheapest_sentence(rows)
    return sentence, rows, best


def test_real_sweep_names_32_per_s_as_the_cheapest_rate_meeting_the_recorded_slo(sweep):
    sentence, rows, best = _section(sweep)
    assert [r.rate for r in rows] == list(RATES)  # by offered rate, max last
    recorded = {rate: json.loads((SWEEP / f"rate_{rate}" / "run_record.json").read_text())["metrics"]
                for rate in RATES}
    meeting = [rate for rate, m in recorded.items()
               if m["ttft_p90_s"] * 1000 <= m["slo_ttft_ms"] and m["tpot_p90_s"] * 1000 <= m["slo_tpot_ms"]]
    assert meeting == ["4", "8", "16", "24", "32"]  # what the records say, independently of the report
    expected = min(meeting, key=lambda rate: recorded[rate]["energy_per_request_p50_j"])
    assert expected == "32" and best is not None and best.rate == "32"
    assert recorded["max"]["energy_per_request_p50_j"] < recorded["32"]["energy_per_request_p50_j"]  # cheaper, but
    assert sentence.startswith("Cheapest rate that meets the SLO (p90 TTFT ≤ 1000 ms, p90 TPOT ≤ 50 ms): 32 "
                               "requests/s at 21.87 J/request (p50)")
    assert "meeting it: 4, 8, 16, 24, 32" in sentence and "missing it: max (p90 TTFT" in sentence


def _served_in_window(rate: str) -> float:
    """What the requests table of a shipped record says was served: requests finished inside the steady window over
    its length (read here from the file, independently of the report)."""
    record = json.loads((SWEEP / f"rate_{rate}" / "run_record.json").read_text())
    table = read_requests(SWEEP / f"rate_{rate}" / "requests.h5")
    steady = next(w for w in record["windows"] if w["name"] == "steady")
    t0 = (steady["t_start_ns"] - table.attrs["start_ns"]) / 1e9
    finish = table.requests["finish_s"]
    return int(((finish >= t0) & (finish < t0 + steady["duration_s"])).sum()) / steady["duration_s"]


def test_table_by_rate_reads_the_records(sweep):
    _, rows, _ = _section(sweep)
    table = {r["offered rate"]: r for r in serving.table(rows)}
    m = json.loads((SWEEP / "rate_max" / "run_record.json").read_text())
    # These records predate the served rate: their req/s was over the arrivals' window (the offered rate at a finite
    # rate); the served rate comes from their request tables, goodput = served rate x SLO share.
    assert table["max"]["served req/s"] == fmt(_served_in_window("max"), 4) and table["max"]["offered req/s"] == "n/a"
    assert table["max"]["goodput req/s"] == "0"  # a measured 0
    four = json.loads((SWEEP / "rate_4" / "run_record.json").read_text())["metrics"]
    assert table["4"]["offered req/s"] == fmt(four["requests_per_s"], 4)
    assert table["4"]["goodput req/s"] == table["4"]["served req/s"] == fmt(_served_in_window("4"), 4)
    assert "older record" in table["4"]["overload"]
    assert table["max"]["p90 TTFT ms"] == "2.983e+04" and table["32"]["J/request p50"] == "21.87"
    shares = m["requests"]["energy"]["shares"]
    assert table["max"]["prefill %"] == f"{100 * shares['prefill']:.3g}"
    assert all(table[r]["SLO TTFT ms"] == "1000" and table[r]["SLO TPOT ms"] == "50" for r in RATES)


def test_a_rate_that_violates_the_ttft_slo_is_not_chosen(sweep):
    _edit(sweep, "32", ttft_p90_s=1.2)  # planted: 32/s now misses the 1000 ms TTFT SLO
    sentence, _, best = _section(sweep)
    assert best is not None and best.rate == "24"
    assert "32 (p90 TTFT 1200 ms > 1000 ms)" in sentence and "24 requests/s at 28.84 J/request" in sentence


def test_a_rate_that_violates_the_tpot_slo_is_not_chosen(sweep):
    _edit(sweep, "32", tpot_p90_s=0.051)
    _edit(sweep, "24", tpot_p90_s=0.06)
    sentence, _, best = _section(sweep)
    assert best is not None and best.rate == "16" and "24 (p90 TPOT 60 ms > 50 ms)" in sentence


def test_a_tighter_slo_that_no_rate_meets(sweep):
    for rate in RATES:
        _edit(sweep, rate, slo_ttft_ms=50.0)
    sentence, _, best = _section(sweep)
    assert best is None and sentence.startswith("No rate meets the SLO (p90 TTFT ≤ 50 ms, p90 TPOT ≤ 50 ms)")


def test_no_slo_says_how_to_give_one(sweep, tmp_path):
    for rate in RATES:
        _edit(sweep, rate, slo_ttft_ms=None, slo_tpot_ms=None)
    sentence, _, best = _section(sweep)
    assert best is None and sentence == "no SLO given: pass --slo-ttft-ms/--slo-tpot-ms to the load."
    write_report([sweep], tmp_path / "report")
    (section,) = json.loads((tmp_path / "report" / "runs.json").read_text())["serving"]
    assert section["sentence"] == sentence and section["cheapest_rate"] is None


def test_missing_figures_are_na_and_never_chosen(sweep):
    data = _edit(sweep, "32", energy_per_request_p50_j=..., energy_per_request_p90_j=..., tpot_p90_s=...)
    _, rows, _ = _section(sweep)
    row = next(r for r in rows if r.rate == "32")
    # J/request comes from the requests block when metrics lack it (older records); TPOT has no other source
    assert row.j_request_p50 == pytest.approx(data["requests"]["energy"]["energy_per_request_j"]["p50"])
    assert row.tpot_p90_s is None
    table = {r["offered rate"]: r for r in serving.table(rows)}
    assert table["32"]["p90 TPOT ms"] == "n/a"
    sentence, best = serving.cheapest_sentence(rows)
    assert best is not None and best.rate == "24" and "not judged (no SLO or p90 latency n/a): 32" in sentence
    _edit(sweep, "24", energy_per_request_p50_j=...)
    path = sweep / "rate_24" / "run_record.json"
    record = json.loads(path.read_text())
    del record["requests"]["energy"]["energy_per_request_j"]
    path.write_text(json.dumps(record))
    _, rows, best = _section(sweep)
    assert next(r for r in rows if r.rate == "24").j_request_p50 is None
    assert best is not None and best.rate == "16"


def test_a_figure_that_cannot_be_true_is_rejected_and_never_cheapest(sweep):
    _edit(sweep, "32", energy_per_request_p50_j=0.0)  # 0 J per request cannot be true
    _, rows, best = _section(sweep)
    row = next(r for r in rows if r.rate == "32")
    assert row.rejected and "energy_per_request_p50_j 0 is not positive" in row.rejected
    assert best is not None and best.rate == "24"
    assert next(r for r in serving.table(rows) if r["offered rate"] == "32")["J/request p50"] == "rejected"


def test_report_page_chart_and_cli_sentence(sweep, tmp_path, capsys):
    out = tmp_path / "report"
    assert joulebench_main(["report", str(sweep), "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert (f"serving, continuous: llama-8b, chat, max concurrency 256, accelerators (sweep {SWEEP_ID}): Cheapest "
            "rate that meets the SLO") in " ".join(printed.split())  # the line wrapped at 160 columns, undone
    chart = out / f"serving_continuous_llama-8b_chat_256_accelerators_{SWEEP_ID}.png"
    assert chart.stat().st_size > 10_000
    page = (out / "index.html").read_text()
    assert "Serving (llm_inference load records)" in page and "32 requests/s at 21.87 J/request" in page
    assert page.count('src="data:image/png;base64,') == 4  # efficiency, energy, token energy, serving


def test_chart_draws_max_at_its_served_rate_with_the_slo_lines(sweep):
    _, rows, best = _section(sweep)
    fig = serving.serving_figure(rows, "t", best)
    ax_j, ax_ttft, ax_tpot = fig.axes
    p50 = next(line for line in ax_j.lines if line.get_label() == "J/request p50")
    assert list(p50.get_xdata()) == pytest.approx([4, 8, 16, 24, 32, _served_in_window("max")])
    assert [t.get_text() for t in ax_j.get_xticklabels()] == list(RATES)
    slo = next(line for line in ax_ttft.lines if line.get_label() == "SLO 1000 ms")
    assert list(slo.get_ydata()) == [1.0, 1.0]
    assert any(line.get_label() == "SLO 50 ms" for line in ax_tpot.lines)


def test_no_slo_chart_has_no_slo_line(sweep):
    for rate in RATES:
        _edit(sweep, rate, slo_ttft_ms=None, slo_tpot_ms=None)
    _, rows, _ = _section(sweep)
    fig = serving.serving_figure(rows, "t")
    assert not [line for ax in fig.axes for line in ax.lines if str(line.get_label()).startswith("SLO")]


def test_static_batch_records_have_no_serving_section(sweep, tmp_path):
    records = sorted(STATIC.rglob("run_record.json")) if STATIC.is_dir() else []
    if not records:
        pytest.skip("no static-batch llm_inference record committed")
    assert all(json.loads(p.read_text())["benchmark"] == "llm_inference" for p in records)
    assert all("rate" not in json.loads(p.read_text())["metrics"] for p in records)  # static batches
    write_report(records, tmp_path / "static")
    assert json.loads((tmp_path / "static" / "runs.json").read_text())["serving"] == []
    assert "Serving (llm_inference" not in (tmp_path / "static" / "index.html").read_text()
    # beside load records: the serving section holds the load records only
    write_report([*records, sweep], tmp_path / "mixed")
    (section,) = json.loads((tmp_path / "mixed" / "runs.json").read_text())["serving"]
    assert [r["offered rate"] for r in section["rows"]] == list(RATES) and section["cheapest_rate"] == "32"


def test_a_sweep_metered_on_the_cpu_is_a_group_of_its_own(sweep, tmp_path):
    """The same sweep once more, its headline from RAPL: two sentences and two charts, never one cheapest rate over
    the CPU's and the GPUs' joules; a rate without energy joins its sweep's group where that is one."""
    cpu = tmp_path / "cpu"
    shutil.copytree(sweep, cpu)
    for rate in RATES:
        path = cpu / f"rate_{rate}" / "run_record.json"
        data = json.loads(path.read_text())
        path.write_text(json.dumps({**data, "run_id": f"cpu-{rate}", "energy_domain": "cpu package + dram"}))
    _edit(sweep, "8", energy_wh=None)
    data = json.loads((sweep / "rate_8" / "run_record.json").read_text())
    for window in data["windows"]:
        window["energy"] = None
    (sweep / "rate_8" / "run_record.json").write_text(json.dumps({**data, "energy_domain": None}))
    (alone,) = serving.serving_groups(load_runs([sweep])).items()  # its sweep has one domain: the rate joins it
    assert alone[0][4] == "accelerators" and len(alone[1]) == 6
    groups = serving.serving_groups(load_runs([sweep, cpu]))  # two domains: the rate without energy stands apart
    assert [serving.group_title(k) for k in groups] == [
        f"continuous: llama-8b, chat, max concurrency 256, accelerators (sweep {SWEEP_ID})",
        f"continuous: llama-8b, chat, max concurrency 256, cpu package + dram (sweep {SWEEP_ID})",
        f"continuous: llama-8b, chat, max concurrency 256, energy n/a (sweep {SWEEP_ID})"]
    assert [len(rows) for rows in groups.values()] == [5, 6, 1]


def _set(sweep: Path, rate: str, **fields) -> None:
    """Top-level fields of a copied record (status, status_reason, config ...)."""
    path = sweep / f"rate_{rate}" / "run_record.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **fields}))


def test_a_run_that_did_not_end_ok_is_never_ranked_nor_joined_by_a_line(sweep):
    """A TIMEOUT rate keeps its measured figures in the table but is never the cheapest rate (issue 47): 32/s,
    the cheapest that meets the SLO, stopped by a time limit here."""
    _set(sweep, "32", status="TIMEOUT", status_reason="SIGTERM received: the load stopped with 3 requests in flight")
    sentence, rows, best = _section(sweep)
    assert best is not None and best.rate == "24" and "left out (not OK or rejected): 32 (TIMEOUT)" in sentence
    assert next(r for r in serving.table(rows) if r["offered rate"] == "32")["J/request p50"] == "21.87"
    ax_j = serving.serving_figure(rows, "t", best).axes[0]
    joined = next(line for line in ax_j.lines if line.get_label() == "J/request p50")
    assert 32 not in list(joined.get_xdata())
    lone = next(line for line in ax_j.lines if line.get_label() == "J/request p50, not OK (not joined)")
    assert list(lone.get_xdata()) == [32] and lone.get_linestyle() == "None"


def test_two_sweeps_of_one_setup_are_two_groups_never_joined(sweep, tmp_path):
    again = tmp_path / "again"
    shutil.copytree(sweep, again)
    for rate in RATES:
        path = again / f"rate_{rate}" / "run_record.json"
        data = json.loads(path.read_text())
        _set(again, rate, run_id=f"other-rate{rate}", config={**data["config"], "run_id": "other"})
    groups = serving.serving_groups(load_runs([sweep, again]))
    assert sorted(k[5] for k in groups) == sorted(["other", SWEEP_ID])
    assert all([r.rate for r in rows] == list(RATES) for rows in groups.values())


def test_a_long_server_log_stays_out_of_the_table_cell(sweep):
    log = "\n".join(f"server log line {k}" for k in range(15))
    reason = f"the server exited with code 1; the last lines of /runs/x/server.log:\n{log}"
    _set(sweep, "8", status="FAILED", status_reason=reason)
    _, rows, _ = _section(sweep)
    note = next(r for r in serving.table(rows) if r["offered rate"] == "8")["note"]
    assert note == ("the server exited with code 1; the last lines of /runs/x/server.log: (+15 line(s): see the "
                    "record's status_reason)")
    assert "server log line" not in note


def test_a_record_with_the_served_rate_is_read_as_recorded(sweep):
    """A record of this version carries offered and served rate and its overload note: the table shows them as
    they are; a goodput above the served rate cannot be true and is rejected."""
    _edit(sweep, "32", offered_requests_per_s=40.0, requests_per_s=15.0, goodput_requests_per_s=2.0,
          slo_attained_share=0.1, overload_note="overload: the queue never drained inside the window")
    _, rows, best = _section(sweep)
    row = next(r for r in serving.table(rows) if r["offered rate"] == "32")
    assert (row["offered req/s"], row["served req/s"], row["goodput req/s"]) == ("40", "15", "2")
    assert row["overload"].startswith("overload: the queue never drained")
    _edit(sweep, "32", goodput_requests_per_s=54.5)  # the old arithmetic: above what was served
    _, rows, best = _section(sweep)
    rejected = next(r for r in rows if r.rate == "32").rejected
    assert rejected is not None and "goodput 54.5 requests/s above the served rate 15" in rejected
    assert best is not None and best.rate == "24"
