"""`joulebench plan`: one SM clock per phase (or kernel class) that minimises energy under a slowdown limit, beside
the best single clock; the pass-level vs kernel-level comparison of the DVFS study, from measured data.

Input: the per-phase time and energy of one step at several clocks. Either the run records of a clock sweep whose
`attribution` block (from `joulebench attribute`) holds the phases, or a profile file (JSON or CSV, below). One run
per clock, plus the default-setting run (sm_clock empty); repeats at one clock are averaged. Run records read:

    config.device_settings.requested.sm_clock_mhz   the run's locked clock; null/absent = the default row
    attribution.window                              the window the phases cover (default "steady"; the record
                                                    must have it)
    attribution.estimators.<method>.rows[]          as `joulebench attribute` writes them (--method fit or replay):
        phase, energy_per_step_j (null = below resolution: that clock is not a choice for that phase),
        seconds_per_step, mean_power_w; a replay row "not replayed" (gradient reduction, inside forward+backward)
        is no phase of its own

The phases are taken in their listed order, as one step runs them, repeating every step. A run naming a phase twice
(or with an empty name) is left out, a profile file doing so refused. Profile files (per step; clocks 1 to
100000 MHz, else the point is refused):

    JSON {"kind": "joulebench.clock_profile", "version": 1, "phases": [names in execution order],
          "points": [{"phase": ..., "clock": "default" | MHz, "time_s": ..., "energy_j": ..., "source": ...}]}
    CSV  phase,clock,time_s,energy_j[,source]   (phase order = order of first appearance)

The search is exact: dynamic programming over the phases in order, keyed by (clock of the first phase, clock of the
current phase), keeping every (time, energy) pair no other pair of the same key beats in both; a pair over the time
budget is dropped (times and energies are not negative). A clock switch between two consecutive phases with
different clocks (and from the last phase to the first of the next step) costs --switch-latency seconds and that
time at the mean power of the phase entered. The default and single-clock rows sum one run's phases (measured); the
per-phase plan combines phases of different runs plus modelled switches, so it is a PREDICTION and labelled so.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from joulebench.analysis.energy_domain import provenance, require_one_domain
from joulebench.analysis.plausible import CLOCK_RANGE_MHZ, clock_check, device_power_problem
from joulebench.analysis.replay import NOT_REPLAYED
from joulebench.analysis.runs import check_versions, record_paths
from joulebench.analysis.sweep import parse_fraction
from joulebench.arguments import SECONDS_OR_ZERO, state_ranges
from joulebench.figures import number_problem, rejection
from joulebench.record import RecordShapeError, RunRecord, parse_record, read_record_document
from jpwr import ExitCode, FormatError, ValidationError
from jpwr.errors import ArgumentParser
from jpwr.output import fmt, write_json_atomic

PROFILE_KIND = "joulebench.clock_profile"
PROFILE_VERSION = 1
DEFAULT = None  # the device's own clock management (no lock)
Clock = int | None


def clock_name(clock: Clock) -> str:
    return "default" if clock is None else f"{clock} MHz"


def _clock_order(clock: Clock) -> tuple[int, int]:
    return (0, 0) if clock is None else (1, -clock)


@dataclasses.dataclass(frozen=True)
class Option:
    """One phase at one clock, per step."""

    time_s: float
    energy_j: float
    sources: tuple[str, ...]

    @property
    def power_w(self) -> float:
        return self.energy_j / self.time_s if self.time_s > 0 else 0.0


@dataclasses.dataclass
class Profile:
    phases: list[str]
    options: dict[str, dict[Clock, Option]]  # phase -> clock -> option
    origin: str  # where the figures come from (estimator and window, or the profile file)
    excluded: list[str] = dataclasses.field(default_factory=list)  # inputs left out, with the reason
    unchecked: list[str] = dataclasses.field(default_factory=list)  # inputs used whose clock could not be checked
    energy: str = "measured"  # the figures' provenance: a replayed trace's label where its records replayed one

    @property
    def clocks(self) -> list[Clock]:
        return sorted({c for by_clock in self.options.values() for c in by_clock}, key=_clock_order)

    def check(self) -> None:
        if not self.phases:
            raise ValidationError("no phases to plan (no input had per-phase figures)",
                                  "attribute the sweep's runs first (`joulebench attribute`), or pass --profile")
        missing = [p for p in self.phases if DEFAULT not in self.options.get(p, {})]
        if missing:  # the inputs left out, one a line above the error (they made it thousands of columns)
            left_out = [f"left out ({len(self.excluded)}; the default setting is sm_clock empty):",
                        *(f"  {reason}" for reason in self.excluded)] if self.excluded else []
            raise ValidationError(f"phases {', '.join(missing)} have no figures at the default setting",
                                  "attribute every phase of a default run", left_out)
        bad = [f"{p} at {clock_name(c)}: {problem}" for p, by in self.options.items() for c, o in by.items()
               for problem in _point_problems(o.time_s, o.energy_j)]
        if bad:
            raise ValidationError(f"the profile cannot be planned on: {'; '.join(bad)}",
                                  "fix the profile: every point's time and energy per step are positive and finite")

    def to_json(self) -> dict[str, Any]:
        return {"kind": PROFILE_KIND, "version": PROFILE_VERSION, "phases": self.phases, "points": [
            {"phase": p, "clock": "default" if c is None else c, "time_s": o.time_s, "energy_j": o.energy_j,
             "source": ", ".join(o.sources)}
            for p in self.phases for c, o in sorted(self.options[p].items(), key=lambda i: _clock_order(i[0]))]}


def _point_problems(time_s: float, energy_j: float) -> list[str]:
    """Why a phase's time or energy per step cannot be planned on (joulebench.figures' rule)."""
    return [p for p in (number_problem("time_s", time_s), number_problem("energy_j", energy_j)) if p]


def _average(samples: Mapping[tuple[str, Clock], list[tuple[float, float, str]]]) -> dict[str, dict[Clock, Option]]:
    options: dict[str, dict[Clock, Option]] = {}
    for (phase, clock), values in samples.items():
        options.setdefault(phase, {})[clock] = Option(sum(v[0] for v in values) / len(values),
                                                      sum(v[1] for v in values) / len(values),
                                                      tuple(v[2] for v in values))
    return options


def _parse_clock(value: Any, where: str) -> Clock:
    if value is None or str(value).strip().lower() in ("", "default"):
        return DEFAULT
    try:
        clock = int(value)
    except (TypeError, ValueError):
        raise FormatError(f"{where}: clock {value!r} is neither 'default' nor MHz",
                          "write the clock as an integer MHz or 'default'") from None
    low, high = CLOCK_RANGE_MHZ
    if not low <= clock <= high:
        raise FormatError(f"{where} cannot be planned on: clock {clock} MHz is outside {low} to {high} MHz",
                          "write the clock the device was locked to, in MHz, or 'default'")
    return clock


def _phase_list_problem(names: Sequence[Any]) -> str | None:
    """Why a list of phases in step order cannot be a step: an empty name, or one named twice (counted twice)."""
    twice = sorted({str(n) for n in names if names.count(n) > 1 and str(n or "").strip()})
    problems = ["a phase has an empty name"] if any(not str(n or "").strip() for n in names) else []
    problems += [f"phase(s) {', '.join(twice)} listed twice"] if twice else []
    return "; ".join(problems) or None


# ---- input ------------------------------------------------------------------------------------------------------
def profile_from_records(paths: Sequence[Path], method: str) -> Profile:
    """Per-phase figures per step from run records with an attribution block (see the module docstring)."""
    samples: dict[tuple[str, Clock], list[tuple[float, float, str]]] = {}
    phases: list[str] = []
    excluded: list[str] = []
    unchecked: list[str] = []
    windows: set[str] = set()
    planned: list[RunRecord] = []  # the records whose phases the plan uses: one energy domain only
    documents = {path: read_record_document(path) for path in record_paths(paths)}
    check_versions(documents)
    for path, data in documents.items():
        try:
            record = parse_record(data)
        except RecordShapeError as exc:
            excluded.append(f"{path}: not a valid run record ({exc})")
            continue
        run = record.run_id
        clocks = clock_check(record)
        attribution = record.attribution or {}
        reason = (f"status {record.status}" if record.status == "FAILED" else
                  "no attribution block (run `joulebench attribute` on it)" if not attribution else
                  clocks.problem if clocks.settings is None else
                  f"it sets power_limit={fmt(clocks.settings.requested.power_limit_w)} W; the plan varies clocks only"
                  if clocks.settings.requested.power_limit_w is not None else rejection(record))
        if reason or clocks.settings is None:
            excluded.append(f"run {run}: {reason}")
            continue
        window_name = attribution.get("window", "steady")
        rows, problem = attribution_rows(attribution, method)
        problem = problem or (f"no window {window_name!r}, which its attribution covers" if record.window(
            str(window_name)) is None else f"no phases by method {method!r}" if not rows else
            _phase_list_problem([r.get("phase") for r in rows]))
        wrong = [f"phase {r.get('phase')}: {p}" for r in rows
                 for key in ("energy_per_step_j", "seconds_per_step", "mean_power_w")
                 if (p := number_problem(key, r.get(key)))]
        problem = problem or closure_problem(attribution, method)
        wrong = wrong or implausible_power(record, attribution, rows, str(window_name))
        if problem or wrong:
            excluded.append(f"run {run}: {problem or 'figures rejected: ' + '; '.join(wrong)}")
            continue
        windows.add(str(window_name))
        unchecked += [f"run {run}: {clocks.unchecked}"] if clocks.unchecked else []
        planned.append(record)
        for row in rows:
            name = str(row["phase"])
            if name not in phases:
                phases.append(name)
            energy, seconds = row.get("energy_per_step_j"), row.get("seconds_per_step")
            if energy is None or seconds is None:
                excluded.append(f"run {run}: phase {name} has no energy or duration ({row.get('status')})")
                continue
            samples.setdefault((name, clocks.settings.requested.sm_clock_mhz), []).append((seconds, energy,
                                                                                            f"run {run}"))
    require_one_domain(planned, "joulebench plan")
    origin = f"attribution method {method!r} of window(s) {', '.join(sorted(windows)) or 'n/a'} in the run records"
    return Profile(phases, _average(samples), origin, excluded, unchecked, provenance(planned))


def closure_problem(attribution: dict[str, Any], method: str) -> str | None:
    """Why an estimator's own check refuses its phases: the fit's held-out closure, the replay's sum of phases
    against the whole step, marked misfit (`joulebench attribute` prints MISFIT): its per-phase figures do not add
    up to the energy measured, so no plan is made on them."""
    estimator = (attribution.get("estimators") or {}).get(method) or {}
    checks = [("closure", estimator.get("closure")), ("sum_vs_step", estimator.get("sum_vs_step"))]
    for name, check in checks:
        if isinstance(check, dict) and check.get("status") == "misfit":
            why = f": {check['reason']}" if check.get("reason") else ""
            return (f"its attribution's {name} is MISFIT{why} (its phases do not add up to the energy measured; "
                    "attribute a longer or steadier window)")
    return None


def implausible_power(record: RunRecord, attribution: dict[str, Any], rows: Sequence[dict[str, Any]],
                      window: str) -> list[str]:
    """The attribution's idle power and each phase's mean power per device that no device draws (below
    joulebench.analysis.plausible.MIN_DEVICE_POWER_W: 1e-12 J in a 0.1 s phase, an idle power of 1e-9 W)."""
    covered = record.window(window)
    energy = covered.energy if covered is not None else None
    devices = energy.devices if energy is not None and energy.devices else 1
    found = [p for p in (device_power_problem("idle_power_w_per_device",
                                              attribution.get("idle_power_w_per_device") or None),) if p]
    for row in rows:
        joules, seconds = row.get("energy_per_step_j"), row.get("seconds_per_step")
        if joules is not None and seconds:
            problem = device_power_problem("mean power per device", joules / seconds / devices)
            found += [f"phase {row.get('phase')}: {problem}"] if problem else []
    return found


def attribution_rows(attribution: dict[str, Any], method: str) -> tuple[list[dict[str, Any]], str | None]:
    """The phase rows of one estimator of an attribution block (docs/attribution.md), or why the block's shape
    cannot hold them; a replay row "not replayed" is no phase of its own."""
    estimators = attribution.get("estimators") or {}
    estimator = (estimators.get(method) if isinstance(estimators, dict) else None) or {}
    rows = (estimator.get("rows") if isinstance(estimator, dict) else None) or []
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows) or not isinstance(estimator, dict):
        return [], f"attribution.estimators.{method}.rows is not a list of objects (re-run `joulebench attribute`)"
    if not isinstance(attribution.get("window", "steady"), str):
        return [], "attribution.window is not a text (re-run `joulebench attribute`)"
    return [r for r in rows if r.get("status") != NOT_REPLAYED], None


def read_profile(path: Path) -> Profile:
    """A JSON or CSV profile file (see the module docstring)."""
    rows: list[Mapping[str, Any]]
    try:
        text = path.read_text()
    except OSError as exc:
        raise ValidationError(f"profile {path} cannot be read ({exc.strerror})", "pass an existing file") from exc
    if path.suffix.lower() == ".csv":
        rows = list(csv.DictReader(text.splitlines()))
        phases = list(dict.fromkeys(r.get("phase", "") for r in rows))
    else:
        try:
            data = json.loads(text)
            if data.get("kind") != PROFILE_KIND or data.get("version") != PROFILE_VERSION:
                raise ValueError(f"kind {data.get('kind')!r}, version {data.get('version')!r}")
            rows, phases = list(data["points"]), list(data["phases"])
        except (ValueError, AttributeError, KeyError, TypeError) as exc:
            raise FormatError(f"{path} is not a {PROFILE_KIND} of version {PROFILE_VERSION} ({exc})",
                              "write the JSON profile format of `joulebench plan --help`, or a CSV file") from None
    problem = _phase_list_problem(phases)
    if problem:
        raise FormatError(f"{path}: {problem} in its phases {phases}",
                          "name every phase of the step once, in execution order")
    samples: dict[tuple[str, Clock], list[tuple[float, float, str]]] = {}
    for number, row in enumerate(rows, start=1):
        where = f"{path} point {number}"
        try:
            if any(isinstance(row[key], bool) for key in ("time_s", "energy_j")):
                raise TypeError("true/false is not a number")
            sample = (float(row["time_s"]), float(row["energy_j"]), str(row.get("source") or path.name))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise FormatError(f"{where}: needs phase, clock, time_s and energy_j ({exc})",
                                  "give every point all four fields, numbers for time_s and energy_j") from None
        problems = _point_problems(sample[0], sample[1])
        if problems:
            raise FormatError(f"{where} cannot be planned on: {'; '.join(problems)}",
                              "give every point a positive, finite time_s and energy_j per step; leave out a point "
                              "that was not measured")
        if row.get("phase") not in phases:
            raise FormatError(f"{where}: phase {row.get('phase')!r} is not in the phase list {phases}",
                                  "list every phase in 'phases', in execution order")
        samples.setdefault((str(row["phase"]), _parse_clock(row.get("clock"), where)), []).append(sample)
    return Profile(phases, _average(samples), f"profile {path.name}")


# ---- the exact search ---------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Plan:
    clocks: tuple[Clock, ...]  # one per phase, in phase order
    time_s: float
    energy_j: float
    switches: int


def _switch_cost(option: Option, latency_s: float) -> tuple[float, float]:
    return latency_s, latency_s * option.power_w


def evaluate(profile: Profile, clocks: Sequence[Clock], latency_s: float) -> Plan:
    """Time and energy per step of one assignment, switches included (cyclic: the next step starts again)."""
    options = [profile.options[p][c] for p, c in zip(profile.phases, clocks, strict=True)]
    time, energy = sum(o.time_s for o in options), sum(o.energy_j for o in options)
    switches = 0
    for i, option in enumerate(options):
        if len(options) > 1 and clocks[i] != clocks[i - 1]:
            switches += 1
            extra_t, extra_e = _switch_cost(option, latency_s)
            time, energy = time + extra_t, energy + extra_e
    return Plan(tuple(clocks), time, energy, switches)


def _insert(front: list[tuple[float, float, tuple[Clock, ...]]], new: tuple[float, float, tuple[Clock, ...]]) -> None:
    """Keep `front` the pairs of (time, energy) that no other beats in both; the first of equal pairs stays."""
    if any(t <= new[0] and e <= new[1] for t, e, _ in front):
        return
    front[:] = [p for p in front if not (new[0] <= p[0] and new[1] <= p[1])]
    front.append(new)


def best_plan(profile: Profile, budget_s: float, latency_s: float) -> Plan | None:
    """The assignment of one clock per phase with the least energy per step whose time stays within budget_s."""
    limit = budget_s * (1 + 1e-12)
    states: dict[tuple[Clock, Clock], list[tuple[float, float, tuple[Clock, ...]]]] = {}
    for index, phase in enumerate(profile.phases):
        choices = sorted(profile.options[phase].items(), key=lambda i: _clock_order(i[0]))
        nxt: dict[tuple[Clock, Clock], list[tuple[float, float, tuple[Clock, ...]]]] = {}
        starts = states.items() if index else [((None, None), [(0.0, 0.0, ())])]
        for (first, current), front in starts:
            for clock, option in choices:
                extra_t, extra_e = (0.0, 0.0) if index == 0 or clock == current else _switch_cost(option, latency_s)
                for time, energy, chosen in front:
                    t, e = time + option.time_s + extra_t, energy + option.energy_j + extra_e
                    if t <= limit:
                        _insert(nxt.setdefault((clock if index == 0 else first, clock), []), (t, e, (*chosen, clock)))
        states = nxt
    finals: list[Plan] = []
    for (first, last), front in states.items():
        for time, energy, chosen in front:
            if len(chosen) > 1 and first != last:  # the next step starts at the first phase's clock
                extra_t, extra_e = _switch_cost(profile.options[profile.phases[0]][first], latency_s)
                time, energy = time + extra_t, energy + extra_e
            if time <= limit:
                switches = sum(1 for i in range(len(chosen)) if len(chosen) > 1 and chosen[i] != chosen[i - 1])
                finals.append(Plan(chosen, time, energy, switches))
    return min(finals, key=lambda p: (p.energy_j, p.time_s, [_clock_order(c) for c in p.clocks]), default=None)


def single_clocks(profile: Profile) -> list[Plan]:
    """Every clock measured for all phases, as one setting for the whole step (no switches)."""
    return [evaluate(profile, [c] * len(profile.phases), 0.0) for c in profile.clocks
            if all(c in profile.options[p] for p in profile.phases)]


# ---- output ---------------------------------------------------------------------------------------------------
def _as_dict(p: Plan) -> dict[str, Any]:
    return {"clocks": list(p.clocks), "time_s": p.time_s, "energy_j": p.energy_j, "switches": p.switches}


def _pct(value: float, base: float) -> str:
    return f"{100 * (value / base - 1):+.2f} %" if base else "n/a"


def summarise(profile: Profile, max_slowdown: float, latency_s: float) -> tuple[list[str], dict[str, Any]]:
    profile.check()
    default = evaluate(profile, [DEFAULT] * len(profile.phases), 0.0)
    budget = default.time_s * (1 + max_slowdown)
    singles = [p for p in single_clocks(profile) if p.time_s <= budget * (1 + 1e-12)]
    single = min(singles, key=lambda p: (p.energy_j, p.time_s))  # the default itself always qualifies
    plan = best_plan(profile, budget, latency_s)
    assert plan is not None  # the default assignment fits the budget
    width = max(len(p) for p in profile.phases)
    lines = [f"per-phase time and energy per step from {profile.origin}"]
    lines += [f"{'phase':<{width}}  {'plan clock':>10}  {'time s':>10}  {'energy J':>10}  (per step; PREDICTED plan)"]
    for phase, clock in zip(profile.phases, plan.clocks, strict=True):
        option = profile.options[phase][clock]
        lines.append(f"{phase:<{width}}  {clock_name(clock):>10}  {fmt(option.time_s, 5):>10}  "
                     f"{fmt(option.energy_j, 5):>10}")

    def row(title: str, p: Plan) -> str:
        return (f"{title}: {fmt(p.time_s, 5)} s ({_pct(p.time_s, default.time_s)}), {fmt(p.energy_j, 5)} J "
                f"({_pct(p.energy_j, default.energy_j)}) per step")

    how = profile.energy
    lines += [row(f"default clocks ({how}: one run's phases)", default),
              row(f"best single clock within {100 * max_slowdown:.2f} % ({how} at {clock_name(single.clocks[0])})",
                  single),
              row(f"per-phase plan (PREDICTED: phases of different runs, {plan.switches} clock switch(es) per step at "
                  f"{fmt(latency_s * 1e3, 3)} ms)", plan)]
    gain = single.energy_j - plan.energy_j
    if gain <= 1e-9 * max(single.energy_j, 1e-300):
        lines.append("the per-phase plan saves nothing more than the best single clock")
    else:
        lines.append(f"the per-phase plan saves a further {100 * gain / default.energy_j:.2f} % of the default's "
                     "energy (predicted)")
    lines += [f"left out: {reason}" for reason in profile.excluded]
    lines += [f"flagged: {reason}" for reason in profile.unchecked]
    data = {
        "origin": profile.origin, "max_slowdown": max_slowdown, "switch_latency_s": latency_s,
        "phases": profile.phases,
        "default": {"measured": how == "measured", **_as_dict(default)},
        "best_single_clock": {"measured": how == "measured", **_as_dict(single)},
        **({} if how == "measured" else {"energy": how}),
        "plan": {"predicted": True, **_as_dict(plan)}, "excluded": profile.excluded,
        "clock_unchecked": profile.unchecked,
    }
    return lines, data


def main(argv: Sequence[str]) -> int:
    parser = ArgumentParser(prog="joulebench plan", description=__doc__.split("\n\n")[0],
                            formatter_class=argparse.RawDescriptionHelpFormatter,
                            epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("paths", nargs="*", type=Path, help="run records (or JUBE run directories) of a clock sweep")
    parser.add_argument("--profile", type=Path, default=None, help="a JSON or CSV profile instead of run records")
    parser.add_argument("--method", default="fit", choices=("fit", "replay"),
                        help="attribution estimator to use: fit (default) or replay")
    parser.add_argument("--max-slowdown", default="1%", help="time allowed above the default clocks (1%% or 0.01)")
    parser.add_argument("--switch-latency", type=SECONDS_OR_ZERO, default=0.0, metavar="S",
                        help="seconds one clock switch costs (default 0 = free)")
    parser.add_argument("--json", type=Path, default=None, help="also write the result as JSON")
    parser.add_argument("--write-profile", type=Path, default=None, help="write the per-phase profile (JSON)")
    args = state_ranges(parser).parse_args(argv)
    if bool(args.paths) == bool(args.profile):
        raise ValidationError("give either run records or --profile", "e.g. `joulebench plan jube/runs/llm/000003` "
                                                                      "or `joulebench plan --profile clocks.csv`")
    profile = read_profile(args.profile) if args.profile else profile_from_records(args.paths, args.method)
    if args.write_profile:
        write_json_atomic(args.write_profile, profile.to_json())
    lines, data = summarise(profile, parse_fraction(args.max_slowdown), args.switch_latency)
    print("\n".join(lines))
    if args.json:
        write_json_atomic(args.json, data)
    return ExitCode.OK

