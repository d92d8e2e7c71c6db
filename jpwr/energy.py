"""Window energy types: what the meter reports for one named window, and how nodes add up.

A window is a named interval marked by the loop (warm-up, steady, idle, ...); its energy on one
node's accelerators, or on all nodes once combined, carries the method, coverage and error bound
that every published figure needs. Missing values are None ("n/a" in text), never 0.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

J_PER_WH = 3600.0


@dataclasses.dataclass
class WindowEnergy:
    """Energy of one window on the accelerators of one node (or all nodes once combined)."""

    energy_j: float | None
    mean_power_w: float | None
    devices: int
    method: str | None  # "counter", "counter+power", "power" or None when unavailable
    coverage: float | None  # fraction of window × devices with valid data, 0-1
    error_bound_j: float | None
    unavailable_reason: str | None = None
    warnings: list[str] = dataclasses.field(default_factory=list)
    per_device: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    other_domains: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # CPU/DRAM/module, never in total
    nodes: list[str] = dataclasses.field(default_factory=list)

    @property
    def energy_wh(self) -> float | None:
        return None if self.energy_j is None else self.energy_j / J_PER_WH

    @property
    def mean_power_w_per_device(self) -> float | None:
        if self.mean_power_w is None or self.devices <= 0:
            return None
        return self.mean_power_w / self.devices

    @classmethod
    def unavailable(cls, reason: str, devices: int = 0) -> WindowEnergy:
        return cls(None, None, devices, None, None, None, unavailable_reason=reason)

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["energy_wh"] = self.energy_wh
        data["mean_power_w_per_device"] = self.mean_power_w_per_device
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> WindowEnergy:
        fields = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in fields})


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
            "energy": None if self.energy is None else self.energy.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Window:
        energy = data.get("energy")
        return cls(
            name=data["name"], first_step=data["first_step"], last_step=data["last_step"],
            t_start_ns=data["t_start_ns"], t_end_ns=data["t_end_ns"], work=dict(data.get("work", {})),
            energy=None if energy is None else WindowEnergy.from_dict(energy),
        )


def combine_energies(per_node: Sequence[Mapping[str, WindowEnergy]]) -> dict[str, WindowEnergy]:
    """Sum one window's energy over nodes: energy, power, devices and bounds add; coverage is device-weighted.

    A window missing or unavailable on any node makes the total unavailable (a partial sum would
    silently under-report), with every node's reason kept.
    """
    names: list[str] = []
    for node in per_node:
        names += [n for n in node if n not in names]
    combined: dict[str, WindowEnergy] = {}
    for name in names:
        parts = [node.get(name) for node in per_node]
        missing = [p for p in parts if p is None or p.energy_j is None]
        if missing:
            reasons = sorted({(p.unavailable_reason or "unknown") if p else "window missing on a node"
                              for p in missing})
            combined[name] = WindowEnergy.unavailable("; ".join(reasons), sum(p.devices for p in parts if p))
            continue
        present = [p for p in parts if p is not None]
        devices = sum(p.devices for p in present)
        methods = sorted({p.method for p in present if p.method})
        combined[name] = WindowEnergy(
            energy_j=sum(p.energy_j or 0.0 for p in present),
            mean_power_w=sum(p.mean_power_w or 0.0 for p in present),
            devices=devices,
            method=",".join(methods) if len(methods) > 1 else (methods[0] if methods else None),
            coverage=(sum((p.coverage or 0.0) * p.devices for p in present) / devices) if devices else None,
            error_bound_j=sum(p.error_bound_j or 0.0 for p in present),
            warnings=sorted({w for p in present for w in p.warnings}),
            per_device=[d for p in present for d in p.per_device],
            other_domains=[d for p in present for d in p.other_domains],
            nodes=[n for p in present for n in p.nodes],
        )
    return combined
