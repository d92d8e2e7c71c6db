"""Merge the per-node summaries of one run into one run-level summary without double counting.

Nodes are found by run id in one directory (DIR/<node>/summary.json). A device whose UUID
appears in two node summaries (two samplers on one host) is counted once, with a warning.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from jpwr.energy import WindowEnergy, combine_energies
from jpwr.errors import ValidationError
from jpwr.output import utc_now, write_json_atomic
from jpwr.sampler import SUMMARY_FILE


def node_summaries(directory: Path, run_id: str | None = None) -> list[dict[str, Any]]:
    paths = sorted(directory.glob(f"*/{SUMMARY_FILE}"))
    found = [json.loads(p.read_text()) for p in paths]
    if run_id is not None:
        found = [s for s in found if s.get("run_id") == run_id]
    if not found:
        which = f" with run id {run_id!r}" if run_id else ""
        raise ValidationError(f"no node summaries{which} under {directory}",
                              "point jpwr combine at the --out directory the samplers wrote to")
    return found


def _drop_duplicate_devices(energies: list[dict[str, WindowEnergy]]) -> list[dict[str, WindowEnergy]]:
    """Remove devices already counted on an earlier node from later nodes' totals."""
    seen: set[str] = set()
    for node in energies:
        for name, energy in node.items():
            keep, dropped = [], []
            for dev in energy.per_device:
                uuid = dev.get("uuid")
                (dropped if uuid and (name, uuid) in seen else keep).append(dev)
                if uuid:
                    seen.add((name, uuid))  # type: ignore[arg-type]
            if dropped and energy.energy_j is not None:
                removed = sum(float(d["energy_j"] or 0.0) for d in dropped)
                energy.energy_j -= removed
                if energy.mean_power_w is not None:
                    energy.mean_power_w -= sum(float(d["mean_power_w"] or 0.0) for d in dropped)
                energy.error_bound_j = (energy.error_bound_j or 0.0) - sum(
                    float(d["error_bound_j"] or 0.0) for d in dropped)
                energy.devices -= len(dropped)
                energy.per_device = keep
                energy.warnings.append(
                    f"devices metered by more than one sampler counted once: {[d['uuid'] for d in dropped]}")
    return energies


def combine_run(directory: Path, run_id: str | None = None) -> dict[str, Any]:
    summaries = node_summaries(directory, run_id)
    per_node = [
        {name: WindowEnergy.from_dict(w["energy"]) for name, w in s["windows"].items()}
        for s in summaries
    ]
    combined = combine_energies(_drop_duplicate_devices(per_node))
    windows = {}
    for name, energy in combined.items():
        spans = [s["windows"][name] for s in summaries if name in s["windows"]]
        windows[name] = {
            "duration_s": max(w["duration_s"] for w in spans), "steps": max(w["steps"] for w in spans),
            "work": spans[0]["work"], "energy": energy.to_dict(),
        }
    result = {
        "schema": "jpwr.summary/1", "kind": "combined", "run_id": summaries[0]["run_id"],
        "nodes": [s["node"] for s in summaries], "finished_at": utc_now(), "windows": windows,
    }
    write_json_atomic(directory / SUMMARY_FILE, result)
    return result
