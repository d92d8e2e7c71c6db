"""`joulebench report --pareto RUNS...`: a power-limit / clock sweep as time per step against energy per unit of work.

Every figure here is measured (each run's steady window; a replayed trace's energy is called so, never
measured); nothing is predicted. Per run: the requested setting, what
the devices read back, the observed mean SM clock (from the run's trace, where kept), mean power, time per step and
energy per unit, and the slowdown and saving against the sweep's default-setting row (the mean of its default runs).
A saving is named only beyond the two sides' combined bounds (joulebench.savings), else it reads "within bounds".
The Pareto front is the set of runs no other run beats in both time and energy; the waste-free point is the run with
the least energy per unit whose slowdown stays within --max-slowdown (default 1 %) and whose saving is beyond the
bounds (else a default run). Runs whose energy cannot be
trusted (FAILED, energy n/a, coverage below --min-coverage, energy covering other devices than the run's) are left
out of the front and named with the reason.

    joulebench report --pareto jube/runs/llm/000012 [--max-slowdown 1%] [-o OUTDIR] [--wide]
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

from joulebench.analysis.diagnose import percent, work_unit
from joulebench.analysis.energy_domain import provenance, require_one_domain
from joulebench.analysis.recommend import FrontMarks, front_marks
from joulebench.analysis.runs import SERIES_CONFIG_KEYS, Run, load_runs
from joulebench.analysis.sweep import DEFAULT_MIN_COVERAGE, exclusion, parse_fraction
from joulebench.analysis.text_width import fitted
from joulebench.analysis.text_width import table as text_table
from joulebench.arguments import FRACTION, state_ranges
from joulebench.device_settings.record import RecordedSettings, recorded_settings
from joulebench.savings import Saving
from joulebench.savings import saving as bounded_saving
from jpwr import ExitCode, ValidationError
from jpwr.errors import ArgumentParser
from jpwr.output import fmt, readable

DEFAULT_MAX_SLOWDOWN = 0.01


@dataclasses.dataclass(frozen=True, eq=False)
class SweepPoint:
    """One run of the sweep, with its figures or the reason it is left out."""

    run: Run
    settings: RecordedSettings
    time_per_step_s: float | None
    time_per_unit_s: float | None
    energy_per_unit_j: float | None
    excluded: str | None  # why the energy cannot be trusted; None = on the chart

    @property
    def name(self) -> str:
        return self.run.record.run_id

    @property
    def cost(self) -> tuple[float, float]:
        """(time, energy) per unit of a trusted point (both measured, else it would be excluded)."""
        assert self.excluded is None and self.time_per_unit_s is not None and self.energy_per_unit_j is not None
        return self.time_per_unit_s, self.energy_per_unit_j


@dataclasses.dataclass(frozen=True)
class Baseline:
    time_per_unit_s: float
    energy_per_unit_j: float
    runs: tuple[str, ...]
    energy_bound: float | None = None  # relative; a mean's bound is at most its runs' largest (None: one is n/a)


def sweep_points(runs: Sequence[Run], min_coverage: float = DEFAULT_MIN_COVERAGE) -> list[SweepPoint]:
    """The runs as one sweep; runs of different workloads are refused (a front across them means nothing)."""
    def workload(run: Run) -> tuple[Any, ...]:
        config = run.record.config
        return (run.record.benchmark, work_unit(run.record), run.cost.devices, run.cost.batch_size,
                *(config.get(k) for k in SERIES_CONFIG_KEYS))

    kinds: dict[tuple[Any, ...], list[str]] = {}
    for run in runs:
        if run.rejected:  # its figures cannot be true, its workload neither: excluded below, named
            continue
        kinds.setdefault(workload(run), []).append(run.record.run_id)
    require_one_domain((run.record for run in runs if not run.rejected), "joulebench report --pareto")
    if len(kinds) > 1:  # each workload on its own line above the error (one line was thousands of columns)
        listing = [f"workload {number}: {k[0]} {k[1]} ×{k[2]} devices, batch {fmt(k[3])}, {[v for v in k[4:] if v]}: "
                   f"{', '.join(ids)}" for number, (k, ids) in enumerate(kinds.items(), 1)]
        raise ValidationError(f"the runs form {len(kinds)} different workloads (listed above)",
                              "pass one sweep's runs (one workload, only power_limit / sm_clock varied)", listing)
    points = []
    for run in runs:
        steps = run.record.metrics.get("iterations")
        window = run.record.window("steady")
        points.append(SweepPoint(
            run, recorded_settings(run.record.config),
            window.duration_s / steps if window and steps and not run.rejected else None, run.cost.time_per_unit_s,
            run.cost.energy_per_unit_j, exclusion(run, min_coverage)))
    return points


def baseline(points: Sequence[SweepPoint], among: Collection[str] | None = None) -> Baseline:
    """The default-setting row: the mean of the trusted runs at the device's own settings (of a software-knob sweep:
    only `among`, the default setting's runs)."""
    defaults = [p for p in points if p.settings.is_default and p.excluded is None
                and (among is None or p.name in among)]
    if not defaults:  # every run left out is named (an unreadable default, too), one a line above the error
        left_out = [f"left out: run {p.name}: {p.excluded}" for p in points if p.excluded]
        raise ValidationError("no default-setting run (power_limit and sm_clock empty) has trustworthy energy"
                              + (f" ({len(left_out)} left out, above)" if left_out else ""),
                              "add a measured run at the device's own settings", left_out)
    bounds = [p.run.cost.energy_bound for p in defaults]
    bound = None if any(b is None for b in bounds) else max(b for b in bounds if b is not None)
    return Baseline(sum(p.cost[0] for p in defaults) / len(defaults), sum(p.cost[1] for p in defaults) / len(defaults),
                    tuple(p.name for p in defaults), bound)


def pareto_front(points: Sequence[SweepPoint]) -> list[SweepPoint]:
    """Trusted runs that no other trusted run beats in both time and energy per unit, fastest first."""
    trusted = [p for p in points if p.excluded is None]

    def dominated(p: SweepPoint) -> bool:
        return any(q.cost[0] <= p.cost[0] and q.cost[1] <= p.cost[1] and q.cost != p.cost for q in trusted)

    return sorted((p for p in trusted if not dominated(p)), key=lambda p: p.cost)


def slowdown(point: SweepPoint, base: Baseline) -> float | None:
    return None if point.time_per_unit_s is None else point.time_per_unit_s / base.time_per_unit_s - 1


def saving(point: SweepPoint, base: Baseline) -> float | None:
    return None if point.energy_per_unit_j is None else 1 - point.energy_per_unit_j / base.energy_per_unit_j


def bounded(point: SweepPoint, base: Baseline) -> Saving | None:
    """The point's saving against the default with the combined bound; None where its energy is n/a."""
    if point.energy_per_unit_j is None:
        return None
    return bounded_saving(base.energy_per_unit_j, base.energy_bound, point.energy_per_unit_j,
                          point.run.cost.energy_bound)


def saving_words(point: SweepPoint, base: Baseline) -> str:
    """The saving as the table and summary print it: a figure beyond the bounds, else 'within bounds (...)'."""
    found = bounded(point, base)
    return "n/a" if found is None else found.words()


def _saves(point: SweepPoint, base: Baseline) -> bool:
    found = bounded(point, base)
    return found is not None and found.fraction > 0 and bool(found.beyond_bounds)


def waste_free(points: Sequence[SweepPoint], base: Baseline, max_slowdown: float) -> SweepPoint | None:
    """The trusted run with the least energy per unit whose slowdown is within max_slowdown (ties: the faster), among
    the default runs and the runs whose saving is beyond the bounds: a saving inside them is never recommended."""
    within = [p for p in points if p.excluded is None and p.cost[0] <= base.time_per_unit_s * (1 + max_slowdown)
              and (p.settings.is_default or _saves(p, base))]
    return min(within, key=lambda p: (p.cost[1], p.cost[0]), default=None)


# ---- output ------------------------------------------------------------------------------------------------------
def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:+.2f} %"


def table(points: Sequence[SweepPoint], base: Baseline, front: Sequence[SweepPoint],
          best: SweepPoint | None, marks: FrontMarks | None = None) -> list[dict[str, str]]:
    rows = []
    for p in sorted(points, key=lambda p: (p.excluded is not None, p.time_per_unit_s or math.inf)):
        sm = p.run.latents.get("sm_clock_hz")
        unit = work_unit(p.run.record)
        rows.append({
            "run": p.name, "requested": p.settings.label, "read back": p.settings.applied_label,
            "SM MHz (mean)": fmt(None if sm is None else sm / 1e6, 4),
            "W per device": readable(p.run.metric("mean_power_w_per_device")),
            "s per step": fmt(p.time_per_step_s, 4), f"J per {unit[:-1]}": fmt(p.energy_per_unit_j, 4),
            "method": str(p.run.record.metrics.get("energy_method") or "n/a"),
            "coverage %": percent(p.run.metric("energy_coverage")),
            "slowdown": _pct(slowdown(p, base)), "saving": saving_words(p, base),
            "front": "*" if any(p is q for q in front) else "", "waste-free": "<--" if p is best else "",
            **({} if marks is None else {"setting": marks.labels.get(p.name, "n/a"), "marked": _mark(p, marks)}),
            "note": f"excluded: {p.excluded}" if p.excluded else "",
        })
    return rows


def _mark(point: SweepPoint, marks: FrontMarks) -> str:
    return ("default" if point.name in marks.default_runs else
            "recommended" if point.name in marks.recommended_runs else "")


def narrow(rows: Sequence[dict[str, str]]) -> str:
    """The default table, within text_width.WIDTH: the setting read back only where it is not the one requested,
    the front and the waste-free point in one column; the energy's method and coverage in --wide and pareto.json."""
    def setting(row: dict[str, str]) -> str:
        requested, read = row["requested"], row["read back"]
        applied = read == requested or set(requested.split(", ")) <= set(read.split(", "))  # + settings not asked
        return requested if applied else f"{requested} (read {read})"

    def marked(row: dict[str, str]) -> str:
        return " ".join(mark for mark in ("*" if row["front"] else "", "waste-free" if row["waste-free"] else "")
                        if mark)

    energy = next(key for key in rows[0] if key.startswith("J per "))
    marks = [key for key in ("setting", "marked") if key in rows[0]]
    header = ["run", "requested", "SM MHz", "W/device", "s/step", f"J/{energy[len('J per '):]}", "slowdown", "saving",
              "front", *marks, "note"]
    cells = [[r["run"], setting(r), r["SM MHz (mean)"], r["W per device"], r["s per step"], r[energy], r["slowdown"],
              r["saving"], marked(r), *(r[key] for key in marks), r["note"]] for r in rows]
    return "\n".join(text_table(header, cells, separator="  "))


def render(rows: Sequence[dict[str, str]]) -> str:
    """The --wide table: every column of pareto.json's rows."""
    head = list(rows[0])
    widths = {h: max(len(h), *(len(r[h]) for r in rows)) for h in head}
    lines = ["  ".join(h.ljust(widths[h]) for h in head)]
    lines += ["  ".join(r[h].ljust(widths[h]) for h in head).rstrip() for r in rows]
    return "\n".join(lines)


def summary(points: Sequence[SweepPoint], base: Baseline, best: SweepPoint | None, max_slowdown: float,
            marks: FrontMarks | None = None, how: str = "measured") -> list[str]:
    """The lines under the table; `how`: the energy's provenance (energy_domain.provenance)."""
    unit = work_unit(points[0].run.record)[:-1]
    lines = [f"all figures: each run's steady window, {how}; each energy's method and coverage: --wide, pareto.json",
             f"default setting: {fmt(base.time_per_unit_s, 4)} s and {fmt(base.energy_per_unit_j, 4)} J per {unit} "
             f"(mean of {', '.join(base.runs)})"]
    if best is None or best.settings.is_default:
        lines.append(f"waste-free point: the default; no setting saves energy beyond the runs' combined bounds "
                     f"within {_pct(max_slowdown)} slowdown")
    else:
        lines.append(f"waste-free point (least energy within {_pct(max_slowdown)} slowdown, {how}): "
                     f"{best.settings.label} (run {best.name}): {_pct(best.cost[1] / base.energy_per_unit_j - 1)} "
                     f"energy per {unit} (saving {saving_words(best, base)}), {_pct(slowdown(best, base))} time")
    lines += [] if marks is None else [marks.words]
    lines += [f"excluded (energy not trustworthy): run {p.name} ({p.settings.label}): {p.excluded}"
              for p in points if p.excluded]
    return lines


def figure(points: Sequence[SweepPoint], base: Baseline, front: Sequence[SweepPoint], best: SweepPoint | None,
           max_slowdown: float, marks: FrontMarks | None = None, how: str = "measured") -> Any:
    from matplotlib.figure import Figure

    unit = work_unit(points[0].run.record)[:-1]
    fig = Figure(figsize=(7.5, 5.5), layout="constrained")
    ax = fig.subplots()
    trusted = [p for p in points if p.excluded is None]
    ax.scatter([p.cost[0] for p in trusted], [p.cost[1] for p in trusted], color="C0", label=f"run ({how})")
    for p in trusted:
        ax.annotate(p.settings.label, p.cost, xytext=(4, 4), textcoords="offset points", fontsize=7)
    ax.plot([p.cost[0] for p in front], [p.cost[1] for p in front], color="C1", label="Pareto front")
    ax.axvline(base.time_per_unit_s * (1 + max_slowdown), color="grey", linestyle="--",
               label=f"slowdown limit {_pct(max_slowdown)}")
    ax.scatter([base.time_per_unit_s], [base.energy_per_unit_j], marker="s", color="k", label="default (mean)")
    if best is not None:
        ax.scatter([best.cost[0]], [best.cost[1]], s=160, facecolors="none", edgecolors="C3",
                   label="waste-free point")
    for name, marker, colour in (("default", "s", "k"), ("recommended", "*", "C2")):
        marked = [p for p in trusted if marks is not None and _mark(p, marks) == name]
        if marked:
            ax.scatter([p.cost[0] for p in marked], [p.cost[1] for p in marked], s=220, marker=marker,
                       facecolors="none", edgecolors=colour, label=f"{name} setting (software knobs)")
    ax.set_xlabel(f"time per {unit} (s), steady window")
    ax.set_ylabel(f"energy per {unit} (J), accelerators")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    excluded = len(points) - len(trusted)
    ax.set_title(f"power-limit / clock sweep{f' ({excluded} run(s) excluded, see table)' if excluded else ''}",
                 fontsize=10)
    return fig


def main(argv: Sequence[str]) -> int:
    parser = ArgumentParser(prog="joulebench report --pareto",
                            description="Time per step vs energy per unit across a sweep's runs.")
    parser.add_argument("--pareto", action="store_true", help="(the verb's switch; implied here)")
    parser.add_argument("paths", nargs="+", type=Path, help="JUBE run directories or run_record.json files")
    parser.add_argument("--max-slowdown", default="1%", help="slowdown allowed for the waste-free point (1%% or 0.01)")
    parser.add_argument("--min-coverage", type=FRACTION, default=DEFAULT_MIN_COVERAGE,
                        help="energy coverage below this fraction excludes a run (default 0.99; 0 = none excluded)")
    parser.add_argument("--default", action="append", default=[], metavar="KNOB=VALUE",
                        help="a software-knob sweep's default where the driver has none (joulebench recommend)")
    parser.add_argument("-o", "--out", type=Path, default=None, help="also write pareto.json and pareto.png here")
    parser.add_argument("--wide", action="store_true",
                        help="print every column (read back, method, coverage): wider than 160 columns")
    args = state_ranges(parser).parse_args(argv)
    max_slowdown = parse_fraction(args.max_slowdown)
    runs = load_runs(args.paths)
    points = sweep_points(runs, args.min_coverage)
    # a software-knob sweep's default and recommended settings (the slowdown limit as the target); None otherwise
    try:
        marks, unmarked = front_marks(runs, max_slowdown, args.default, args.min_coverage), None
    except ValidationError as exc:  # the front stands without the marks
        marks, unmarked = None, f"software settings not marked: {exc}"
    base = baseline(points, None if marks is None else marks.default_runs)
    front = pareto_front(points)
    best = waste_free(points, base, max_slowdown)
    rows = table(points, base, front, best, marks)
    how = provenance(p.run.record for p in points)
    lines = summary(points, base, best, max_slowdown, marks, how) + ([unmarked] if unmarked else [])
    print(render(rows) if args.wide else narrow(rows))
    print(fitted(lines))
    if args.out is not None:
        from joulebench.analysis.plot import save_figure
        from jpwr.output import write_json_atomic

        args.out.mkdir(parents=True, exist_ok=True)
        write_json_atomic(args.out / "pareto.json", {
            "measured": how == "measured", **({} if how == "measured" else {"energy": how}),
            "max_slowdown": max_slowdown,
            "min_coverage": args.min_coverage,
            "baseline": dataclasses.asdict(base), "rows": rows, "summary": lines,
            "front": [p.name for p in front], "waste_free": None if best is None else best.name,
            "excluded": {p.name: p.excluded for p in points if p.excluded},
            **({} if marks is None else {"software": {"default": sorted(marks.default_runs),
                                                      "recommended": sorted(marks.recommended_runs)}}),
        })
        save_figure(figure(points, base, front, best, max_slowdown, marks, how), args.out / "pareto.png")
        print(f"joulebench report --pareto: wrote {args.out / 'pareto.json'} and {args.out / 'pareto.png'}")
    return ExitCode.OK
