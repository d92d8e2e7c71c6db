"""`joulebench report PATH... -o OUTDIR`: charts, a table and an offline HTML page over many run records.

Throughput and work per Wh per system and batch size answer "which setup is cheaper per token";
energy per unit against utilisation and mean power, and the pairwise diagnosis, answer "why".
PATH is a JUBE run directory (run_record.json files are found recursively) or run record files.
Traces next to a record (<record dir>/jpwr/<node>/, <record dir>/energy/<node>/) supply the latent
metrics of the steady window. A missing energy figure is shown as n/a and never plotted as 0.

    joulebench report jube/runs/llm -o report/
    joulebench report --compare runA/run_record.json runB/run_record.json
"""

from __future__ import annotations

import base64
import html
import json
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from joulebench.analysis import serving
from joulebench.analysis.diagnose import Diagnosis, diagnose, percent, work_unit
from joulebench.analysis.energy_domain import require_one_domain
from joulebench.analysis.plot import save_figure
from joulebench.analysis.runs import Run, load_runs
from joulebench.analysis.text_width import fitted
from joulebench.disturbed import summary as disturbed_summary
from joulebench.figures import REJECTED, fraction_problem, unit_figure
from joulebench.out_dir import one_writer
from joulebench.reasons import Footnotes
from joulebench.record import RECORD_FILE, RunRecord
from joulebench.record_types import FootprintBlock
from jpwr import ExitCode, ValidationError
from jpwr.errors import ArgumentParser
from jpwr.output import fmt, printable, readable, utc_now, write_atomic

if TYPE_CHECKING:  # matplotlib is an extra (reports): imported when drawing, so --help works without it
    from matplotlib.figure import Figure

TOKEN_ENERGY_UNIT = "output_tokens"  # inference records: J per token against batch size gets its own chart


# ---- table -----------------------------------------------------------------------------------------------
def _partial(record: RunRecord, name: str, allow_partial: bool) -> str:
    """A PARTIAL run's figure from its covered time: n/a unless asked for, and then labelled."""
    value = unit_figure(record, f"partial_{name}") if allow_partial else None
    return "n/a" if value is None else f"{readable(value)} (partial)"


def table_rows(runs: Sequence[Run], allow_partial: bool = False) -> list[dict[str, str]]:
    """One row per run, text only; n/a (with the reason in the note) wherever a value is missing, `rejected`
    (with the reason in the note) wherever the record's figures cannot be true."""
    rows = []
    for run in runs:
        if run.rejected:
            rows.append(_rejected_row(run))
            continue
        m, cost = run.record.metrics, run.cost
        unit = work_unit(run.record)
        energy_unit = cost.energy_per_unit_j
        partial = run.record.status == "PARTIAL"
        util = run.latents.get("utilization_gpu")
        sm = run.latents.get("sm_clock_hz")
        note = serving.short_reason(run.record.status_reason) if run.record.status != "OK" else (cost.reason or "")
        note = "; ".join(part for part in (disturbed_summary(run.record.disturbed), note) if part)
        rows.append({
            "benchmark": run.record.benchmark, "system": run.system, "run_id": run.record.run_id,
            "status": run.record.status, "device": str(run.record.hardware.get("device_name") or "n/a"),
            "devices": fmt(cost.devices), "batch size": fmt(cost.batch_size), "unit": unit,
            "per s": readable(unit_figure(run.record, "{unit}_per_s")),
            "per s per device": readable(unit_figure(run.record, "{unit}_per_s_per_device")),
            "per Wh": (_partial(run.record, "{unit}_per_wh", allow_partial) if partial
                       else readable(unit_figure(run.record, "{unit}_per_wh"))),
            "J per unit": readable(energy_unit),
            "mean W per device": (_partial(run.record, "mean_power_w_per_device", allow_partial) if partial
                                  else readable(m.get("mean_power_w_per_device"))),
            "GPU util %": fmt(None if util is None else 100 * util, 3),
            "SM MHz": fmt(None if sm is None else sm / 1e6, 4), "method": str(m.get("energy_method") or "n/a"),
            "energy domain": run.domain or "n/a", "coverage %": percent(m.get("energy_coverage")),
            "bound J": fmt(m.get("energy_error_bound_j"), 3), **footprint_cells(run.record),
            "note": " ".join(str(note or "").split()),
        })
    return rows


def footprint_cells(record: RunRecord) -> dict[str, str]:
    """The record's `footprint` (carbon and cost of the run, from the site profile by jube/jbfootprint.py) as
    `value ± bound`, labelled estimate; n/a where the profile gave no value or the record has no block."""
    block = record.footprint or FootprintBlock()
    currency = f" {block['currency']}" if block.get("currency") else ""

    def cell(value: float | None, bound: float | None, unit: str) -> str:
        return "n/a" if value is None else f"{readable(value)} ± {readable(bound)}{unit}"

    return {"g CO2e (estimate)": cell(block.get("g_co2e"), block.get("g_co2e_error_bound"), ""),
            "cost (estimate)": cell(block.get("cost"), block.get("cost_error_bound"), currency)}


def _rejected_row(run: Run) -> dict[str, str]:
    """The row of a run whose figures cannot be true: what identifies it, `rejected` for its figures, the reason."""
    cost = run.cost
    return {"benchmark": run.record.benchmark, "system": run.system, "run_id": run.record.run_id,
            "status": run.record.status, "device": str(run.record.hardware.get("device_name") or "n/a"),
            "devices": fmt(cost.devices), "batch size": fmt(cost.batch_size), "unit": work_unit(run.record),
            "per s": REJECTED, "per s per device": REJECTED, "per Wh": REJECTED, "J per unit": REJECTED,
            "mean W per device": REJECTED, "GPU util %": "n/a", "SM MHz": "n/a", "method": REJECTED,
            "energy domain": run.domain or "n/a", "coverage %": REJECTED, "bound J": REJECTED,
            "g CO2e (estimate)": REJECTED, "cost (estimate)": REJECTED, "note": str(run.rejected)}


# ---- charts ----------------------------------------------------------------------------------------------
def _by_series(runs: Sequence[Run]) -> dict[str, list[Run]]:
    groups: dict[str, list[Run]] = {}
    for run in sorted(runs, key=lambda r: (r.series, r.cost.batch_size or 0)):
        groups.setdefault(run.series, []).append(run)
    return groups


def _plot_series(ax, runs: Sequence[Run], y_of, ylabel: str) -> None:
    """Lines over batch size per series; bars per run when no run recorded a batch size. n/a is never drawn."""
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    if all(r.cost.batch_size is None for r in runs):
        _plot_bars(ax, runs, y_of)
        return
    missing = 0
    for name, group in _by_series(runs).items():
        points = [(r.cost.batch_size, y_of(r)) for r in group]
        missing += sum(1 for x, y in points if x is None or y is None)
        points = [(x, y) for x, y in points if x is not None and y is not None]
        if points:
            xs, ys = zip(*points, strict=True)
            means = {x: sum(y for px, y in points if px == x) / xs.count(x) for x in sorted(set(xs))}
            (line,) = ax.plot(list(means), list(means.values()), marker="o", label=name)
            if len(means) < len(points):  # repeats: each run as a dot, the line through their mean
                ax.scatter(xs, ys, s=12, color=line.get_color(), alpha=0.6)
    ax.set_xlabel("global batch size" + (" (line: mean of repeated runs)" if any(ax.collections) else ""))
    _note_missing(ax, missing)


def _plot_bars(ax, runs: Sequence[Run], y_of) -> None:
    measured = [(r, y_of(r)) for r in runs]
    shown = [(r, y) for r, y in measured if y is not None]
    ax.bar([r.label for r, _ in shown], [y for _, y in shown], color=[f"C{i % 10}" for i in range(len(shown))])
    ax.tick_params(axis="x", labelrotation=20, labelsize=7)
    ax.set_xlabel("run (no batch size recorded)")
    _note_missing(ax, len(measured) - len(shown))


def _note_missing(ax, missing: int) -> None:
    if missing:
        ax.set_title(f"{missing} run(s) n/a, not plotted", fontsize=8, loc="right")
    if not ax.lines and not ax.collections and not ax.patches:
        ax.text(0.5, 0.5, "no run has this value (n/a)", ha="center", va="center", transform=ax.transAxes)
    elif ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)


def efficiency_figure(runs: Sequence[Run], benchmark: str) -> Figure:
    """Throughput and work per Wh against batch size, one line per system and device count."""
    unit = work_unit(runs[0].record)
    from matplotlib.figure import Figure

    fig = Figure(figsize=(12, 4.8), layout="constrained")
    ax_rate, ax_wh = fig.subplots(1, 2)
    _plot_series(ax_rate, runs, lambda r: r.metric(f"{unit}_per_s"), f"{unit}/s (all devices)")
    _plot_series(ax_wh, runs, lambda r: r.metric(f"{unit}_per_wh"), f"{unit}/Wh (accelerator energy)")
    fig.suptitle(f"{benchmark}: throughput and energy efficiency of the steady window")
    return fig


def energy_figure(runs: Sequence[Run], benchmark: str) -> Figure:
    """Energy per unit against mean GPU utilisation and against mean power per device."""
    unit = work_unit(runs[0].record)
    from matplotlib.figure import Figure

    fig = Figure(figsize=(12, 4.8), layout="constrained")
    ax_util, ax_power = fig.subplots(1, 2)
    panels = (
        (ax_util, lambda r: None if "utilization_gpu" not in r.latents else 100 * r.latents["utilization_gpu"],
         "mean GPU utilisation in the steady window (%)"),
        (ax_power, lambda r: r.metric("mean_power_w_per_device"), "mean power per device (W)"),
    )
    for ax, x_of, xlabel in panels:
        missing = 0
        for name, group in _by_series(runs).items():
            points = [(x_of(r), r.cost.energy_per_unit_j if r.usable else None, r) for r in group]
            missing += sum(1 for x, y, _ in points if x is None or y is None)
            points = [(x, y, r) for x, y, r in points if x is not None and y is not None]
            if points:
                xs, ys, _ = zip(*points, strict=True)
                ax.scatter(xs, ys, label=name)
                for x, y, run in points:  # which point is which run: its batch size, else its run id
                    tag = f"batch {fmt(run.cost.batch_size)}" if run.cost.batch_size else run.record.run_id
                    ax.annotate(tag, (x, y), xytext=(4, 4), textcoords="offset points", fontsize=7)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(f"energy per {unit[:-1]} (J)")
        ax.grid(alpha=0.3)
        _note_missing(ax, missing)
    fig.suptitle(f"{benchmark}: where the joules per {unit[:-1]} go")
    return fig


def token_energy_figure(runs: Sequence[Run], benchmark: str) -> Figure:
    """Inference (work unit output_tokens): J per output token of whole generations and J per decode token,
    against batch size; the decode figure is the driver's prefill-subtracted estimate (llm_inference)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(12, 4.8), layout="constrained")
    ax_all, ax_decode = fig.subplots(1, 2)
    _plot_series(ax_all, runs, lambda r: r.cost.energy_per_unit_j if r.usable else None,
                 "J per output token (prefill + decode)")
    _plot_series(ax_decode, runs, lambda r: r.metric("decode_energy_per_token_j"), "J per decode token")
    for ax in (ax_all, ax_decode):
        if ax.lines:  # batch sizes sweep in powers of two
            ax.set_xscale("log", base=2)
    fig.suptitle(f"{benchmark}: accelerator energy per generated token of the steady window")
    return fig


def _attribution_bars(run: Run) -> list[tuple[str, list[tuple[str, float]], str]]:
    """(bar label, [(phase, share)], what the rest is) per estimator of a run's attribution block, never mixed."""
    block = (run.record.attribution or {}) if not run.rejected else {}  # shares of figures that cannot be true
    bars = []
    for name, estimator in block.get("estimators", {}).items():
        rows = estimator.get("rows") or []
        key = "share_of_step" if name == "replay" else "share"
        parts = [(r["phase"], float(r[key])) for r in rows
                 if r.get(key) is not None and fraction_problem(key, r[key]) is None]
        if parts:
            rest = "rest of the step (unmarked work, misfit)" if name == "replay" else "below resolution or n/a"
            bars.append((f"{run.label}\n{name}", parts, rest))
    return bars


def attribution_figure(runs: Sequence[Run], benchmark: str) -> Figure | None:
    """A stacked bar per run and estimator: each phase's share of the window (fit) or of the step (replay)."""
    from matplotlib.figure import Figure

    bars = [bar for run in runs for bar in _attribution_bars(run)]
    if not bars:
        return None
    fig = Figure(figsize=(12, 1.2 + 0.6 * len(bars)), layout="constrained")
    ax = fig.subplots()
    colours: dict[str, str] = {}
    for y, (_label, parts, rest) in enumerate(bars):
        left = 0.0
        for phase, share in parts:
            new = phase not in colours
            colour = colours.setdefault(phase, f"C{len(colours) % 10}")
            ax.barh(y, 100 * share, left=100 * left, color=colour, label=phase if new else None)
            left += share
        if left < 1:
            new = rest not in colours
            colours.setdefault(rest, "0.85")
            ax.barh(y, 100 * (1 - left), left=100 * left, color="0.85", hatch="//", label=rest if new else None)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_yticks(range(len(bars)), [label for label, _, _ in bars], fontsize=7)
    ax.set_xlabel("share of the window's energy (fit) or of one step (replay), %")
    ax.set_xlim(0, 100)
    fig.suptitle(f"{benchmark}: where the joules go (joulebench attribute; estimators never mixed)")
    return fig


# ---- diagnosis -------------------------------------------------------------------------------------------
def compare_runs(a: Run, b: Run) -> Diagnosis:
    """The diagnosis of B against A, naming either side that was disturbed (its difference may be the
    disturbance's)."""
    diagnosis = diagnose(a.cost, b.cost, a.latents, b.latents)
    for run in (a, b):
        text = disturbed_summary(run.record.disturbed)
        if text:
            diagnosis.sentences.append(f"{run.cost.label} was {text} (the difference may be the disturbance's).")
    return diagnosis


def extreme_pair(runs: Sequence[Run]) -> tuple[Run, Run] | None:
    """The cheapest and the dearest run per unit (among runs with energy, of one energy domain): the spread worth
    explaining."""
    measured = [(cost, r) for r in runs
                if r.usable and r.record.status != "PARTIAL" and (cost := r.cost.energy_per_unit_j) is not None]
    if len(measured) < 2:
        return None
    ordered = sorted(measured, key=lambda pair: pair[0])
    return ordered[0][1], ordered[-1][1]


# ---- HTML ------------------------------------------------------------------------------------------------
def _image_tag(path: Path, alt: str) -> str:
    data = base64.b64encode(path.read_bytes()).decode()
    return f'<figure><img alt="{html.escape(alt)}" src="data:image/png;base64,{data}"><figcaption>' \
           f'{html.escape(alt)} ({html.escape(path.name)})</figcaption></figure>'


def render_html(rows: Sequence[dict[str, str]], images: Sequence[tuple[Path, str]],
                diagnoses: Sequence[tuple[str, Diagnosis]], sources: Sequence[Path],
                serving_sections: Sequence[dict[str, Any]] = ()) -> str:
    head = list(rows[0]) if rows else []
    notes = Footnotes()  # a long note once, under the table; each row its head and mark
    rows = [{**row, "note": notes.mark(row["note"])} for row in rows]
    table = "<table><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in head) + "</tr>" + "".join(
        "<tr>" + "".join(f"<td>{html.escape(row[h])}</td>" for h in head) + "</tr>" for row in rows) + "</table>"
    table += "".join(f'<p class="note">[{n}] {html.escape(text)}</p>' for n, text in notes.numbered())
    diag = "".join(f"<h3>{html.escape(title)}</h3><ul>" + "".join(f"<li>{html.escape(s)}</li>" for s in d.sentences)
                   + "</ul>" for title, d in diagnoses) or "<p>Fewer than two runs with energy: nothing to compare.</p>"
    return printable(f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>joulebench report</title>
<style>body{{font-family:sans-serif;margin:2em;max-width:1400px}}table{{border-collapse:collapse;font-size:12px}}
td,th{{border:1px solid #bbb;padding:3px 6px;text-align:right}}th{{background:#eee}}img{{max-width:100%}}
figure{{margin:1em 0}}</style></head><body>
<h1>joulebench report</h1>
<p>Generated {html.escape(utc_now())} from {len(rows)} run record(s) under {html.escape(', '.join(map(str, sources)))}.
All figures are of the steady window; energy is the total (not above idle) of the domain its column names (the
accelerators, or CPU packages and DRAM where a machine has no accelerator sensor), with method, coverage and the
estimator's bound; runs of different domains are never joined, ranked or diagnosed together. n/a marks a value
that was not measured (the note says why); it is never plotted as 0.</p>
<h2>Runs</h2>{table}
{serving.html_section(serving_sections)}
<h2>Charts</h2>{''.join(_image_tag(p, alt) for p, alt in images)}
<h2>Where the joules go</h2>
<p>Energy per unit of work is time per unit × mean power, so the difference between two runs splits exactly into
ΔE = Δt·(P̄₁+P̄₂)/2 + ΔP̄·(t₁+t₂)/2; the latent metrics are means over the steady window of each run's trace.</p>
{diag}
</body></html>
""")


def write_report(paths: Sequence[Path], out_dir: Path, allow_partial: bool = False) -> Path:
    """Charts (PNG files in OUTDIR, also embedded in the page), the table and the diagnoses: OUTDIR/index.html.
    PARTIAL runs never enter a diagnosis (their energy covers part of the window only)."""
    return write_runs(load_runs(paths), paths, out_dir, allow_partial)[0]


def write_runs(runs: Sequence[Run], paths: Sequence[Path], out_dir: Path, allow_partial: bool = False
               ) -> tuple[Path, list[dict[str, Any]]]:
    """write_report over runs already read (load_runs), and the serving sections it wrote: the report's files are
    written by one report at a time (another report into the same OUTDIR waits for it), so that they always belong to
    one report."""
    with one_writer(out_dir, "joulebench report"):
        return _write_files(runs, paths, out_dir, allow_partial)


def _write_files(runs: Sequence[Run], paths: Sequence[Path], out_dir: Path, allow_partial: bool
                 ) -> tuple[Path, list[dict[str, Any]]]:
    images: list[tuple[Path, str]] = []
    diagnoses: list[tuple[str, Diagnosis]] = []
    for benchmark in sorted({r.record.benchmark for r in runs}):
        group = [r for r in runs if r.record.benchmark == benchmark]
        charts = [("efficiency", efficiency_figure, "throughput and work per Wh per system and batch size"),
                  ("energy", energy_figure, "energy per unit vs utilisation and mean power")]
        if work_unit(group[0].record) == TOKEN_ENERGY_UNIT:
            charts.append(("token_energy", token_energy_figure,
                           "J per output token and per decode token vs batch size"))
        for stem, build, alt in charts:
            images.append((save_figure(build(group, benchmark), out_dir / f"{stem}_{benchmark}.png"),
                           f"{benchmark}: {alt}"))
        attribution = attribution_figure(group, benchmark)
        if attribution is not None:
            images.append((save_figure(attribution, out_dir / f"attribution_{benchmark}.png"),
                           f"{benchmark}: energy per phase (joulebench attribute)"))
        for domain in sorted({r.domain for r in group if r.domain}):  # never ranked across energy domains
            same = [r for r in group if r.domain == domain]
            pair = extreme_pair(same)
            if not pair:
                continue
            left_out = [r.label for r in same if r.record.status == "PARTIAL"]
            title = f"{benchmark}, energy of {domain}: {pair[1].label} vs {pair[0].label}"
            if left_out:
                title += f" (PARTIAL runs left out of the diagnosis: {', '.join(left_out)})"
            diagnoses.append((title, compare_runs(*pair)))
    serving_sections = []
    for key, rate_rows in serving.serving_groups(runs).items():  # llm_inference load records, by rate
        title = serving.group_title(key)
        sentence, best = serving.cheapest_sentence(rate_rows)
        chart = save_figure(serving.serving_figure(rate_rows, title, best), out_dir / f"{serving.group_stem(key)}.png")
        images.append((chart, f"serving {title}: J/request and p90 TTFT/TPOT against the offered rate, SLO lines"))
        serving_sections.append({"group": title, "sentence": sentence, "chart": chart.name,
                                 "cheapest_rate": None if best is None else best.rate,
                                 "rows": serving.table(rate_rows)})
    rows = table_rows(runs, allow_partial)
    write_atomic(out_dir / "runs.json", json.dumps(
        {"rows": rows, "diagnoses": [{"title": t, **d.to_dict()} for t, d in diagnoses],
         "serving": serving_sections}, indent=2))
    return (write_atomic(out_dir / "index.html", render_html(rows, images, diagnoses, paths, serving_sections)),
            serving_sections)


def _single(path: Path) -> Run:
    runs = load_runs([path])
    if len(runs) != 1:
        raise ValidationError(f"{path} holds {len(runs)} run records, --compare needs exactly one per side",
                              f"pass the {RECORD_FILE} file itself")
    return runs[0]


def main(argv: Sequence[str]) -> int:
    if "--pareto" in argv:
        from joulebench.analysis.pareto import main as pareto_main

        return pareto_main(argv)
    parser = ArgumentParser(prog="joulebench report",
                            description="Charts, table and diagnosis over run records.")
    parser.add_argument("paths", nargs="*", type=Path, help="JUBE run directories or run_record.json files")
    parser.add_argument("--pareto", action="store_true", help="a power-limit / clock sweep: Pareto front and "
                                                              "waste-free point (joulebench report --pareto --help)")
    parser.add_argument("-o", "--out", type=Path, default=None, help="output directory (index.html and PNGs)")
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("A", "B"),
                        help="print why run B costs more or less energy per unit than run A")
    parser.add_argument("--allow-partial", action="store_true",
                        help="show PARTIAL runs' figures from the time their energy covers, labelled (partial)")
    args = parser.parse_args(argv)
    if args.compare:
        a, b = (_single(p) for p in args.compare)
        require_one_domain([a.record, b.record], "joulebench report --compare")
        partial = [run for run in (a, b) if run.record.status == "PARTIAL"]
        if partial:
            for run in partial:
                print(fitted([f"joulebench report: {run.label} is PARTIAL ({run.record.status_reason}): "
                              "left out of the diagnosis"]))
            return ExitCode.OK
        print(fitted(compare_runs(a, b).text().splitlines()))
        return ExitCode.OK
    if args.out is None:
        raise ValidationError("no output directory given", "pass -o OUTDIR (or --compare A B to compare two runs)")
    runs = load_runs(args.paths)
    index, sections = write_runs(runs, args.paths, args.out, args.allow_partial)
    for section in sections:
        print(fitted([f"joulebench report: serving, {section['group']}: {section['sentence']}"]))
    print(f"joulebench report: wrote {index}")
    print(fitted([next_step(runs)]))
    return ExitCode.OK


def next_step(runs: Sequence[Run]) -> str:
    """The command after a report: the quick start's next, attribute (one run with energy), or a comparison (two or
    more: which two is the reader's choice); or why neither can run on these records."""
    measured = [run for run in runs if run.unreadable is None and run.record.metrics.get("energy_wh") is not None]
    if not measured:
        return ("next: no run here has energy (no sensor where it ran: `joulebench doctor` names this machine's); "
                "`joulebench demo` shows plot and attribute on a recorded trace")
    if len(measured) == 1:
        return f"next: joulebench attribute {shlex.quote(str(measured[0].path.parent))} (its energy per phase)"
    return ("next: joulebench report --compare RUN_A RUN_B (why one run of a workload costs more energy per unit), "
            "joulebench attribute RUN_DIR (its energy per phase)")
