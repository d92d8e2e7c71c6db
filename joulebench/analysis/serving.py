"""The serving section of `joulebench report`: llm_inference `load` records (continuous batching under an offered
request rate, one record per rate) as a table by rate, a chart of J/request and p90 TTFT / TPOT against the offered
rate with the SLO lines, and one sentence naming the cheapest rate that meets the SLO.

Load records are grouped by (engine, model, task, max_concurrency, energy domain, sweep): only rates of one sweep
(the invocation that ran them: its run id, `config.run_id`) of one engine setup metered on one kind of hardware are
compared and joined by a chart's lines (the engine: `continuous`, the in-process engine, or the server a record
names, e.g. `transformers`; the domain: joulebench.record.headline_domain, a rate without headline energy joining
its sweep's group where that is one). The cheapest rate is the one with the lowest J/request p50 among the OK rates
whose p90 TTFT <= slo_ttft_ms and p90 TPOT <= slo_tpot_ms (each record is judged against the SLOs it carries); a
rate that did not end OK (TIMEOUT, FAILED, ...) is never ranked nor joined by a line. A static-batch record has no
`rate` in its metrics and is not part of this section. A figure that is missing is n/a, never 0; a record whose
figures cannot be true (joulebench.figures, or a goodput above its served rate) shows `rejected` and is never the
cheapest rate.

Rates: `offered req/s` is what arrived, `served req/s` what the engine or server finished (the requests finished
inside the measured window over its length, llm_inference/load_plan.py); only the served rate is "achieved". A
record written before the served rate existed (no `offered_requests_per_s`) divided its request rate and goodput by
the arrivals' window: its served rate is recomputed from its request table (the requests that finished inside the
steady window over its length), its SLO share over the counted requests and its goodput as served rate x SLO share;
else n/a. A long status reason (a server's log) is cut to its first line in the table; the full text stays in the
record and the log file.
"""

from __future__ import annotations

import dataclasses
import html
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypedDict

from joulebench.figures import MAX_RATE, REJECTED, serving_problems
from joulebench.record import driver_metrics, headline_domain
from joulebench.record_types import LoadMetrics, RequestEnergyBlock, RequestsBlock
from jpwr.output import fmt

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from joulebench.analysis.runs import Run

LOAD_BENCHMARK = "llm_inference"
NO_SLO = "no SLO given: pass --slo-ttft-ms/--slo-tpot-ms to the load"
SHARES = ("prefill", "decode", "idle")


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) \
        and math.isfinite(value) else None


def load_metrics(run: Run) -> LoadMetrics:
    """A load record's metrics as a load's (record_types.metrics_type); empty for any other record."""
    return driver_metrics(run.record, LoadMetrics) or {}


def is_load_record(run: Run) -> bool:
    """An llm_inference `load` record: its metrics carry the offered rate (a static batch has none)."""
    return run.record.benchmark == LOAD_BENCHMARK and load_metrics(run).get("rate") is not None


class ServedRates(TypedDict):
    """A load record's offered and served rate, goodput and SLO share (requests/s, share; None: n/a), and the
    overload note (served_figures)."""

    offered: float | None
    served: float | None
    goodput: float | None
    slo_share: float | None
    overload: str | None


@dataclasses.dataclass
class RateRow:
    """One load record's serving figures; None is n/a."""

    run: Run
    rate: str  # the offered rate as recorded: "4", "max"
    offered: float | None  # requests/s; None for max (all requests queued at the start)
    offered_rps: float | None  # the counted arrivals over the arrivals' window, as measured
    served: float | None  # the counted requests finished over the served window: what was achieved
    overload: str | None  # the record's overload note
    j_per_token: float | None
    j_request_p50: float | None
    j_request_p90: float | None
    ttft_p90_s: float | None
    tpot_p90_s: float | None
    goodput: float | None
    slo_attained: float | None
    slo_ttft_ms: float | None
    slo_tpot_ms: float | None
    shares: dict[str, float | None]
    checks_failed: str | None  # the per-request model's failed checks (llm_inference/serving_energy.py), or "none"
    rejected: str | None

    @property
    def x(self) -> float | None:
        """Where the rate sits on the chart: the offered rate, `max` at its served request rate."""
        return self.served if self.offered is None else self.offered

    @property
    def ok(self) -> bool:
        """Ranked and joined by lines: an OK record whose figures are not rejected."""
        return self.run.record.status == "OK" and not self.rejected

    @property
    def has_slo(self) -> bool:
        return self.slo_ttft_ms is not None or self.slo_tpot_ms is not None

    def slo_misses(self) -> list[str] | None:
        """Why this rate misses its SLO ([] when it meets it); None when it cannot be judged (n/a figures)."""
        misses = []
        for name, value, limit in (("p90 TTFT", self.ttft_p90_s, self.slo_ttft_ms),
                                   ("p90 TPOT", self.tpot_p90_s, self.slo_tpot_ms)):
            if limit is None:
                continue
            if value is None:
                return None
            if value * 1000 > limit:
                misses.append(f"{name} {fmt(value * 1000, 4)} ms > {fmt(limit, 4)} ms")
        return misses


def rate_row(run: Run) -> RateRow:
    """The serving figures of one load record: metrics first, the requests block's energy where metrics lack them."""
    record = run.record
    m = load_metrics(run)
    energy = (record.requests or RequestsBlock()).get("energy") or RequestEnergyBlock()  # checked at reading
    per_request, shares = energy.get("energy_per_request_j") or {}, energy.get("shares") or {}
    rate = str(m.get("rate"))
    rates = NOT_COMPUTED if run.rejected else served_figures(run)  # a rejected record's window is not computed with
    problems = serving_problems(m, energy)
    served, goodput = _number(rates["served"]), _number(rates["goodput"])
    if served is not None and goodput is not None and goodput > served * (1 + 1e-9):
        problems.append(f"goodput {fmt(goodput, 4)} requests/s above the served rate {fmt(served, 4)}")
    rejected = run.rejected or (f"figures rejected: {'; '.join(problems)}" if problems else None)
    measured = run.usable and not rejected

    def get(value: Any) -> float | None:
        return _number(value) if measured else None

    return RateRow(
        run=run, rate=rate, offered=None if rate == MAX_RATE else _number(_float_or_none(rate)),
        offered_rps=get(rates["offered"]), served=get(served), overload=rates["overload"],
        j_per_token=get(m.get("energy_per_output_token_j")),
        j_request_p50=get(_first(m.get("energy_per_request_p50_j"), per_request.get("p50"))),
        j_request_p90=get(_first(m.get("energy_per_request_p90_j"), per_request.get("p90"))),
        ttft_p90_s=get(m.get("ttft_p90_s")), tpot_p90_s=get(m.get("tpot_p90_s")),
        goodput=get(goodput), slo_attained=get(rates["slo_share"]),
        slo_ttft_ms=_number(m.get("slo_ttft_ms")), slo_tpot_ms=_number(m.get("slo_tpot_ms")),
        shares={k: get(shares.get(k)) for k in SHARES},
        checks_failed=str(energy["checks_failed"]) if isinstance(energy.get("checks_failed"), str) else None,
        rejected=rejected)


NOT_COMPUTED = ServedRates(offered=None, served=None, goodput=None, slo_share=None, overload=None)


def served_figures(run: Run) -> ServedRates:
    """Offered and served rate, goodput, SLO share and overload note of a load record: as recorded where the record
    has the served rate; for an older record recomputed from its request table (module docstring), else n/a."""
    m = load_metrics(run)
    if "offered_requests_per_s" in m:
        return {"offered": m.get("offered_requests_per_s"), "served": m.get("requests_per_s"),
                "goodput": m.get("goodput_requests_per_s"), "slo_share": m.get("slo_attained_share"),
                "overload": m.get("overload_note")}
    offered = m.get("requests_per_s") if m.get("rate") != MAX_RATE else None  # the arrivals' window's own rate
    older = ServedRates(offered=offered, served=None, goodput=None, slo_share=None,
                        overload="an older record: its req/s and goodput were over the arrivals' window")
    served = _served_from_table(run)
    finished, counted, share = (_number(m.get(k)) for k in ("requests_finished", "requests_counted",
                                                              "slo_attained_share"))
    if served is None:
        return older
    met = None if share is None or finished is None else round(share * finished)  # its share: of the finished
    slo_share = None if met is None or not counted else met / counted
    return {**older, "served": served, "goodput": None if slo_share is None else served * slo_share,
            "slo_share": slo_share,
            "overload": "an older record: served rate, goodput and SLO share recomputed from its request table"}


def _served_from_table(run: Run) -> float | None:
    """The requests that finished inside the steady window over its length, from the record's request table; None
    where the table or the window cannot be read or none finished inside."""
    from joulebench.requests_table import read_requests

    block = run.record.requests if isinstance(run.record.requests, dict) else {}
    steady, name = run.record.window("steady"), block.get("file")
    if not isinstance(name, str) or steady is None or not steady.duration_s > 0:
        return None
    try:
        table = read_requests(run.path.parent / name)
        t0 = (steady.t_start_ns - int(table.attrs["start_ns"])) / 1e9
        finish = table.requests["finish_s"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    inside = int(((finish >= t0) & (finish < t0 + steady.duration_s)).sum())
    return inside / steady.duration_s if inside else None


def _first(value: Any, fallback: Any) -> Any:
    return fallback if value is None else value


def _float_or_none(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


GroupKey = tuple[str, str, str, str, str, str]
NO_DOMAIN = "energy n/a"  # a rate without headline energy: in its sweep's group where that has one domain


def sweep_of(run: Run) -> str:
    """The sweep a load record belongs to: the invocation's run id (`config.run_id`; a sweep's rates add
    `-rate<r>` to it in their own), else the directory that holds its rate directories."""
    given = run.record.config.get("run_id")
    return str(given) if isinstance(given, str) and given else str(run.path.parent.parent)


def group_key(run: Run) -> GroupKey:
    """Engine, model, task, max concurrency, the headline's energy domain and the sweep: a CPU and a GPU sweep, or
    two invocations, never share a sentence or a chart line."""
    config, m = run.record.config, load_metrics(run)
    engine = config.get("engine") or "engine n/a"
    model = config.get("model") or config.get("preset") or "model n/a"
    task = config.get("task") or m.get("task") or "task n/a"
    slots = m.get("max_concurrency", config.get("max_concurrency"))
    return (str(engine), str(model), str(task), fmt(slots) if _number(slots) is not None else "n/a",
            headline_domain(run.record) or NO_DOMAIN, sweep_of(run))


def group_title(key: GroupKey) -> str:
    return f"{key[0]}: {key[1]}, {key[2]}, max concurrency {key[3]}, {key[4]} (sweep {key[5]})"


def serving_groups(runs: Sequence[Run]) -> dict[GroupKey, list[RateRow]]:
    """Load records by (engine, model, task, max_concurrency, energy domain, sweep), each group's rows by offered
    rate, `max` last."""
    groups: dict[GroupKey, list[RateRow]] = {}
    for run in runs:
        if is_load_record(run):
            groups.setdefault(group_key(run), []).append(rate_row(run))
    for key in [k for k in groups if k[4] == NO_DOMAIN]:
        measured = [k for k in groups if k[:4] + k[5:] == key[:4] + key[5:] and k[4] != NO_DOMAIN]
        if len(measured) == 1:
            groups[measured[0]] += groups.pop(key)
    for rows in groups.values():
        rows.sort(key=lambda r: (r.offered is None, r.offered if r.offered is not None else 0.0, r.run.record.run_id))
    return dict(sorted(groups.items()))


def _ms(seconds: float | None) -> str:
    return "n/a" if seconds is None else fmt(seconds * 1000, 4)


def _pct(share: float | None) -> str:
    return "n/a" if share is None else fmt(100 * share, 3)


def _slo_text(rows: Sequence[RateRow]) -> str:
    parts = []
    for name, attr in (("p90 TTFT", "slo_ttft_ms"), ("p90 TPOT", "slo_tpot_ms")):
        limits = sorted({getattr(r, attr) for r in rows if getattr(r, attr) is not None})
        if limits:
            parts.append(f"{name} ≤ {' / '.join(fmt(v, 4) for v in limits)} ms")
    return ", ".join(parts)


def cheapest_sentence(rows: Sequence[RateRow]) -> tuple[str, RateRow | None]:
    """One sentence naming the cheapest rate that meets the SLO (lowest J/request p50), and that rate's row; only
    OK rates are ranked."""
    judged = [r for r in rows if r.ok]
    if not any(r.has_slo for r in judged):
        return NO_SLO + ".", None
    slo = _slo_text([r for r in judged if r.has_slo])
    meeting, missing, unjudged = [], [], []
    for row in judged:
        misses = row.slo_misses() if row.has_slo else None
        if misses is None:
            unjudged.append(row.rate)
        elif misses:
            missing.append(f"{row.rate} ({'; '.join(misses)})")
        else:
            meeting.append(row)
    priced = [r for r in meeting if r.j_request_p50 is not None]
    tail = []
    if missing:
        tail.append(f"missing it: {', '.join(missing)}")
    if unjudged:
        tail.append(f"not judged (no SLO or p90 latency n/a): {', '.join(unjudged)}")
    if meeting and len(priced) < len(meeting):
        tail.append(f"J/request n/a: {', '.join(r.rate for r in meeting if r.j_request_p50 is None)}")
    rejected = [f"{r.rate} ({r.run.record.status if not r.rejected else 'rejected'})"
                for r in rows if all(r is not j for j in judged)]
    if rejected:
        tail.append(f"left out (not OK or rejected): {', '.join(rejected)}")
    rest = f" ({'; '.join(tail)})" if tail else ""
    if not priced:
        return f"No rate meets the SLO ({slo}){rest}.", None
    best = min(priced, key=lambda r: math.inf if r.j_request_p50 is None else r.j_request_p50)  # priced: none None
    unit = "" if best.rate == MAX_RATE else " requests/s"
    return (f"Cheapest rate that meets the SLO ({slo}): {best.rate}{unit} at {fmt(best.j_request_p50, 4)} J/request "
            f"(p50), p90 TTFT {_ms(best.ttft_p90_s)} ms, p90 TPOT {_ms(best.tpot_p90_s)} ms; "
            f"meeting it: {', '.join(r.rate for r in meeting)}{rest}."), best


REASON_SHOWN = 160  # characters of a status reason in a table cell: a server's log stays in its file


def short_reason(reason: str | None) -> str:
    """A status reason for one table cell: its first line, cut to REASON_SHOWN characters, with how much more the
    record's status_reason holds (a server's log tail: its file is named in that first line)."""
    lines = [line for line in str(reason or "").splitlines() if line.strip()]
    if not lines:
        return ""
    first = " ".join(lines[0].split())
    cut = first if len(first) <= REASON_SHOWN else first[:REASON_SHOWN].rstrip() + "…"
    more = len(lines) - 1
    return f"{cut} (+{more} line(s): see the record's status_reason)" if more else cut


def table(rows: Sequence[RateRow]) -> list[dict[str, str]]:
    out = []
    for r in rows:
        if r.rejected:
            figures = {h: REJECTED for h in ("offered req/s", "served req/s", "J/output token", "J/request p50",
                                            "J/request p90", "p90 TTFT ms", "p90 TPOT ms", "goodput req/s",
                                            "SLO attained %", "prefill %", "decode %", "idle %")}
        else:
            figures = {"offered req/s": fmt(r.offered_rps, 4), "served req/s": fmt(r.served, 4),
                       "J/output token": fmt(r.j_per_token, 4),
                       "J/request p50": fmt(r.j_request_p50, 4), "J/request p90": fmt(r.j_request_p90, 4),
                       "p90 TTFT ms": _ms(r.ttft_p90_s), "p90 TPOT ms": _ms(r.tpot_p90_s),
                       "goodput req/s": fmt(r.goodput, 4), "SLO attained %": _pct(r.slo_attained),
                       **{f"{k} %": _pct(r.shares[k]) for k in SHARES}}
        note = r.rejected or (short_reason(r.run.record.status_reason) if r.run.record.status != "OK" else "")
        out.append({"offered rate": r.rate, **figures, "SLO TTFT ms": fmt(r.slo_ttft_ms, 4),
                    "SLO TPOT ms": fmt(r.slo_tpot_ms, 4), "model checks failed": r.checks_failed or "n/a",
                    "run_id": r.run.record.run_id, "status": r.run.record.status,
                    "overload": r.overload or "", "note": " ".join(str(note or "").split())})
    return out


def serving_figure(rows: Sequence[RateRow], title: str, best: RateRow | None = None) -> Figure:
    """J/request (p50, p90), p90 TTFT and p90 TPOT against the offered rate; `max` at its served rate; the SLO
    as a horizontal line on each latency axis; n/a is not drawn. Lines join the OK rates only; a usable rate that
    did not end OK (a TIMEOUT) is a lone grey cross."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(15, 4.8), layout="constrained")
    ax_j, ax_ttft, ax_tpot = fig.subplots(1, 3)
    drawn = [r for r in rows if r.ok and r.x is not None]
    apart = [r for r in rows if not r.ok and not r.rejected and r.run.usable and r.x is not None]
    panels = ((ax_j, (("J/request p50", lambda r: r.j_request_p50, "o-"),
                      ("J/request p90", lambda r: r.j_request_p90, "s--")), "energy per request (J)"),
              (ax_ttft, (("p90 TTFT", lambda r: r.ttft_p90_s, "o-"),), "p90 time to first token (s)"),
              (ax_tpot, (("p90 TPOT", lambda r: r.tpot_p90_s, "o-"),), "p90 time per output token (s)"))
    for ax, series, ylabel in panels:
        missing = 0
        for label, y_of, style in series:
            points = [(r.x, y_of(r)) for r in drawn]
            missing = max(missing, len(rows) - sum(1 for _, y in points if y is not None)
                          - sum(1 for r in apart if y_of(r) is not None))
            points = [(x, y) for x, y in points if y is not None]
            if points:
                xs, ys = zip(*points, strict=True)
                ax.plot(xs, ys, style, label=label)
            lone = [(r.x, y) for r in apart if (y := y_of(r)) is not None]
            if lone:
                xs, ys = zip(*lone, strict=True)
                ax.plot(xs, ys, "x", color="tab:gray", ls="none", label=f"{label}, not OK (not joined)")
        ax.set_ylabel(ylabel)
        ax.set_xlabel("offered rate (requests/s; max at its served rate)")
        ax.grid(alpha=0.3)
        if missing:
            ax.set_title(f"{missing} rate(s) n/a, not plotted", fontsize=8, loc="right")
    for ax, attr in ((ax_ttft, "slo_ttft_ms"), (ax_tpot, "slo_tpot_ms")):
        for limit in sorted({getattr(r, attr) for r in rows if getattr(r, attr) is not None}):
            ax.axhline(limit / 1000, color="tab:red", ls=":", label=f"SLO {fmt(limit, 4)} ms")
        if ax.lines and max(y for line in ax.lines for y in line.get_ydata()) > 20 * min(
                y for line in ax.lines for y in line.get_ydata()):
            ax.set_yscale("log")
    if best is not None and best.x is not None and best.j_request_p50 is not None:
        ax_j.scatter([best.x], [best.j_request_p50], s=160, facecolors="none", edgecolors="tab:green", lw=2,
                     label=f"cheapest meeting the SLO: {best.rate}", zorder=5)
    ticks = [(r.x, r.rate) for r in (*drawn, *apart)]
    for ax in (ax_j, ax_ttft, ax_tpot):
        if ticks:
            ax.set_xticks([x for x, _ in ticks], [label for _, label in ticks])
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
        elif not ax.lines:
            ax.text(0.5, 0.5, "no rate has this value (n/a)", ha="center", va="center", transform=ax.transAxes)
    fig.suptitle(f"serving: {title}: energy per request and latency against the offered request rate")
    return fig


def group_stem(key: GroupKey) -> str:
    safe = "".join(c if c.isalnum() or c in "-." else "_" for c in "_".join(key))
    return f"serving_{safe}"


def html_section(sections: Sequence[dict[str, Any]]) -> str:
    """The serving part of the page: per group its sentence, its table by rate (the chart is among the charts)."""
    if not sections:
        return ""
    parts = ["<h2>Serving (llm_inference load records)</h2><p>One row per offered request rate; `max` queues all "
             "requests at the start and is drawn at its served rate. Offered req/s is what arrived, served req/s "
             "what was finished over the served window (only that was achieved); goodput is over the served window "
             "too, the SLO share over every counted request. Only OK rates are ranked and joined by lines. "
             "J/request p50/p90 and the prefill/decode/idle shares come from the per-request attribution fit "
             "(docs/attribution.md); n/a marks a figure the record does not carry.</p>"]
    for section in sections:
        rows = section["rows"]
        head = list(rows[0]) if rows else []
        parts.append(f"<h3>{html.escape(section['group'])}</h3><p><b>{html.escape(section['sentence'])}</b></p>"
                     "<table><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in head) + "</tr>"
                     + "".join("<tr>" + "".join(f"<td>{html.escape(row[h])}</td>" for h in head) + "</tr>"
                               for row in rows) + "</table>")
    return "".join(parts)
