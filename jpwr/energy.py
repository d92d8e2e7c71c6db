"""public: for code that builds results from window energies (the run record, node combination).

Window energy types: what the meter reports for one named window, and how nodes add up.

A window is a named interval marked by the loop (warm-up, steady, idle, ...); its energy on one
node's accelerators, or on all nodes once combined, carries the method, coverage and error bound
that every published figure needs. Missing values are None ("n/a" in text), never 0.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from jpwr.backends.replay import REPLAYED
from jpwr.device_energy import DeviceEnergy, Fault
from jpwr.output import known_fields

__all__ = ["ACCELERATORS", "HEADLINE_DOMAINS", "J_PER_WH", "combine_energies", "split_energy"]

J_PER_WH = 3600.0
# WindowEnergy.domain of a headline: what its total sums (jpwr.windows.headline_domains chooses)
ACCELERATORS = "accelerators"  # the headline's energy domain on a node with accelerator sensors
CPU_PACKAGE = "cpu package"  # ... without them: RAPL packages, plus DRAM where its zones are readable
CPU_PACKAGE_DRAM = "cpu package + dram"
REPLAYED_ACCELERATORS = f"{ACCELERATORS} ({REPLAYED})"  # a replayed trace's: never ranked with this machine's
# Every name a headline's domain may have: a reader refuses any other (a hand-edited or foreign record).
HEADLINE_DOMAINS = (ACCELERATORS, REPLAYED_ACCELERATORS, CPU_PACKAGE, CPU_PACKAGE_DRAM)


@dataclasses.dataclass(kw_only=True)
class WindowEnergy:
    """Energy of one window on the accelerators of one node (or all nodes once combined).

    Trust (docs/jpwr.md, "Faults and what the meter does about them"): when the meter has data for the
    window but not enough to stand behind a total (a device's data cover less than `coverage_threshold`
    of the window: lost, added late, failing reads), `trusted` is False, energy_j, mean_power_w and
    error_bound_j are None, `untrusted_reason` names device, time and read error, and the covered part is
    given in the partial_* fields (to be shown only when asked for, and labelled partial). A window with
    nothing to measure is not untrusted but unavailable (energy_j None, unavailable_reason).
    """

    energy_j: float | None
    mean_power_w: float | None
    devices: int
    method: str | None  # "counter", "counter+power", "power" or None when unavailable
    coverage: float | None  # fraction of window × devices with valid data, 0-1
    error_bound_j: float | None
    unavailable_reason: str | None = None
    warnings: list[str] = dataclasses.field(default_factory=list)
    per_device: list[DeviceEnergy] = dataclasses.field(default_factory=list)
    other_domains: list[DeviceEnergy] = dataclasses.field(default_factory=list)  # CPU/DRAM/module, never in total
    nodes: list[str] = dataclasses.field(default_factory=list)
    # True for a node whose device selection is empty (e.g. CUDA_VISIBLE_DEVICES=""): it metered nothing on
    # purpose, so a sum over nodes skips it instead of calling the whole window unavailable.
    metered_nothing: bool = False
    trusted: bool = True
    untrusted_reason: str | None = None  # "<device>: coverage 26.0% < 99% (no data from 0.95 s ... (NVML_ERROR_...))"
    # Every device's faults (jpwr.device_energy.Fault); trusted windows list the faults that were bridged too.
    faults: list[Fault] = dataclasses.field(default_factory=list)
    coverage_threshold: float | None = None  # the threshold applied (None in summaries written before it existed)
    partial_energy_j: float | None = None  # untrusted only: energy over the covered time, never a headline
    partial_error_bound_j: float | None = None  # its bound (uncovered time not charged)
    partial_mean_power_w: float | None = None  # sum over devices of energy / seconds measured (not / window)
    # What the headline covers: "accelerators", "cpu package + dram" (RAPL on a node without accelerator sensors),
    # "accelerators (replayed trace, not this machine)"; None where nothing was measured (jpwr.windows).
    domain: str | None = None
    # A whole-node request (`jpwr --whole-node`): the node's devices the job is not bound to, over the same window.
    # Their own line ("not used by the job: N devices, X J"), never a part of the figures above.
    outside_job: list[DeviceEnergy] = dataclasses.field(default_factory=list)

    @property
    def energy_wh(self) -> float | None:
        return None if self.energy_j is None else self.energy_j / J_PER_WH

    @property
    def mean_power_w_per_device(self) -> float | None:
        if self.mean_power_w is None or self.devices <= 0:
            return None
        return self.mean_power_w / self.devices

    @property
    def outside_job_energy_j(self) -> float | None:
        """The energy of the devices outside the job; None where none was metered or one of them has none."""
        energies = [d.energy_j for d in self.outside_job]
        if not energies or any(e is None for e in energies):
            return None
        return sum(e for e in energies if e is not None)

    @property
    def outside_job_line(self) -> str | None:
        """The whole-node line, or None where no device outside the job was metered."""
        if not self.outside_job:
            return None
        energy = self.outside_job_energy_j
        return (f"not used by the job: {len(self.outside_job)} devices, "
                + ("n/a J (a device's energy is n/a)" if energy is None else f"{energy:.6g} J"))

    @classmethod
    def unavailable(cls, reason: str, devices: int = 0) -> WindowEnergy:
        return cls(energy_j=None, mean_power_w=None, devices=devices, method=None, coverage=None, error_bound_j=None,
                   unavailable_reason=reason)

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["energy_wh"] = self.energy_wh
        data["mean_power_w_per_device"] = self.mean_power_w_per_device
        data["outside_job_energy_j"] = self.outside_job_energy_j
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> WindowEnergy:
        fields = known_fields(cls, data)
        fields["per_device"] = [DeviceEnergy.from_dict(d) for d in data.get("per_device", ())]
        fields["other_domains"] = [DeviceEnergy.from_dict(d) for d in data.get("other_domains", ())]
        fields["outside_job"] = [DeviceEnergy.from_dict(d) for d in data.get("outside_job", ())]
        fields["faults"] = [Fault.from_dict(f) for f in data.get("faults", ())]
        return cls(**fields)


@dataclasses.dataclass
class Window:
    """A named interval of the training loop: steps [first_step, last_step), its work and energy."""

    name: str
    first_step: int
    last_step: int
    t_start_ns: int  # monotonic, node-local
    t_end_ns: int
    work: dict[str, float] = dataclasses.field(default_factory=dict)  # e.g. {"tokens": 1.2e6, "samples": 600}
    energy: WindowEnergy | None = None
    end_reason: str | None = None  # why the window ended where it did (planned length reached, stop request...)
    split: EnergySplit | None = None  # idle and dynamic parts of `energy` (split_energy)

    @property
    def steps(self) -> int:
        return self.last_step - self.first_step

    @property
    def duration_s(self) -> float:
        return (self.t_end_ns - self.t_start_ns) / 1e9

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "first_step": self.first_step, "last_step": self.last_step,
            "steps": self.steps, "t_start_ns": self.t_start_ns, "t_end_ns": self.t_end_ns,
            "duration_s": self.duration_s, "work": dict(self.work),
            "energy": None if self.energy is None else self.energy.to_dict(), "end_reason": self.end_reason,
            "energy_split": None if self.split is None else self.split.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Window:
        energy = data.get("energy")
        split = data.get("energy_split")
        return cls(
            name=data["name"], first_step=data["first_step"], last_step=data["last_step"],
            t_start_ns=data["t_start_ns"], t_end_ns=data["t_end_ns"], work=dict(data.get("work", {})),
            energy=None if energy is None else WindowEnergy.from_dict(energy), end_reason=data.get("end_reason"),
            split=None if split is None else EnergySplit.from_dict(split),
        )


@dataclasses.dataclass(kw_only=True)
class IdleBaseline:
    """Power of the job's devices while idle, measured before the first window, and how settled they were.

    "Idle" is the devices with the benchmark's process holding them (framework context open, model in
    memory) and no work queued: what a window would cost if the device did nothing. Settling (waiting
    until power and temperature stop moving, bounded) makes a hot device from a previous job cool down
    first; whether it settled, and after how long, is stated.
    """

    power_w: float | None
    error_bound_w: float | None
    devices: int
    duration_s: float | None = None
    method: str | None = None
    settled: bool | None = None  # None: no settling was attempted (no sampler)
    settle_wait_s: float | None = None
    settle_note: str | None = None
    unavailable_reason: str | None = None
    nodes: list[str] = dataclasses.field(default_factory=list)

    @classmethod
    def unavailable(cls, reason: str) -> IdleBaseline:
        return cls(power_w=None, error_bound_w=None, devices=0, unavailable_reason=reason)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> IdleBaseline:
        return cls(**known_fields(cls, data))


@dataclasses.dataclass(kw_only=True)
class EnergySplit:
    """A window's energy as idle (idle power × duration) plus dynamic (the rest), each with its bound."""

    idle_j: float | None
    idle_bound_j: float | None
    dynamic_j: float | None
    dynamic_bound_j: float | None
    idle_power_w: float | None
    unavailable_reason: str | None = None

    @classmethod
    def unavailable(cls, reason: str) -> EnergySplit:
        return cls(idle_j=None, idle_bound_j=None, dynamic_j=None, dynamic_bound_j=None, idle_power_w=None,
                   unavailable_reason=reason)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> EnergySplit:
        return cls(**known_fields(cls, data))


def split_energy(energy: WindowEnergy | None, duration_s: float, idle: IdleBaseline | None) -> EnergySplit:
    """Idle part = idle power × duration, dynamic part = window energy − idle part.

    Bounds add: the idle part carries the baseline's power bound over the whole window, the dynamic
    part that plus the window's own bound. Unknown energy or idle power gives None parts with the reason
    (never a 0), as does a baseline over other devices than the window's.
    """
    if idle is None:
        return EnergySplit.unavailable("no idle baseline was measured")
    if idle.power_w is None:
        return EnergySplit.unavailable(f"idle power unknown: {idle.unavailable_reason}")
    if energy is None or energy.energy_j is None:
        reason = energy.unavailable_reason if energy else "no energy measured"
        return EnergySplit.unavailable(f"window energy unknown: {reason}")
    if energy.devices != idle.devices:
        return EnergySplit.unavailable(f"idle baseline covers {idle.devices} devices, the window {energy.devices}")
    idle_j = idle.power_w * duration_s
    idle_bound = (idle.error_bound_w or 0.0) * duration_s
    return EnergySplit(idle_j=idle_j, idle_bound_j=idle_bound, dynamic_j=energy.energy_j - idle_j,
                       dynamic_bound_j=(energy.error_bound_j or 0.0) + idle_bound, idle_power_w=idle.power_w)


def _count_devices_once(parts: Sequence[WindowEnergy]) -> tuple[list[WindowEnergy], list[str]]:
    """Drop a device (by UUID) from every node after the first that metered it, with a warning naming them.

    Two samplers that see the same device (two `jpwr serve` on one host, or a device selection that
    overlaps) would otherwise add its energy twice.
    """
    first_node: dict[str, str] = {}
    repeats: dict[str, list[str]] = {}
    kept = []
    for part in parts:
        keep: list[DeviceEnergy] = []
        dropped: list[DeviceEnergy] = []
        for dev in part.per_device:
            uuid = dev.uuid
            node = dev.node or ",".join(part.nodes) or "?"
            if uuid and uuid in first_node:
                dropped.append(dev)
                repeats.setdefault(uuid, [first_node[uuid]]).append(node)
                continue
            if uuid:
                first_node[uuid] = node
            keep.append(dev)
        if dropped:
            part = dataclasses.replace(
                part, per_device=keep, devices=part.devices - len(dropped),
                energy_j=(part.energy_j - sum(d.energy_j or 0.0 for d in dropped)
                          if part.energy_j is not None else None),
                mean_power_w=(part.mean_power_w - sum(d.mean_power_w or 0.0 for d in dropped)
                              if part.mean_power_w is not None else None),
                error_bound_j=(part.error_bound_j - sum(d.error_bound_j or 0.0 for d in dropped)
                               if part.error_bound_j is not None else None),
                **_without_partial(part, dropped))
        kept.append(part)
    warnings = [
        f"device {uuid} was metered by the samplers of nodes {', '.join(nodes)}: counted once, on node {nodes[0]}. "
        "Fix: run one sampler per host (one `jpwr serve` per node, distinct JPWR_NODE_NAME only across hosts), or "
        "give each sampler its own devices (CUDA_VISIBLE_DEVICES / Slurm GPU binding)"
        for uuid, nodes in repeats.items()]
    return kept, warnings


def _without_partial(part: WindowEnergy, dropped: Sequence[DeviceEnergy]) -> dict[str, Any]:
    """An untrusted node's partial figures less those of devices counted on another node."""
    out = {}
    for field, whole in (("partial_energy_j", "energy_j"), ("partial_error_bound_j", "error_bound_j"),
                         ("partial_mean_power_w", "mean_power_w")):
        total = getattr(part, field)
        if total is not None:
            out[field] = total - sum(getattr(d, whole if d.trusted else field) or 0.0 for d in dropped)
    return out


def combine_energies(per_node: Sequence[Mapping[str, WindowEnergy]]) -> dict[str, WindowEnergy]:
    """Sum one window's energy over nodes: energy, power, devices and bounds add; coverage is device-weighted.

    Each device is counted once (by UUID), with a warning naming the nodes that both metered it. A node
    that metered nothing on purpose (empty device selection) is skipped and named. A window missing or
    unavailable on any other node makes the total unavailable (a partial sum would silently under-report),
    with every node's reason kept. A window untrusted on any node is untrusted in total, with each node's
    reason and the partial figures summed (trusted nodes add their whole ones).
    """
    names: list[str] = []
    for node in per_node:
        names += [n for n in node if n not in names]
    combined: dict[str, WindowEnergy] = {}
    for name in names:
        parts = [node.get(name) for node in per_node]
        empty = [p for p in parts if p is not None and p.metered_nothing]
        parts = [p for p in parts if p is None or not p.metered_nothing]
        notes = [p.unavailable_reason or "a node metered nothing" for p in empty]
        if not parts:
            combined[name] = WindowEnergy.unavailable("; ".join(notes))
            combined[name].metered_nothing, combined[name].nodes = True, [n for p in empty for n in p.nodes]
            continue
        missing = [p for p in parts if p is None or (p.energy_j is None and p.trusted)]
        if missing:
            reasons = sorted({(p.unavailable_reason or "unknown") if p else "window missing on a node"
                              for p in missing})
            combined[name] = WindowEnergy.unavailable("; ".join(reasons), sum(p.devices for p in parts if p))
            continue
        present, overlap = _count_devices_once([p for p in parts if p is not None])
        domains = sorted({p.domain for p in present if p.domain})  # None: a summary written before the field
        if len(domains) > 1:  # a CPU node's RAPL never adds to another node's GPUs
            by_node = "; ".join(f"{','.join(p.nodes)}: {p.domain}" for p in present)
            combined[name] = WindowEnergy.unavailable(f"the nodes metered different energy domains ({by_node})",
                                                      sum(p.devices for p in present))
            continue
        devices = sum(p.devices for p in present)
        methods = sorted({p.method for p in present if p.method})
        thresholds = [p.coverage_threshold for p in present if p.coverage_threshold is not None]
        combined[name] = WindowEnergy(
            energy_j=sum(p.energy_j or 0.0 for p in present),
            mean_power_w=sum(p.mean_power_w or 0.0 for p in present),
            devices=devices,
            method=",".join(methods) if len(methods) > 1 else (methods[0] if methods else None),
            coverage=(sum((p.coverage or 0.0) * p.devices for p in present) / devices) if devices else None,
            error_bound_j=sum(p.error_bound_j or 0.0 for p in present),
            warnings=sorted({w for p in present for w in p.warnings}) + overlap + notes,
            per_device=[d for p in present for d in p.per_device],
            other_domains=[d for p in present for d in p.other_domains],
            nodes=[n for p in present for n in p.nodes] + [n for p in empty for n in p.nodes],
            faults=[f for p in present for f in p.faults],
            coverage_threshold=max(thresholds) if thresholds else None,
            domain=domains[0] if domains else None,
            outside_job=_outside_job([*present, *empty]),  # a node that metered nothing may still have the line
        )
        untrusted = [p for p in present if not p.trusted]
        if untrusted:
            reason = "; ".join(f"{','.join(p.nodes)}: {p.untrusted_reason}" for p in untrusted)
            _withhold(combined[name], present, reason)
    return combined


def _outside_job(parts: Sequence[WindowEnergy]) -> list[DeviceEnergy]:
    """The nodes' devices outside the job, each once (by UUID), leaving out any that another node's job used."""
    used = {d.uuid for p in parts for d in p.per_device if d.uuid}
    seen: set[str] = set()
    outside = []
    for device in (d for p in parts for d in p.outside_job):
        if device.uuid in used or (device.uuid and device.uuid in seen):
            continue
        if device.uuid:
            seen.add(device.uuid)
        outside.append(device)
    return outside


def _withhold(total: WindowEnergy, parts: Sequence[WindowEnergy], reason: str) -> None:
    """Turn a node sum into an untrusted total: headline figures None, the partial ones summed."""

    def partial(whole: str, part: str) -> float | None:
        values = [getattr(p, whole) if p.trusted else getattr(p, part) for p in parts]
        return sum(v for v in values if v is not None) if any(v is not None for v in values) else None

    total.partial_energy_j = partial("energy_j", "partial_energy_j")
    total.partial_error_bound_j = partial("error_bound_j", "partial_error_bound_j")
    total.partial_mean_power_w = partial("mean_power_w", "partial_mean_power_w")
    total.energy_j = total.mean_power_w = total.error_bound_j = None
    total.trusted, total.untrusted_reason, total.unavailable_reason = False, reason, f"untrusted: {reason}"
