"""The attribution block as text: one table per estimator, closure and notes under it, n/a where no number."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from joulebench.analysis.text_width import fitted, table
from joulebench.record import RunRecord
from jpwr.output import fmt


def _interval(values: Sequence[float] | None, scale: float = 1.0, digits: int = 4) -> str:
    return "" if not values else f" [{fmt(values[0] * scale, digits)}, {fmt(values[1] * scale, digits)}]"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """The estimator's table, indented under its title (text_width.table); a column with an empty header (an absent
    option) is left out."""
    keep = [i for i, h in enumerate(header) if h]
    return table([header[i] for i in keep], [[r[i] for i in keep] for r in rows], indent="  ")


def _dynamic(row: dict[str, Any]) -> str:
    if "dynamic_reason" in row:
        return "n/a (note)"
    return fmt(row.get("dynamic_j"), 4) if "dynamic_j" in row else ""


def _dynamic_notes(rows: Sequence[dict[str, Any]]) -> list[str]:
    """Why a phase's dynamic energy is n/a, one note per phase under the table (a reason is too long for a cell)."""
    return [f"  note: {r['phase']}: dynamic J n/a: {r['dynamic_reason']}" for r in rows if "dynamic_reason" in r]


def _fit_lines(title: str, block: dict[str, Any]) -> list[str]:
    lines = [title, f"  how: {block['method']}"]
    if "unavailable_reason" in block:
        return [*lines, f"  n/a: {block['unavailable_reason']}"]
    lines[0] += (f" ({block['segments']} counter segments of ~{block['segment_s'] * 1e3:.0f} ms, knots "
                 f"±{block['knot_half_s'] * 1e3:.0f} ms, {len(block['devices'])} device(s))")
    dynamic = any("dynamic_j" in r for r in block["rows"])
    rows = []
    for r in block["rows"]:
        if r["status"] == "resolved":
            per_step = fmt(r.get("energy_per_step_j"), 4) + _interval(r.get("energy_per_step_j_interval"))
            rows.append([r["phase"], per_step,
                          fmt(None if r.get("share") is None else 100 * r["share"], 3)
                          + _interval(r.get("share_interval"), 100, 3),
                          fmt(r["mean_power_w"], 4) + _interval(r["mean_power_w_interval"]),
                          fmt(r.get("seconds_per_step"), 3), _dynamic(r) if dynamic else "", "resolved"])
        else:
            rows.append([r["phase"], "n/a", "n/a", "n/a", fmt(r.get("seconds_per_step"), 3), "",
                          f"below resolution: {r['reason']}"])
    header = ["phase", "J/step [95 %]", "share % [95 %]", "mean W [95 %]", "s/step", "dynamic J" if dynamic else "",
              "status"]
    lines += [*_table(header, rows), *_dynamic_notes(block["rows"])]
    closure = block["closure"]
    for i, fold in enumerate(closure["held_out"], 1):
        pct = 100 * fold["residual_j"] / fold["measured_j"] if fold["measured_j"] else None
        verdict = "closes" if fold["status"] == "closes" else "MISFIT"
        lines.append(f"  held-out fold {i}: measured {fmt(fold['measured_j'], 6)} J, predicted "
                     f"{fmt(fold['predicted_j'], 6)} J, residual {fmt(fold['residual_j'], 3)} J ({fmt(pct, 2)} %), "
                     f"bound ±{fmt(fold['bound_j'], 3)} J: {verdict}")
    if closure.get("reason"):
        lines.append(f"  misfit: {closure['reason']}")
    own = closure["in_sample"]
    lines.append(f"  in-sample (not the test): fitted {fmt(own['fitted_j'], 6)} J vs window {fmt(own['measured_j'], 6)}"
                 f" J ± {fmt(own['bound_j'], 3)} J")
    lines += [f"  note: {n}" for n in block.get("notes", [])]
    return lines


def _replay_lines(block: dict[str, Any]) -> list[str]:
    lines = ["replay", f"  how: {block['method']}"]
    if "unavailable_reason" in block:
        return [*lines, f"  n/a: {block['unavailable_reason']}"]
    dynamic = any("dynamic_j" in r for r in block["rows"])
    rows = []
    for r in block["rows"]:
        if "energy_per_step_j" not in r:
            rows.append([r["phase"], "n/a", "n/a", "n/a", "n/a", "", f"{r['status']}: {r.get('note', '')}"])
            continue
        rows.append([r["phase"], f"{fmt(r['energy_per_step_j'], 4)} ± {fmt(r['error_bound_j'], 2)}",
                      fmt(None if r.get("share_of_step") is None else 100 * r["share_of_step"], 3),
                      fmt(r["mean_power_w"], 4), fmt(r["seconds_per_step"], 3), _dynamic(r) if dynamic else "",
                      r["status"] + (f" ({r['note']})" if r.get("note") else "")])
    header = ["phase", "J/invocation", "% of step", "mean W", "s/invocation", "dynamic J" if dynamic else "", "status"]
    if rows:
        lines += [*_table(header, rows), *_dynamic_notes(block["rows"])]
    check = block.get("sum_vs_step")
    if check:
        verdict = "closes" if check["status"] == "closes" else "MISFIT"
        lines.append(f"  forward + backward + optimizer = {fmt(check['sum_j'], 5)} J vs whole step "
                     f"{fmt(check['step_j'], 5)} J: residual {fmt(check['residual_j'], 3)} J, bound "
                     f"±{fmt(check['bound_j'], 3)} J: {verdict}")
    lines += [f"  note: {n}" for n in block.get("notes", [])]
    return lines


def _window_lines(block: dict[str, Any]) -> list[str]:
    lines = ["inference (prefill and decode)", f"  how: {block['method']}"]
    if "unavailable_reason" in block:
        return [*lines, f"  n/a: {block['unavailable_reason']}"]
    dynamic = any("dynamic_j" in r for r in block["rows"])
    rows = [[r["phase"], f"{fmt(r['energy_j'], 5)} ± {fmt(r['error_bound_j'], 2)}", fmt(100 * r["share"], 3),
              fmt(r["mean_power_w"], 4), fmt(r["seconds"], 4), _dynamic(r) if dynamic else "", r["status"]]
             for r in block["rows"]]
    header = ["phase", "J", "share %", "mean W", "s", "dynamic J" if dynamic else "", "status"]
    return [*lines, *_table(header, rows), *_dynamic_notes(block["rows"])]


def render(record: RunRecord, block: dict[str, Any]) -> str:
    head = f"joulebench attribute: {record.benchmark} run {record.run_id}"
    if block.get("energy_domain"):  # on the first line: a replayed trace's label must not be wrapped away
        head += f"; energy of {block['energy_domain']}"
    window = f"  window {block['window']}"
    if block.get("window_energy_j") is not None:
        window += (f" ({fmt(block['window_duration_s'], 4)} s, {block['steps']} steps, "
                   f"{fmt(block['window_energy_j'], 6)} J ± {fmt(block['window_error_bound_j'], 3)} J)")
    if block.get("idle_power_w_per_device") is not None:
        window += (f"; idle {fmt(block['idle_power_w_per_device'], 4)} W per device from {block.get('idle_source')} "
                   "(dynamic = energy − idle × time)")
    elif str(block.get("idle_source") or "").startswith("no dynamic energy"):  # joulebench.analysis.plausible
        window += f"; dynamic J n/a: {block['idle_source'].removeprefix('no dynamic energy: ')}"
    lines = [head, window, "estimators are reported side by side and never mixed"]
    renderers = {"fit": lambda b: _fit_lines("fit (phases)", b), "fit_kernel_classes":
                 lambda b: _fit_lines("fit (kernel classes)", b), "replay": _replay_lines, "windows": _window_lines}
    for name, estimator in block["estimators"].items():
        lines += ["", *renderers[name](estimator)]
    return fitted(lines)
