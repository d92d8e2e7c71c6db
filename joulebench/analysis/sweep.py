"""What the sweep verbs share (`report --pareto`, `recommend` and its re-measuring): which runs can be trusted, the
runs of one setting averaged, and what a setting misses of a target.

A run is left out of a front or a ranking, named with the reason, where its energy cannot be trusted (FAILED,
rejected figures, energy n/a, coverage below --min-coverage, a warning on its energy) or, when ranking settings, where
it was disturbed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from joulebench.analysis import knobs
from joulebench.analysis.runs import Run
from joulebench.disturbed import summary as disturbed_summary
from joulebench.savings import Saving
from jpwr import ValidationError
from jpwr.output import fmt

DEFAULT_MIN_COVERAGE = 0.99
TPOT_KEYS = ("tpot_p90_s", "per_token_latency_p90_s")  # serving records, then static-batch records
TTFT_KEYS = ("ttft_p90_s",)


def parse_fraction(text: str) -> float:
    """'1%' or '0.01'; a bare number of 1 or more is refused, since '1' could mean either."""
    raw = text.strip()
    try:
        value = float(raw.rstrip("%")) / (100 if raw.endswith("%") else 1)
    except ValueError:
        raise ValidationError(f"--max-slowdown {text!r} is not a number", "write e.g. 1% or 0.01") from None
    if not 0 <= value < 1 or (not raw.endswith("%") and value >= 1):
        raise ValidationError(f"--max-slowdown {text!r} is not a fraction below 1", "write e.g. 1% or 0.01")
    return value


def exclusion(run: Run, min_coverage: float) -> str | None:
    """Why a run's energy cannot stand on a front or in a ranking (`report --pareto`'s rule), or None."""
    record, metrics = run.record, run.record.metrics
    if not run.usable:
        return f"status {record.status}: {record.status_reason or 'no reason recorded'}"
    if run.rejected:
        return run.rejected
    if run.cost.energy_per_unit_j is None:
        return run.cost.reason or "energy n/a"
    coverage = metrics.get("energy_coverage")
    if coverage is None or coverage < min_coverage:
        return f"energy coverage {fmt(None if coverage is None else 100 * coverage, 3)} % is below " \
               f"{fmt(100 * min_coverage, 3)} %"
    if metrics.get("energy_warning"):
        return str(metrics["energy_warning"])
    return None


@dataclasses.dataclass(frozen=True)
class Target:
    max_tpot_s: float | None = None
    max_ttft_s: float | None = None
    max_slowdown: float | None = None
    min_throughput: float | None = None

    def words(self, unit: str) -> str:
        parts = ([f"p90 TPOT <= {fmt(self.max_tpot_s * 1e3, 4)} ms"] if self.max_tpot_s is not None else []) + (
            [f"p90 TTFT <= {fmt(self.max_ttft_s * 1e3, 4)} ms"] if self.max_ttft_s is not None else []) + (
            [f"slowdown <= {100 * self.max_slowdown:.2f} % against the default"]
            if self.max_slowdown is not None else []) + (
            [f"throughput >= {fmt(self.min_throughput, 4)} {unit}/s"] if self.min_throughput is not None else [])
        return ", ".join(parts) or "none (the cheapest setting)"


@dataclasses.dataclass
class Group:
    """The trustworthy runs of one setting, averaged."""

    setting: knobs.Setting
    runs: list[Run]

    @property
    def names(self) -> list[str]:
        return [r.record.run_id for r in self.runs]

    def _mean(self, values: Sequence[float | None]) -> float:
        known = [v for v in values if v is not None]
        return sum(known) / len(known)

    @property
    def energy_per_unit_j(self) -> float:
        return self._mean([r.cost.energy_per_unit_j for r in self.runs])

    @property
    def time_per_unit_s(self) -> float:
        return self._mean([r.cost.time_per_unit_s for r in self.runs])

    @property
    def energy_bound(self) -> float | None:
        """Relative: a mean is within its runs' largest bound (n/a when any is)."""
        bounds = [r.cost.energy_bound for r in self.runs]
        return None if any(b is None for b in bounds) else max(b for b in bounds if b is not None)

    def worst(self, keys: Sequence[str]) -> float | None:
        """The largest of the runs' first metric present among `keys` (a limit holds for every repeat); None if a
        run has none."""
        values = [next((r.metric(k) for k in keys if r.metric(k) is not None), None) for r in self.runs]
        return None if any(v is None for v in values) else max(v for v in values if v is not None)


@dataclasses.dataclass
class Row:
    group: Group
    saving: Saving
    slowdown: float
    misses: list[str]  # the target's limits it misses (empty: meets the target)
    semantic: list[str]  # what it changes in what is computed (empty: the same work)


@dataclasses.dataclass
class Recommendation:
    benchmark: str
    unit: str
    target: Target
    varied: list[str]
    default: Row
    rows: list[Row]
    chosen: Row | None  # None: no setting meets the target
    left_out: list[str]
    model: str | None

    @property
    def is_default(self) -> bool:
        return self.chosen is self.default


def target_misses(group: Group, base: Group, target: Target, unit: str) -> list[str]:
    """The target's limits `group` misses against the default's runs `base` (empty: it meets the target)."""
    found: list[str] = []
    for limit, keys, name in ((target.max_tpot_s, TPOT_KEYS, "p90 TPOT"), (target.max_ttft_s, TTFT_KEYS, "p90 TTFT")):
        if limit is not None:
            value = group.worst(keys)
            if value is None or value > limit:
                found.append(f"{name} {'n/a' if value is None else fmt(value * 1e3, 4) + ' ms'} > "
                             f"{fmt(limit * 1e3, 4)} ms")
    slow = group.time_per_unit_s / base.time_per_unit_s - 1
    if target.max_slowdown is not None and slow > target.max_slowdown * (1 + 1e-12):
        found.append(f"slowdown {100 * slow:+.2f} % > {100 * target.max_slowdown:.2f} %")
    throughput = 1 / group.time_per_unit_s
    if target.min_throughput is not None and throughput < target.min_throughput:
        found.append(f"throughput {fmt(throughput, 4)} < {fmt(target.min_throughput, 4)} {unit}/s")
    return found


def untrusted(run: Run, min_coverage: float) -> str | None:
    """Why a run cannot be ranked: `report --pareto`'s trust rule, or a disturbed run."""
    return exclusion(run, min_coverage) or disturbed_summary(run.record.disturbed)


