"""From a node's trace and its window marks to per-window energy on that node's accelerators.

Used live by the sampler (answering a rank's query) and offline on a saved trace, so both
give the same numbers. Only accelerator domains not contained in another counted domain are
added into the headline; CPU, DRAM and module domains are reported beside it, never summed.
A node without accelerator sensors takes its headline from RAPL instead (CPU packages plus
DRAM), so a CPU-only machine still has figures; `WindowEnergy.domain` says which it is, and
nothing that ranks runs mixes the two (docs/jpwr.md, "The headline's energy domain").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

from jpwr.backends.rapl import PERMISSION_FIX
from jpwr.backends.replay import NAME as REPLAYED_BACKEND
from jpwr.channel import Mark, is_interval_mark
from jpwr.device_energy import DeviceEnergy
from jpwr.domains import Domain, Kind, MetricReading, Signal
from jpwr.energy import ACCELERATORS, CPU_PACKAGE, CPU_PACKAGE_DRAM, REPLAYED_ACCELERATORS, WindowEnergy
from jpwr.estimator import DomainEnergy, domain_window_energy
from jpwr.trace_io import SensorSeries, TraceData

DEFAULT_P_MAX_W = 1000.0  # only when a device states no power limit and no sample exceeds it
# Below this share of a window with data on every device, the window's energy is withheld (docs/jpwr.md,
# "Faults and what the meter does about them"); Sampler(min_coverage=...) and window_energy() take another.
DEFAULT_MIN_COVERAGE = 0.99
UTILIZATION = "utilization_gpu"  # the metric whose window mean each device's entry carries


@dataclasses.dataclass(frozen=True)
class WindowSpan:
    """A window as the node saw it: earliest begin and latest end over the node's ranks."""

    name: str
    t0_ns: int
    t1_ns: int
    steps: int
    work: dict[str, float]


def spans_from_marks(marks: Iterable[Mark], intervals: bool = False) -> dict[str, WindowSpan]:
    """Pair begin/end marks by window name; windows still open are left out, and so are log intervals unless
    `intervals` (only a query that names them asks for their energy)."""
    begins: dict[str, list[Mark]] = {}
    ends: dict[str, list[Mark]] = {}
    for m in marks:
        if is_interval_mark(m.name) and not intervals:
            continue
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


def unclosed_windows(marks: Iterable[Mark]) -> dict[str, int]:
    """The windows that began but never ended in these marks (log intervals aside), with their first begin's time:
    a sampler killed inside them saw no end."""
    marks = list(marks)
    ended = {m.name for m in marks if m.edge == "end"}
    begun: dict[str, int] = {}
    for m in marks:
        if m.edge == "begin" and m.name not in ended and not is_interval_mark(m.name):
            begun[m.name] = min(begun.get(m.name, m.t_ns), m.t_ns)
    return begun


def accelerator_domains(domains: Iterable[Domain]) -> list[Domain]:
    """Accelerators forming a disjoint cover: drop any contained in another accelerator domain."""
    accel = [d for d in domains if d.kind.is_accelerator]
    inner = {c for d in accel for c in d.contains}
    return [d for d in accel if d.id not in inner]


def job_domains(domains: Iterable[Domain], outside_job: Iterable[str]) -> list[Domain]:
    """The domains of the job's devices: all but those a whole-node request metered beside the job's."""
    outside = set(outside_job)
    return [d for d in domains if d.id not in outside]


def cpu_domains(domains: Iterable[Domain]) -> list[Domain]:
    """RAPL's CPU packages and DRAM zones: disjoint rails (core and uncore lie inside a package, psys covers all)."""
    return [d for d in domains if d.kind in (Kind.CPU_PACKAGE, Kind.DRAM)]


def headline_domains(domains: Sequence[Domain]) -> tuple[list[Domain], str | None]:
    """The domains summed into the headline and the domain's name: the accelerators where the node has any,
    else its CPU packages (+ DRAM), else none. A replayed trace says so in the name, so it is never mistaken for
    (or ranked with) this machine's energy."""
    accel = accelerator_domains(domains)
    if accel:
        replayed = any(d.backend == REPLAYED_BACKEND for d in accel)
        return accel, REPLAYED_ACCELERATORS if replayed else ACCELERATORS
    cpu = cpu_domains(domains)
    if not any(d.kind is Kind.CPU_PACKAGE for d in cpu):
        return [], None
    return cpu, CPU_PACKAGE_DRAM if any(d.kind is Kind.DRAM for d in cpu) else CPU_PACKAGE


def nothing_readable(node: str, unavailable: Iterable[str]) -> str:
    """One short reason for a node without a headline: RAPL needs root, or no sensor at all (`jpwr info` has
    every backend's own line, which the record need not repeat)."""
    if any(PERMISSION_FIX in line for line in unavailable):
        return (f"no accelerator sensor on node {node}, and RAPL's energy_uj needs root: run as root or make it "
                "readable (`jpwr info` says how)")
    return f"no energy sensor readable on node {node} (no accelerator, no RAPL): `jpwr info` lists why"


def cpu_headline(node: str, unavailable: Iterable[str]) -> str:
    """The warning of a headline taken from RAPL: which node, and why it read no accelerator."""
    why = "; ".join(unavailable)
    return f"headline from RAPL: no accelerator sensor on node {node}" + (f" ({why})" if why else "")


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


def mean_utilization(metrics: Iterable[MetricReading], t0_ns: int, t1_ns: int) -> dict[str, float]:
    """Domain id -> mean of its utilisation samples inside [t0, t1]; a domain without samples is absent."""
    samples: dict[str, list[float]] = {}
    for m in metrics:
        if m.name == UTILIZATION and t0_ns <= m.t_ns <= t1_ns:
            samples.setdefault(m.domain_id, []).append(m.value)
    return {domain: sum(values) / len(values) for domain, values in samples.items()}


def domain_entry(domain: Domain, result: DomainEnergy, duration_s: float, node: str,
                 min_coverage: float = DEFAULT_MIN_COVERAGE) -> DeviceEnergy:
    """One device's figures for a window, its faults named by device and node. Below `min_coverage` its energy
    is withheld (None): the covered part is reported as partial, over the seconds it was measured."""
    trusted = bool(result.energy_j is not None and result.coverage >= min_coverage)
    partial = None if trusted else result.energy_j
    energy = result.energy_j if trusted else None
    return DeviceEnergy(
        domain=domain.id, node=node, kind=domain.kind.value, name=domain.name, uuid=domain.device_uuid,
        pci_bus_id=domain.pci_bus_id, index=domain.index, energy_j=energy,
        mean_power_w=None if energy is None or duration_s <= 0 else energy / duration_s,
        method=result.method, coverage=result.coverage,
        error_bound_j=result.error_bound_j if trusted else None,
        warnings=result.warnings, unavailable_reason=result.reason, shared_with=list(domain.shared_with),
        trusted=trusted, covered_s=result.covered_s,
        faults=[dataclasses.replace(f, device=domain.id, node=node) for f in result.faults],
        partial_energy_j=partial,
        partial_error_bound_j=None if partial is None else max(0.0, (result.error_bound_j or 0.0) - result.gap_bound_j),
        partial_mean_power_w=None if partial is None or result.covered_s <= 0 else partial / result.covered_s,
    )


def _untrusted_reason(device: DeviceEnergy, min_coverage: float) -> str:
    """One device's line for the window's untrusted_reason: device, when, and the error the sensors gave."""
    where = "; ".join(f.detail for f in device.faults if f.kind == "gap") or device.unavailable_reason or "no data"
    return f"{device.domain}: coverage {device.coverage:.1%} < {min_coverage * 100:g}% ({where})"


def window_energy(
    trace: TraceData, span: WindowSpan, interval_s: float, node: str, unavailable: Iterable[str] = (),
    empty_selection: str | None = None, min_coverage: float = DEFAULT_MIN_COVERAGE,
) -> WindowEnergy:
    """Energy of one window summed over the node's accelerators, other domains listed beside it.

    empty_selection: why the node owns no accelerators on purpose (its device selection is empty); such
    a node reports that it metered nothing, and sums over nodes skip it.

    A window where any accelerator's data cover less than `min_coverage` of it is not trusted: its energy,
    mean power and bound are None (so nothing derived from them is computed), the reason names the device,
    the uncovered time and the read errors, and the covered part is given as partial_* figures.
    """
    duration_s = (span.t1_ns - span.t0_ns) / 1e9
    unavailable = list(unavailable)
    own = job_domains(trace.domains, trace.info.get("outside_job") or ())
    accel, domain_name = headline_domains(own)
    outside_accel = [d for d in accelerator_domains(trace.domains) if d not in own]
    utilization = mean_utilization(trace.metrics, span.t0_ns, span.t1_ns)
    per_device: list[DeviceEnergy] = []
    others: list[DeviceEnergy] = []
    outside_job: list[DeviceEnergy] = []
    for domain in trace.domains:
        counter, power = _pick(trace, domain)
        result = domain_window_energy(counter, power, span.t0_ns, span.t1_ns, interval_s,
                                      _p_max(domain, power), span.steps, domain.name)
        entry = dataclasses.replace(domain_entry(domain, result, duration_s, node, min_coverage),
                                    utilization_gpu=utilization.get(domain.id))
        (per_device if domain in accel else outside_job if domain in outside_accel else others).append(entry)
    energy = _job_energy(per_device, others, node, unavailable, empty_selection, min_coverage, domain_name,
                         duration_s, bool(accelerator_domains(own)))
    energy.outside_job = outside_job
    return energy


def _job_energy(per_device: list[DeviceEnergy], others: list[DeviceEnergy], node: str, unavailable: list[str],
                empty_selection: str | None, min_coverage: float, domain_name: str | None, duration_s: float,
                has_accelerators: bool) -> WindowEnergy:
    """The headline of one window on one node from its job's device entries (window_energy's rules)."""
    if empty_selection and not has_accelerators:  # no CPU fallback inside a GPU job
        energy = WindowEnergy.unavailable(f"node {node} metered no accelerators: {empty_selection}")
        energy.metered_nothing, energy.other_domains, energy.nodes = True, others, [node]
        return energy
    if not per_device:
        return WindowEnergy.unavailable(nothing_readable(node, unavailable))
    faults = [f for d in per_device for f in d.faults]
    warnings = sorted({f"{d.domain}: {w}" for d in per_device for w in d.warnings})
    if domain_name in (CPU_PACKAGE, CPU_PACKAGE_DRAM):  # why the headline is the CPU's: a GPU run may not want it
        warnings.insert(0, cpu_headline(node, unavailable))
    methods = sorted({d.method for d in per_device if d.method})
    coverage = sum(d.coverage for d in per_device) / len(per_device)
    shared = [d.domain for d in per_device if d.shared_with]
    if shared:
        warnings.append(f"sensor shared with devices outside this job (energy covers them too): {', '.join(shared)}")
    energies = [d.energy_j for d in per_device if d.energy_j is not None]
    untrusted = [d for d in per_device if d.energy_j is None]
    if untrusted:
        reason = "; ".join(_untrusted_reason(d, min_coverage) for d in untrusted)
        measured = [d for d in per_device if d.covered_s]
        return WindowEnergy(
            energy_j=None, mean_power_w=None, devices=_device_count(per_device), method=",".join(methods) or None,
            coverage=coverage, error_bound_j=None,
            unavailable_reason=f"untrusted: {reason}", warnings=warnings, per_device=per_device,
            other_domains=others, nodes=[node], trusted=False, untrusted_reason=reason, faults=faults,
            coverage_threshold=min_coverage, domain=domain_name,
            partial_energy_j=_sum(measured, "energy_j", "partial_energy_j"),
            partial_error_bound_j=_sum(measured, "error_bound_j", "partial_error_bound_j"),
            partial_mean_power_w=_sum(measured, "mean_power_w", "partial_mean_power_w"),
        )
    total = sum(energies)
    return WindowEnergy(
        energy_j=total,
        mean_power_w=total / duration_s if duration_s > 0 else None,
        devices=_device_count(per_device),
        method=",".join(methods),
        coverage=coverage,
        error_bound_j=sum(d.error_bound_j or 0.0 for d in per_device),
        warnings=warnings,
        per_device=per_device,
        other_domains=others,
        nodes=[node],
        faults=faults,
        coverage_threshold=min_coverage,
        domain=domain_name,
    )


def _device_count(per_device: Sequence[DeviceEnergy]) -> int:
    """Devices of the headline: each accelerator, or each CPU package (its DRAM zone is part of it, not a device)."""
    return sum(d.kind != Kind.DRAM.value for d in per_device)


def _sum(devices: list[DeviceEnergy], whole: str, partial: str) -> float | None:
    """Sum a figure over devices, taking each device's whole figure where it is trusted and its partial one
    where it is not; None when no device has it."""
    values = [getattr(d, whole if d.trusted else partial) for d in devices]
    present = [float(v) for v in values if v is not None]
    return sum(present) if present else None
