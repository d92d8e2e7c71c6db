"""`joulebench recommend --remeasure`: run the recommended setting and the default again before the recommendation is
given, and set the measured saving beside the predicted one.

Each setting runs --repeats times, alternating default and recommended (a drift of the machine then touches both),
through the driver's own command line in a subprocess, rebuilt from a run record's config (the records hold their
configuration, not their command line; analysis imports no driver). Supported: static-batch `llm_inference run`
records. Any driver's re-runs made elsewhere (a second JUBE sweep of the two settings, run twice) are read with
`--remeasured RUNS...` (from_records) and compared the same way.

Bound of a measured side (relative): the meter's largest bound over its repeats plus the repeats' half range over
their mean, the two worst cases added as joulebench.savings adds them; the measured saving's bound is the sum of
the two sides'. The predicted and the measured saving agree where they differ by no more than their two bounds.
The re-runs are held to the target too (slowdown against the re-run default, latency limits, throughput): on one
H100 a batch-1 recommendation predicted at +4.3 % time re-measured at +11.9 % (by tokens/s; docs/BENCHMARKS.md),
so a saving alone does not confirm a recommendation.
"""

from __future__ import annotations

import dataclasses
import datetime
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from joulebench.analysis import knobs
from joulebench.analysis.runs import Run, load_runs
from joulebench.analysis.sweep import Group, Recommendation, target_misses, untrusted
from joulebench.bounded_run import run_bounded
from joulebench.savings import Saving
from joulebench.savings import saving as bounded_saving
from jpwr import ValidationError

# llm_inference run: the config keys that make a point, and the option of each (bool: --X / --no-X)
INFERENCE_RUN_OPTIONS = (
    ("preset", "--preset"), ("checkpoint", "--checkpoint"), ("task", "--task"), ("batch_size", "--batch-size"),
    ("num_batches", "--num-batches"), ("output_length", "--output-length"), ("precision", "--precision"),
    ("engine", "--engine"), ("attention", "--attention"), ("decode_tuning", "--decode-tuning"),
    ("objective", "--objective"), ("seed", "--seed"),
    ("warmup_batches", "--warmup-batches"), ("steady_seconds", "--steady-seconds"), ("device", "--device"),
    ("idle_baseline", "--idle-baseline"),
)
RUN_TIMEOUT_S = 3600  # one re-run; a point of the sweep took minutes at most


def rerun_command(config: Mapping[str, Any], energy_methods: str | None) -> list[str]:
    """The driver command that repeats a record's point (a static-batch llm_inference point), less its output
    directory and run id."""
    if config.get("rate") is not None or "batch_size" not in config or "preset" not in config:
        raise ValidationError("--remeasure re-runs static-batch `llm_inference run` points only",
                              "re-run the default and the printed setting yourself (e.g. JUBE with the sweep values "
                              "shown, twice or more) and pass those records with --remeasured")
    methods = energy_methods or config.get("energy_methods")
    if not methods:
        raise ValidationError("the re-runs need a meter: the records name no in-process energy methods (their "
                              "sampler was the job's)", "pass --energy-methods, e.g. nvml")
    words = [sys.executable, "-m", "llm_inference", "run"]
    for key, option in INFERENCE_RUN_OPTIONS:
        value = config.get(key)
        if isinstance(value, bool):
            words.append(option if value else option.replace("--", "--no-", 1))
        elif value is not None:
            words += [option, str(value)]
    return [*words, "--energy-methods", str(methods)]


@dataclasses.dataclass(frozen=True)
class Side:
    """One setting's re-runs."""

    name: str
    runs: list[Run]

    @property
    def energies(self) -> list[float]:
        return [e for r in self.runs if (e := r.cost.energy_per_unit_j) is not None]

    @property
    def mean_j(self) -> float:
        return sum(self.energies) / len(self.energies)

    @property
    def bound(self) -> float | None:
        """The meter's largest relative bound plus the repeats' half range over their mean."""
        meter = [r.cost.energy_bound for r in self.runs]
        if any(b is None for b in meter):
            return None
        spread = (max(self.energies) - min(self.energies)) / 2 / self.mean_j
        return max(b for b in meter if b is not None) + spread


@dataclasses.dataclass(frozen=True)
class Remeasured:
    predicted: Saving
    default: Side
    recommended: Side
    measured: Saving | None  # None: a re-run failed or left no trustworthy energy
    problems: list[str]
    slowdown: float | None  # the re-runs' time per unit against the re-run default's (None with `measured`)
    misses: list[str]  # the target's limits the re-runs of the recommendation miss
    reruns: int = 0  # re-runs that ran and left a record (trusted or not); 0: the re-measurement failed

    @property
    def confirmed(self) -> bool:
        """Measured, agreeing with the prediction, and still meeting the target."""
        return bool(self.agrees) and not self.misses

    @property
    def failed(self) -> bool:
        """No re-run left a record of a new run (each failed, or was refused as no re-run): the re-measurement
        failed, and the command exits non-zero. Re-runs that ran but are left out (disturbed, low coverage) leave
        the recommendation PREDICTED, not failed."""
        return self.reruns == 0

    @property
    def agrees(self) -> bool | None:
        if self.measured is None or self.predicted.bound is None or self.measured.bound is None:
            return None
        return abs(self.measured.fraction - self.predicted.fraction) <= self.predicted.bound + self.measured.bound

    def lines(self) -> list[str]:
        head = (f"re-measured ({len(self.default.runs)} + {len(self.recommended.runs)} runs, alternating): predicted "
                f"saving {self.predicted.words()}")
        if self.measured is None:
            return [f"{head}; measured saving n/a ({len(self.problems)} problem(s) below)",
                    *[f"problem: {p}" for p in self.problems],
                    "the recommendation stays PREDICTED (not confirmed by re-measuring)"]
        verdict = {True: "agrees with the prediction (within the combined bounds)",
                   False: "DISAGREES with the prediction (beyond the combined bounds): the sweep's figure did not hold",
                   None: "agreement n/a (a bound is n/a)"}[self.agrees]
        assert self.slowdown is not None  # set wherever the saving was measured (compared)
        held = ("meets the target" if not self.misses else
                f"MISSES the target ({'; '.join(self.misses)}): the recommendation is not confirmed")
        return [f"{head}; measured saving {self.measured.words()} (bound: meter + repeats' spread): {verdict}",
                f"re-measured time per unit {100 * self.slowdown:+.2f} % against the default: {held}",
                f"default runs: {', '.join(r.record.run_id for r in self.default.runs)}; recommended runs: "
                f"{', '.join(r.record.run_id for r in self.recommended.runs)}",
                *[f"problem: {p}" for p in self.problems]]

    def as_json(self) -> dict[str, Any]:
        return {"predicted": dataclasses.asdict(self.predicted),
                "measured": None if self.measured is None else dataclasses.asdict(self.measured),
                "agrees": self.agrees, "problems": self.problems, "slowdown": self.slowdown,
                "misses": self.misses, "confirmed": self.confirmed,
                "default_runs": [r.record.run_id for r in self.default.runs],
                "recommended_runs": [r.record.run_id for r in self.recommended.runs]}


def run_driver(command: list[str], out_dir: Path) -> Run | str:
    """One re-run: its record, or why there is none (a re-run stopped at RUN_TIMEOUT_S gets SIGTERM first: the record
    it then writes stays in `out_dir`, though it does not count)."""
    with tempfile.TemporaryFile("w+", errors="replace") as out, tempfile.TemporaryFile("w+", errors="replace") as err:
        code = run_bounded(command, RUN_TIMEOUT_S, stdout=out, stderr=err)
        out.seek(0)
        err.seek(0)
        tail = (err.read().strip() or out.read().strip()).splitlines()[-1:] or ["no output"]
    if isinstance(code, str):
        return f"{out_dir.name}: no complete record: {code}"
    if code != 0:
        return f"{out_dir.name}: exit {code}: {tail[0]}"
    return load_runs([out_dir])[0]


def remeasure(rec: Recommendation, repeats: int, root: Path, energy_methods: str | None,
              min_coverage: float, run: Callable[[list[str], Path], Run | str] = run_driver) -> Remeasured:
    """Run default and recommended `repeats` times each, alternating, and compare the savings (a re-run is left out
    by the sweep's own rule)."""
    assert rec.chosen is not None
    commands = {name: rerun_command(row.group.runs[0].record.config, energy_methods)
                for name, row in (("default", rec.default), ("recommended", rec.chosen))}
    runs: dict[str, list[Run]] = {"default": [], "recommended": []}
    problems: list[str] = []
    ran = 0
    for repeat in range(1, repeats + 1):
        for name, command in commands.items():
            out_dir = root / f"{name}-{repeat}"
            found = run([*command, "--out-dir", str(out_dir), "--run-id", f"{name}-{repeat}"], out_dir)
            ran += not isinstance(found, str)
            reason = found if isinstance(found, str) else untrusted(found, min_coverage)
            if reason:
                problems.append(reason if isinstance(found, str) else f"{found.record.run_id}: {reason}")
            else:
                assert not isinstance(found, str)
                runs[name].append(found)
    return dataclasses.replace(compared(rec, runs["default"], runs["recommended"], problems), reruns=ran)


def _started(run: Run) -> datetime.datetime | None:
    try:
        return datetime.datetime.fromisoformat(run.record.started_at)
    except (TypeError, ValueError):
        return None


def new_runs(runs: Sequence[Run], sweep: Sequence[Run]) -> tuple[list[Run], list[str]]:
    """The runs that are re-runs: not the sweep's own (by run id), each given once (by file and run id), started
    after every run of the sweep, of the sweep's workload (benchmark, knobs.WORKLOAD_KEYS) and on its node. A
    re-measurement from the sweep's own records would agree with its prediction by construction; the others are
    named with why they are no re-run."""
    sweep_ids = {r.record.run_id for r in sweep}
    starts = [t for t in map(_started, sweep) if t is not None]
    last = max(starts) if starts else None
    reference = next((r for r in sweep if not r.rejected), sweep[0]) if sweep else None
    kept: list[Run] = []
    problems: list[str] = []
    seen: dict[Path, str] = {}
    for run in runs:
        why = _not_new(run, sweep_ids, last, reference, seen, {r.record.run_id for r in kept})
        if why:
            problems.append(f"{run.record.run_id}: {why}")
        else:
            kept.append(run)
        seen.setdefault(run.path.resolve(), run.record.run_id)
    return kept, problems


def _not_new(run: Run, sweep_ids: set[str], last: datetime.datetime | None, reference: Run | None,
             seen: Mapping[Path, str], kept_ids: set[str]) -> str | None:
    """Why `run` is not a new re-run of the sweep, or None."""
    record = run.record
    if record.run_id in sweep_ids:
        return "is a run of the sweep itself, not a re-run: re-run the setting and pass the new records"
    if run.path.resolve() in seen:
        return f"{run.path} is given twice (as its directory and as its file?): each re-run counts once"
    if record.run_id in kept_ids:
        return "another re-run has the same run id: each re-run counts once"
    started = _started(run)
    if last is not None and (started is None or started < last):
        return (f"started {record.started_at}, before the sweep's last run ({last.isoformat()}): a re-run is made "
                "after the sweep")
    if reference is None:
        return None
    if record.benchmark != reference.record.benchmark:
        return f"is a {record.benchmark} run, the sweep's are {reference.record.benchmark}"
    for key in knobs.WORKLOAD_KEYS:
        if record.config.get(key) != reference.record.config.get(key):
            return (f"runs another workload ({key} {record.config.get(key)!r}, the sweep's "
                    f"{reference.record.config.get(key)!r})")
    node, theirs = record.launch.get("node_name"), reference.record.launch.get("node_name")
    if theirs and node != theirs:
        return f"ran on node {node}, the sweep on {theirs}: re-measure on the sweep's node"
    return None


def from_records(rec: Recommendation, runs: list[Run], min_coverage: float, sweep: Sequence[Run] = ()) -> Remeasured:
    """Re-runs made elsewhere: the runs of the default and the recommended setting among `runs` (others ignored), each
    side needing two trustworthy runs at least (a spread needs two); only new runs of the sweep count (new_runs)."""
    assert rec.chosen is not None
    sides: dict[str, list[Run]] = {"default": [], "recommended": []}
    runs, problems = new_runs(runs, sweep)
    wanted = {rec.default.group.setting: "default", rec.chosen.group.setting: "recommended"}
    for run in runs:
        side = None if run.rejected else wanted.get(knobs.setting_of(rec.benchmark, run.record.config))
        reason = run.rejected or untrusted(run, min_coverage)
        if reason and (side or run.rejected):
            problems.append(f"{run.record.run_id}: {reason}")
        elif side:
            sides[side].append(run)
    problems += [f"{len(found)} trustworthy re-run(s) of the {side} setting; at least 2 are needed"
                 for side, found in sides.items() if len(found) < 2]
    ran = sum(not r.unreadable and r.record.status != "FAILED" for r in runs)  # new runs that left a record
    return dataclasses.replace(compared(rec, sides["default"], sides["recommended"], problems), reruns=ran)


def compared(rec: Recommendation, default_runs: list[Run], recommended_runs: list[Run],
             problems: list[str]) -> Remeasured:
    """The re-runs' saving beside the predicted one, and the target checked on the re-runs (the recommendation's
    against the default's), unless a problem leaves them incomplete."""
    assert rec.chosen is not None
    default, recommended = Side("default", default_runs), Side("recommended", recommended_runs)
    if problems or not (default.energies and recommended.energies):
        return Remeasured(rec.chosen.saving, default, recommended, None, problems, None, [])
    base, again = Group(rec.default.group.setting, default_runs), Group(rec.chosen.group.setting, recommended_runs)
    return Remeasured(rec.chosen.saving, default, recommended,
                      bounded_saving(default.mean_j, default.bound, recommended.mean_j, recommended.bound), problems,
                      again.time_per_unit_s / base.time_per_unit_s - 1,
                      target_misses(again, base, rec.target, rec.unit))
