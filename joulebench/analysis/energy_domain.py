"""Runs are ranked only within one energy domain.

A tokens/Wh measured on the accelerators and one measured on the CPU packages and DRAM (RAPL, on a machine
without an accelerator sensor) count different hardware, and a replayed trace is no measurement of this
machine at all: a ranking, front or plan across them would compare nothing. The verbs that rank (report
--compare, report --pareto, plan) refuse such a set and name each run's domain; the HTML report keeps them
apart instead (its chart series and diagnoses are per domain), since showing several domains side by side,
labelled, is what a report is for. Records written before the field existed read as "accelerators"
(joulebench.record.headline_domain says why that is exact).
"""

from __future__ import annotations

from collections.abc import Iterable

from joulebench.record import RunRecord, headline_domain
from jpwr import ValidationError
from jpwr.trace import REPLAYED


def require_one_domain(records: Iterable[RunRecord], verb: str) -> str | None:
    """The one energy domain of the runs that have headline energy; a ValidationError naming the runs of each
    domain where there are several. Runs without energy have no domain and rank as n/a anyway."""
    by_domain: dict[str, list[str]] = {}
    for record in records:
        domain = headline_domain(record)
        if domain is not None:
            by_domain.setdefault(domain, []).append(record.run_id)
    if len(by_domain) > 1:
        listing = "; ".join(f"{domain}: {', '.join(ids[:3])}{' ...' if len(ids) > 3 else ''}"
                            for domain, ids in sorted(by_domain.items()))
        raise ValidationError(f"{verb} would rank runs of {len(by_domain)} energy domains ({listing})",
                              "pass runs of one domain: energy of accelerators, of CPU packages and DRAM, and of a "
                              "replayed trace count different things")
    return next(iter(by_domain), None)


def provenance(records: Iterable[RunRecord]) -> str:
    """How the runs' energy was obtained, in the words a ranking's output uses: "measured", or the replayed trace's
    label where the energy is a recording played back (never to be called measured)."""
    domains = {headline_domain(record) or "" for record in records}
    return REPLAYED if any(REPLAYED in domain for domain in domains) else "measured"
