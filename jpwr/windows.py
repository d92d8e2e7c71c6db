"""From a node's trace and its window marks to per-window energy on that node's accelerators.

Used live by the sampler (answering a rank's query) and offline on a saved trace, so both
give the same numbers. Only accelerator domains not contained in another counted domain are
added into the headline; CPU, DRAM and module domains are reported beside it, never summed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from jpwr.channel import Mark
from jpwr.domains import Domain, Signal
from jpwr.energy import WindowEnergy
from jpwr.estimator import DomainEnergy, domain_window_energy
from jpwr.trace import SensorSeries, TraceData

DEFAULT_P_MAX_W = 1000.0  # only when a device states no power limit and no sample exceeds it


@dataclasses.dataclass(frozen=True)
class WindowSpan:
    """A window as the node saw it: earliest begin and latest end over the node's ranks."""

    name: str
    t0_ns: int
    t1_ns: int
    steps: int
    work: dict[str, float]


def spans_from_marks(marks: Iterable[Mark]) -> dict[str, WindowSpan]:
    """Pair begin/end marks by window name; windows still open are left out."""
    begins: dict[str, list[Mark]] = {}
    ends: dict[str, list[Mark]] = {}
    for m in marks:
        (begins if m.edge == "begin" else ends).setdefault(m.name, []).append(m)
    spans = {}
    for name, bs in begins.items():
        es = ends.get(name)
        if not es:
            continue
        first = min(bs, key=lambda m: (m.rank, m.t_ns))
        last = min(es, key=lambda m: (m.rank, -m.t_ns))
        spans[name] = WindowSpan(
            name, min(m.t_ns for m in bs), max(m.t_ns for m in es), last.step - first.step, dict(last.work))
    return spans


def accelerator_domains(domains: Iterable[Domain]) -> list[Domain]:
    """Accelerators forming a disjoint cover: drop any contained in another accelerator domain."""
    accel = [d for d in domains if d.kind.is_accelerator]
    inner = {c for d in accel for c in d.contains}
    return [d for d in accel if d.id not in inner]


def _pick(trace: TraceData, domain: Domain) -> tuple[SensorSeries | None, SensorSeries | None]:
    sensors = [s for s in trace.sensors if s.domain_id == domain.id]
    counter = next((s for s in sensors if s.signal is Signal.ENERGY_COUNTER), None)
    power = next((s for s in sensors if s.signal is Signal.POWER_INSTANT), None) or next(
        (s for s in sensors if s.signal is Signal.POWER_AVERAGE), None)
    return (trace.series(counter.id) if counter else None, trace.series(power.id) if power else None)


def _p_max(domain: Domain, power: SensorSeries | None) -> float:
    limit = dict(domain.attrs).get("power_limit_w")
    if limit:
        return float(limit) * 1.2  # instant readings run above the cap (H100: up to ~795 W at 700 W)
    if power is not None and power.valid.any():
        return float(power.value[power.valid].max()) * 1.2
    return DEFAULT_P_MAX_W


def domain_entry(domain: Domain, result: DomainEnergy, duration_s: float, node: str) -> dict[str, object]:
    return {
        "domain": domain.id, "node": node, "kind": domain.kind.value, "name": domain.name, "uuid": domain.device_uuid,
        "pci_bus_id": domain.pci_bus_id, "index": domain.index, "energy_j": result.energy_j,
        "mean_power_w": None if result.energy_j is None or duration_s <= 0 else result.energy_j / duration_s,
        "method": result.method, "coverage": result.coverage, "error_bound_j": result.error_bound_j,
        "warnings": result.warnings, "unavailable_reason": result.reason, "shared_with": list(domain.shared_with),
    }


def window_energy(
    trace: TraceData, span: WindowSpan, interval_s: float, node: str, unavailable: Iterable[str] = (),
    empty_selection: str | None = None,
) -> WindowEnergy:
    """Energy of one window summed over the node's accelerators, other domains listed beside it.

    empty_selection: why the node owns no accelerators on purpose (its device selection is empty); such
    a node reports that it metered nothing, and sums over nodes skip it.
    """
    duration_s = (span.t1_ns - span.t0_ns) / 1e9
    accel = accelerator_domains(trace.domains)
    per_device, others = [], []
    for domain in trace.domains:
        counter, power = _pick(trace, domain)
        result = domain_window_energy(counter, power, span.t0_ns, span.t1_ns, interval_s,
                                      _p_max(domain, power), span.steps)
        (per_device if domain in accel else others).append(domain_entry(domain, result, duration_s, node))
    if not accel and empty_selection:
        energy = WindowEnergy.unavailable(f"node {node} metered no accelerators: {empty_selection}")
        energy.metered_nothing, energy.other_domains, energy.nodes = True, others, [node]
        return energy
    if not accel:
        reasons = "; ".join(unavailable) or "no backend found a device"
        return WindowEnergy.unavailable(f"no accelerator sensors on node {node}: {reasons}")
    missing = [d for d in per_device if d["energy_j"] is None]
    if missing:
        reasons = "; ".join(f"{d['domain']}: {d['unavailable_reason']}" for d in missing)
        energy = WindowEnergy.unavailable(f"no data for {len(missing)} of {len(per_device)} devices ({reasons})",
                                          devices=len(per_device))
        energy.per_device, energy.other_domains, energy.nodes = per_device, others, [node]
        return energy
    total = sum(float(d["energy_j"]) for d in per_device)  # type: ignore[arg-type]
    methods = sorted({str(d["method"]) for d in per_device})
    warnings = sorted({f"{d['domain']}: {w}" for d in per_device for w in d["warnings"]})  # type: ignore[attr-defined]
    shared = [d["domain"] for d in per_device if d["shared_with"]]
    if shared:
        warnings.append(f"sensor shared with devices outside this job (energy covers them too): {', '.join(shared)}")
    return WindowEnergy(
        energy_j=total,
        mean_power_w=total / duration_s if duration_s > 0 else None,
        devices=len(per_device),
        method=",".join(methods),
        coverage=sum(float(d["coverage"]) for d in per_device) / len(per_device),  # type: ignore[arg-type]
        error_bound_j=sum(float(d["error_bound_j"] or 0.0) for d in per_device),  # type: ignore[arg-type]
        warnings=warnings,
        per_device=per_device,
        other_domains=others,
        nodes=[node],
    )
