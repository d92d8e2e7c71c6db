"""`joulebench recommend RUNS... [target]`: the cheapest software setting of a sweep that meets a target, by energy per
unit of work, with its bound and its saving against the default setting, printed as driver options and JUBE values.

The settings are the drivers' free knobs (joulebench.analysis.knobs: decode variant, objective, batch size, slots,
micro-batch, compile mode, ...); repeats of one setting are averaged, their relative energy bound the largest of
theirs. A run is left out, named with the reason, where its energy cannot be trusted (FAILED, rejected figures,
energy n/a, coverage below --min-coverage: `report --pareto`'s rule) or where it was disturbed; a setting that
changes what is computed (precision, global batch, model) is left out unless --allow-semantic-changes, and then it
is labelled so. Refused: no trustworthy run of the default setting, or fewer than two settings to choose from.

Target (each optional; a setting missing a figure a target needs cannot meet it):
    --max-p90-tpot-ms MS   p90 time per output token (serving: tpot_p90_s; static batches: per_token_latency_p90_s)
    --max-p90-ttft-ms MS   p90 time to first token
    --max-slowdown PCT     time per unit of work above the default's (5% or 0.05)
    --min-throughput N     units of work per second (the records' work unit: output tokens, tokens, images)

The recommendation is the setting with the least energy per unit among those meeting the target whose saving
against the default is beyond the combined bounds (joulebench.savings), else the default. It is PREDICTED from the
sweep until re-measured: --remeasure runs it and the default again (--repeats N each, alternating) through the
driver's command line and reports the measured saving beside the predicted one (joulebench.analysis.remeasure);
--remeasured RUNS... reads re-runs made elsewhere instead (any driver: e.g. a second JUBE sweep, run twice).

    joulebench recommend jube/runs/inference/000004 --max-p90-tpot-ms 50 --max-slowdown 5% [--remeasure]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from joulebench.analysis import knobs
from joulebench.analysis.diagnose import work_unit
from joulebench.analysis.energy_domain import require_one_domain
from joulebench.analysis.runs import Run, load_runs
from joulebench.analysis.sweep import (
    DEFAULT_MIN_COVERAGE,
    TPOT_KEYS,
    TTFT_KEYS,
    Group,
    Recommendation,
    Row,
    Target,
    parse_fraction,
    target_misses,
    untrusted,
)
from joulebench.analysis.text_width import fitted
from joulebench.arguments import FRACTION, MILLISECONDS, Number, state_ranges
from joulebench.record import EXIT_CODES
from joulebench.savings import saving as bounded_saving
from jpwr import ExitCode, ValidationError
from jpwr.errors import ArgumentParser
from jpwr.output import fmt, write_json_atomic

PREDICTED = "PREDICTED from the sweep, not re-measured"
THROUGHPUT = Number(float, 0.0, 1e15, low_open=True)  # units of work per second
REPEATS = Number(int, 2, 100)  # a spread needs two runs
REMEASURE_FAILED = EXIT_CODES["FAILED"]  # every re-run failed or was refused: nothing confirms or refutes


def _one_workload(runs: Sequence[Run]) -> str:
    """The benchmark of runs that are settings of one workload; refused otherwise, each workload with its runs on a
    line above the error."""
    kinds: dict[tuple[Any, ...], list[str]] = {}
    for run in runs:
        config = run.record.config
        kinds.setdefault((run.record.benchmark, work_unit(run.record),
                          *(str(config.get(k)) for k in knobs.WORKLOAD_KEYS)), []).append(run.record.run_id)
    if len(kinds) > 1:
        def described(kind: tuple[Any, ...]) -> str:
            pairs = [f"{n}={v}" for n, v in zip(knobs.WORKLOAD_KEYS, kind[2:], strict=True) if v != "None"]
            return f"{kind[0]} per {kind[1]} {' '.join(pairs)}".rstrip()

        listing = [f"workload {number}: {described(k)}: {', '.join(ids)}"
                   for number, (k, ids) in enumerate(kinds.items(), 1)]
        raise ValidationError(f"the runs form {len(kinds)} different workloads (listed above)",
                              "pass the runs of one sweep (one task and work unit; only the software settings varied)",
                              listing)
    return next(iter(kinds))[0]


def recommend(runs: Sequence[Run], target: Target, defaults: Sequence[str] = (), allow_semantic: bool = False,
              min_coverage: float = DEFAULT_MIN_COVERAGE) -> Recommendation:
    """The cheapest setting meeting the target (see the module docstring)."""
    left_out = [f"run {r.record.run_id}: {r.rejected}" for r in runs if r.rejected]
    readable = [r for r in runs if not r.rejected]
    if not readable:
        raise ValidationError("no run record can be used", "pass the records of a finished sweep")
    benchmark = _one_workload(readable)
    require_one_domain((r.record for r in readable), "joulebench recommend")
    all_settings = [knobs.setting_of(benchmark, r.record.config) for r in readable]
    base_setting = knobs.default_setting(benchmark, all_settings, knobs.parse_defaults(defaults, benchmark))
    groups: dict[knobs.Setting, Group] = {}
    for run, setting in zip(readable, all_settings, strict=True):
        reason = untrusted(run, min_coverage)
        if reason:
            left_out.append(f"run {run.record.run_id}: {reason}")
        else:
            groups.setdefault(setting, Group(setting, [])).runs.append(run)
    varied = [key for index, (key, _) in enumerate(base_setting) if len({s[index][1] for s in all_settings}) > 1]
    named = f" ({len(left_out)} left out, above)" if left_out else ""  # each on a line above the error
    listed = [f"left out: {reason}" for reason in left_out]
    if base_setting not in groups:
        shown = knobs.label(benchmark, base_setting, varied or [key for key, _ in base_setting])
        raise ValidationError(f"no trustworthy run of the default setting ({shown}){named}",
                              "include a measured run of the site's current setting, or name it with --default "
                              "KNOB=VALUE", listed)
    if len(groups) < 2:
        raise ValidationError(f"too few settings to choose from: {len(groups)} with trustworthy runs{named}",
                              "sweep at least one software knob, e.g. JOULEBENCH_SWEEP_DECODE_TUNING=auto,"
                              "coordinate-descent or --objective speed and energy", listed)
    base = groups[base_setting]
    unit = work_unit(base.runs[0].record)
    rows = []
    for group in groups.values():
        semantic = [f"{k.key} {a} -> {b}" for k, a, b in knobs.changes(benchmark, base_setting, group.setting)
                    if k.semantic]
        if semantic and not allow_semantic:
            left_out.append(f"setting {knobs.label(benchmark, group.setting, varied)}: changes what is computed "
                            f"({', '.join(semantic)}); --allow-semantic-changes offers it")
            continue
        rows.append(Row(group, bounded_saving(base.energy_per_unit_j, base.energy_bound, group.energy_per_unit_j,
                                              group.energy_bound),
                        group.time_per_unit_s / base.time_per_unit_s - 1, target_misses(group, base, target, unit),
                        semantic))
    if len(rows) < 2:  # the semantic filter left the default alone: nothing to choose from, as above
        listed = [f"left out: {reason}" for reason in left_out]
        raise ValidationError(f"too few settings to choose from: only the default is left once the settings that "
                              f"change what is computed are left out ({len(left_out)} left out, above)",
                              "sweep a knob that keeps the computation, or pass --allow-semantic-changes", listed)
    rows.sort(key=lambda r: (r.group.energy_per_unit_j, r.group.time_per_unit_s))
    default = next(r for r in rows if r.group is base)
    meeting = [r for r in rows if not r.misses]
    if not default.misses:  # a saving inside the bounds is never recommended over the default
        meeting = [r for r in meeting if r is default or (r.saving.fraction > 0 and r.saving.beyond_bounds)]
    model = str(base.runs[0].record.config.get("model") or "") or None
    return Recommendation(benchmark, unit[:-1] if unit.endswith("s") else unit, target, varied, default, rows,
                          meeting[0] if meeting else None, left_out, model)


@dataclasses.dataclass(frozen=True)
class FrontMarks:
    """What `report --pareto` marks on a software-knob sweep's front: the default setting's and the recommended
    setting's runs, and each run's setting in words."""

    default_runs: frozenset[str]
    recommended_runs: frozenset[str]
    labels: dict[str, str]
    words: str


def front_marks(runs: Sequence[Run], max_slowdown: float, defaults: Sequence[str], min_coverage: float
                ) -> FrontMarks | None:
    """The marks where the runs vary a software knob (None where they vary none: a device-settings sweep); refused
    (ValidationError) where no recommendation can be made."""
    readable = [r for r in runs if not r.rejected]
    benchmark = readable[0].record.benchmark if readable else None
    if benchmark not in knobs.KNOBS or len({knobs.setting_of(benchmark, r.record.config) for r in readable}) < 2:
        return None
    rec = recommend(runs, Target(max_slowdown=max_slowdown), defaults, min_coverage=min_coverage)
    labels = {r.record.run_id: knobs.label(benchmark, knobs.setting_of(benchmark, r.record.config), rec.varied)
              for r in readable}
    chosen = rec.chosen.group if rec.chosen is not None else None
    words = (f"software settings: default {knobs.label(benchmark, rec.default.group.setting, rec.varied)}; "
             + ("no setting meets the slowdown limit" if chosen is None else "recommended: the default" if
                rec.is_default else f"recommended ({PREDICTED}): {labels[chosen.names[0]]}"))
    return FrontMarks(frozenset(rec.default.group.names), frozenset(chosen.names if chosen else ()), labels, words)


# ---- output ------------------------------------------------------------------------------------------------------
def _ms(value: float | None) -> str:
    return "n/a" if value is None else fmt(value * 1e3, 4)


def table(rec: Recommendation) -> list[str]:
    """One row per setting, cheapest first (at most 160 columns for a few varied knobs); what each setting misses of
    the target follows the table."""
    head = ["", "setting", f"J/{rec.unit} (bound)", "slowdown", "saving vs default", "p90 TPOT/TTFT ms", "runs",
            "target"]
    body, missed = [], []
    for row in rec.rows:
        g = row.group
        name = knobs.label(rec.benchmark, g.setting, rec.varied)
        mark = "default" if row is rec.default else "RECOMMENDED" if row is rec.chosen else ""
        bound = "n/a" if g.energy_bound is None else f"±{100 * g.energy_bound:.2f} %"
        body.append([mark, name + (" [CHANGES WHAT IS COMPUTED]" if row.semantic else ""),
                     f"{fmt(g.energy_per_unit_j, 4)} ({bound})", f"{100 * row.slowdown:+.2f} %",
                     "-" if row is rec.default else row.saving.words(),
                     f"{_ms(g.worst(TPOT_KEYS))}/{_ms(g.worst(TTFT_KEYS))}", str(len(g.runs)),
                     "misses" if row.misses else "meets"])
        missed += [f"{name} misses the target: {'; '.join(row.misses)}"] if row.misses else []
    widths = [max(len(r[i]) for r in [head, *body]) for i in range(len(head))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in [head, *body]] + missed


def summary(rec: Recommendation, label: str = PREDICTED) -> list[str]:
    base = rec.default.group
    missed = "; it misses the target" if rec.default.misses else ""
    lines = [f"recommend: {rec.benchmark}, energy per {rec.unit} (steady windows, measured); target: "
             f"{rec.target.words(rec.unit)}",
             f"default setting: {knobs.label(rec.benchmark, base.setting, rec.varied)}: "
             f"{fmt(base.energy_per_unit_j, 4)} J per {rec.unit} (runs {', '.join(base.names)}){missed}"]
    if rec.chosen is None:
        lines.append("no setting meets the target: loosen it, or sweep further settings")
    elif rec.is_default:
        lines.append("recommended: the default; no setting that meets the target saves energy beyond the runs' "
                     "combined bounds")
    else:
        g = rec.chosen.group
        lines += [f"recommended ({label}): {knobs.label(rec.benchmark, g.setting, rec.varied)}",
                  f"  {fmt(g.energy_per_unit_j, 4)} J per {rec.unit}, saving {rec.chosen.saving.words()}, time "
                  f"{100 * rec.chosen.slowdown:+.2f} % against the default"]
        if rec.chosen.semantic:
            lines.append(f"NOTE: it changes what is computed ({', '.join(rec.chosen.semantic)}): allowed by "
                         "--allow-semantic-changes")
        lines += knobs.apply_lines(rec.benchmark, base.setting, g.setting, rec.model)
    lines += [f"left out: {reason}" for reason in rec.left_out]
    return lines


def as_json(rec: Recommendation) -> dict[str, Any]:
    def row(r: Row) -> dict[str, Any]:
        g = r.group
        return {"setting": dict(g.setting), "runs": g.names, "energy_per_unit_j": g.energy_per_unit_j,
                "energy_bound": g.energy_bound, "time_per_unit_s": g.time_per_unit_s, "slowdown": r.slowdown,
                "saving": r.saving.fraction, "saving_bound": r.saving.bound, "beyond_bounds": r.saving.beyond_bounds,
                "misses": r.misses, "changes_what_is_computed": r.semantic}

    return {"benchmark": rec.benchmark, "unit": rec.unit, "target": dataclasses.asdict(rec.target),
            "default": row(rec.default), "recommended": None if rec.chosen is None else row(rec.chosen),
            "is_default": rec.is_default, "rows": [row(r) for r in rec.rows], "left_out": rec.left_out}


def main(argv: Sequence[str]) -> int:
    parser = ArgumentParser(prog="joulebench recommend", description=__doc__.split("\n\n")[0],
                            formatter_class=argparse.RawDescriptionHelpFormatter,
                            epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("paths", nargs="+", type=Path, help="JUBE run directories or run_record.json files")
    parser.add_argument("--max-p90-tpot-ms", type=MILLISECONDS, default=None, help="p90 time per output token limit")
    parser.add_argument("--max-p90-ttft-ms", type=MILLISECONDS, default=None, help="p90 time to first token limit")
    parser.add_argument("--max-slowdown", default=None, help="time per unit above the default's (5%% or 0.05)")
    parser.add_argument("--min-throughput", type=THROUGHPUT, default=None, help="units of work per second")
    parser.add_argument("--default", action="append", default=[], metavar="KNOB=VALUE",
                        help="the site's current value of a knob the driver has no default for (e.g. batch_size=1)")
    parser.add_argument("--allow-semantic-changes", action="store_true",
                        help="also offer settings that change what is computed (precision, global batch, model)")
    parser.add_argument("--min-coverage", type=FRACTION, default=DEFAULT_MIN_COVERAGE,
                        help="energy coverage below this fraction leaves a run out (default 0.99; 0 = none left out)")
    parser.add_argument("--remeasure", action="store_true",
                        help="run the recommendation and the default again (--repeats each) and report both savings")
    parser.add_argument("--repeats", type=REPEATS, default=2, help="runs per setting when re-measuring")
    parser.add_argument("--energy-methods", default=None,
                        help="in-process metering of the re-runs (default: the records' own; e.g. nvml)")
    parser.add_argument("--remeasure-dir", type=Path, default=Path("recommend-remeasure"),
                        help="where the re-runs write their records")
    parser.add_argument("--remeasured", nargs="+", type=Path, default=None, metavar="RUNS",
                        help="re-runs made elsewhere (e.g. JUBE, twice) of the default and the recommended setting")
    parser.add_argument("--json", type=Path, default=None, help="also write the result as JSON")
    args = state_ranges(parser).parse_args(argv)
    target = Target(None if args.max_p90_tpot_ms is None else args.max_p90_tpot_ms / 1e3,
                    None if args.max_p90_ttft_ms is None else args.max_p90_ttft_ms / 1e3,
                    None if args.max_slowdown is None else parse_fraction(args.max_slowdown), args.min_throughput)
    sweep = load_runs(args.paths)
    rec = recommend(sweep, target, args.default, args.allow_semantic_changes, args.min_coverage)
    data = as_json(rec)
    if args.remeasure and args.remeasured:
        raise ValidationError("--remeasure and --remeasured both given", "keep one: re-run here, or read re-runs")
    wanted = args.remeasure or args.remeasured is not None
    measured = None
    if wanted and rec.chosen is not None and not rec.is_default:
        from joulebench.analysis import remeasure

        measured = (remeasure.from_records(rec, load_runs(args.remeasured), args.min_coverage, sweep)
                    if args.remeasured
                    else remeasure.remeasure(rec, args.repeats, args.remeasure_dir, args.energy_methods,
                                             args.min_coverage))
        data["remeasured"] = measured.as_json()
    print("\n".join(table(rec)))
    print("\n".join(summary(rec, PREDICTED if measured is None else "re-measured below")))
    if wanted and measured is None:
        print("re-measure: nothing to re-measure (the recommendation is the default, or none meets the target)")
    if measured is not None:
        print(fitted(measured.lines()))
    if args.json:
        write_json_atomic(args.json, data)
    if measured is not None and measured.failed:
        print("re-measure: no re-run left a record of a new run (each failed, or is no re-run): the re-measurement "
              "FAILED", file=sys.stderr)
        return REMEASURE_FAILED
    return ExitCode.OK
