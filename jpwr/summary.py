"""A run's energy summaries (summary.json, schema jpwr.summary/1): one per node, written by its sampler, and one
combined over the nodes by `jpwr combine`.

Typed in memory; dicts only where a summary is written (to_dict) or read back (from_dict). The keys are those
of the files written before, and from_dict reads node summaries that lack the fields added since.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, TypedDict

from jpwr.domains import Kind
from jpwr.energy import WindowEnergy
from jpwr.phases import PhaseRow

SCHEMA = "jpwr.summary/1"
SUMMARY_FILE = "summary.json"


@dataclasses.dataclass(kw_only=True)
class SummaryWindow:
    """One window of a summary: its length, steps and work, and its energy (summed over nodes once combined)."""

    duration_s: float
    steps: int
    work: dict[str, float]
    energy: WindowEnergy

    def to_dict(self) -> dict[str, Any]:
        return {"duration_s": self.duration_s, "steps": self.steps, "work": dict(self.work),
                "energy": self.energy.to_dict()}


@dataclasses.dataclass(kw_only=True)
class NodeWindow(SummaryWindow):
    """A window on one node: its span on the node's monotonic clock and the phases its ranks sent."""

    t0_ns: int
    t1_ns: int
    phases: list[PhaseRow] = dataclasses.field(default_factory=list)  # jpwr.phases.phase_summary's

    def to_dict(self) -> dict[str, Any]:
        return {"t0_ns": self.t0_ns, "t1_ns": self.t1_ns, **super().to_dict(), "phases": self.phases}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> NodeWindow:
        return cls(t0_ns=data["t0_ns"], t1_ns=data["t1_ns"], duration_s=data["duration_s"], steps=data["steps"],
                   work=dict(data["work"]), energy=WindowEnergy.from_dict(data["energy"]),
                   phases=list(data.get("phases", [])))


class JobAccelerator(TypedDict):
    """One accelerator a node's sampler metered for the job (NodeSummary.job_accelerators)."""

    index: int | None
    uuid: str | None
    name: str | None


@dataclasses.dataclass(kw_only=True)
class NodeSummary:
    """What one node's sampler measured: its windows' energies, and the devices, sensors and settings behind them."""

    run_id: str | None
    node: str
    finished_at: str | None
    info: dict[str, Any]  # the sampler's settings, backends and clock pairs (Sampler.info)
    missed_ticks: int | None  # None when rebuilt from segments (not known)
    domains: list[dict[str, Any]]
    sensors: list[dict[str, Any]]
    windows: dict[str, NodeWindow]
    trace_file: str | None = None  # set once the HDF5 trace is written
    trace_error: str | None = None  # why the trace is incomplete
    # Read back from segments because its sampler died before writing the summary (by combine; never written).
    recovered_from_segments: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA, "kind": "node", "run_id": self.run_id, "node": self.node,
            "finished_at": self.finished_at, "info": self.info, "missed_ticks": self.missed_ticks,
            "domains": self.domains, "sensors": self.sensors, "trace_file": self.trace_file,
            "trace_error": self.trace_error, "windows": {name: w.to_dict() for name, w in self.windows.items()},
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> NodeSummary:
        return cls(run_id=data["run_id"], node=str(data["node"]), finished_at=data.get("finished_at"),
                   info=dict(data.get("info", {})), missed_ticks=data.get("missed_ticks"),
                   domains=list(data.get("domains", [])), sensors=list(data.get("sensors", [])),
                   windows={name: NodeWindow.from_dict(w) for name, w in data["windows"].items()},
                   trace_file=data.get("trace_file"), trace_error=data.get("trace_error"))

    def job_accelerators(self) -> list[JobAccelerator]:
        """The accelerators this node's sampler metered for the job, in the vendor library's order: index, UUID and
        name (a whole-node request's other devices and domains inside another one left out). What a run record names
        as the job's devices."""
        outside = set(self.info.get("outside_job") or [])
        inner = {inside for d in self.domains for inside in d.get("contains") or ()}
        return [{"index": d.get("index"), "uuid": d.get("device_uuid"), "name": d.get("name")} for d in self.domains
                if d.get("kind") in {k.value for k in Kind if k.is_accelerator}
                and d.get("id") not in outside and d.get("id") not in inner]

    def selections(self) -> list[str]:
        """How each vendor backend chose the job's devices (`CUDA_VISIBLE_DEVICES=1`: jpwr.selectors)."""
        backends = self.info.get("backends") or {}
        return [str(info["selection"]) for info in backends.values()
                if isinstance(info, dict) and info.get("selection")]


@dataclasses.dataclass(kw_only=True)
class CombinedSummary:
    """One run's windows summed over its nodes (jpwr.combine); no energy when nodes are missing (`partial`)."""

    run_id: str | None
    nodes: list[str]
    expected_nodes: int | None
    partial: str | None  # why the run's energy is not known: fewer nodes reported than expected
    recovered_nodes: list[str]  # nodes whose summary was rebuilt from their segments
    finished_at: str
    windows: dict[str, SummaryWindow]

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA, "kind": "combined", "run_id": self.run_id, "nodes": self.nodes,
            "expected_nodes": self.expected_nodes, "partial": self.partial, "recovered_nodes": self.recovered_nodes,
            "finished_at": self.finished_at, "windows": {name: w.to_dict() for name, w in self.windows.items()},
        }
