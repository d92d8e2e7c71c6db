"""Merge the per-node summaries of one run into one run-level summary without double counting.

Nodes are found by run id in one directory (DIR/<node>/summary.json). A device whose UUID
appears in two node summaries (two samplers on one host) is counted once, with a warning naming
the nodes and the fix (jpwr.energy.combine_energies, the same sum the drivers use).
A node whose sampler was killed before writing its summary is recovered from its segments.
Nodes of another run are never added in, and a run with fewer nodes than expected has no
combined energy (a partial sum would under-report silently): it says which nodes reported.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

from jpwr.energy import WindowEnergy, combine_energies
from jpwr.errors import FormatError, ValidationError
from jpwr.output import utc_now, write_json_atomic
from jpwr.sampler import summarize_trace
from jpwr.summary import SUMMARY_FILE, CombinedSummary, NodeSummary, NodeWindow, SummaryWindow
from jpwr.trace_io import SEGMENT_DIR, TraceData, read_segments
from jpwr.windows import unclosed_windows

EXPECTED_NODES_ENV = ("SLURM_JOB_NUM_NODES", "SLURM_NNODES")


def read_node_summary(node_dir: Path) -> NodeSummary:
    """A node's summary, or one rebuilt from its segments when its sampler died before writing it."""
    path = node_dir / SUMMARY_FILE
    if path.exists():
        try:
            summary = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            summary = {"error": str(exc)}
        missing = [key for key in ("windows", "run_id", "node") if not isinstance(summary, dict) or key not in summary]
        if missing:
            raise FormatError(f"{path} is not a jpwr node summary (no {', '.join(missing)})",
                              f"remove {node_dir} from {node_dir.parent}, or delete the file so that combine "
                              f"recovers the node from its segments in {node_dir / SEGMENT_DIR}")
        return NodeSummary.from_dict(summary)
    trace = read_segments(node_dir)
    if not trace.info:
        raise FormatError(f"{node_dir} has neither a summary nor readable segments",
                          f"remove {node_dir} from {node_dir.parent}")
    summary = summarize_trace(trace, float(trace.info.get("interval_s") or 0.1))
    summary.recovered_from_segments = True
    for window in summary.windows.values():
        window.energy.warnings.append(
            f"node {summary.node}: its sampler ended without a summary (killed?); energy recovered from its "
            "segments, which lose at most the last second before the kill")
    summary.windows.update(lost_windows(trace, summary.node))
    return summary


def lost_windows(trace: TraceData, node: str) -> dict[str, NodeWindow]:
    """The windows a killed sampler saw begin but not end: listed with no energy and why, never dropped (a run
    whose steady window vanished from the summary read as if it had none). Their span is what was sampled of
    them: from the begin to the sampler's last reading."""
    last = max((r.t_after_ns for rows in trace.readings.values() for r in rows), default=None)
    lost = {}
    for name, t0 in unclosed_windows(trace.marks).items():
        t1 = max(t0, last if last is not None else t0)
        energy = WindowEnergy.unavailable(
            f"node {node}: its sampler ended (killed?) {(t1 - t0) / 1e9:.3g} s after this window began, before it "
            "ended: the window's energy is not known")
        energy.nodes = [node]
        lost[name] = NodeWindow(t0_ns=t0, t1_ns=t1, duration_s=(t1 - t0) / 1e9, steps=0, work={}, energy=energy)
    return lost


def node_summaries(directory: Path, run_id: str | None = None) -> list[NodeSummary]:
    node_dirs = sorted({p.parent for p in directory.glob(f"*/{SUMMARY_FILE}")} |
                       {p.parent for p in directory.glob(f"*/{SEGMENT_DIR}")})
    found = [read_node_summary(d) for d in node_dirs]
    runs = sorted({str(s.run_id) for s in found})
    if run_id is not None:
        found = [s for s in found if s.run_id == run_id]
    elif len(runs) > 1:
        by_run = "; ".join(f"{r}: {', '.join(s.node for s in found if str(s.run_id) == r)}" for r in runs)
        raise ValidationError(f"{directory} holds node summaries of {len(runs)} runs ({by_run})",
                              "pass --run-id with the run to combine (nodes of different runs never add up)")
    if not found:
        which = f" with run id {run_id!r}" if run_id else ""
        raise ValidationError(f"no node summaries{which} under {directory}",
                              "point jpwr combine at the --out directory the samplers wrote to")
    return found


def expected_nodes_from(environ: Mapping[str, str] | None = None) -> int | None:
    """Nodes the launch environment says the run has (Slurm's allocation), None outside Slurm."""
    env = os.environ if environ is None else environ
    for key in EXPECTED_NODES_ENV:
        if env.get(key, "").isdigit():
            return int(env[key])
    return None


def combine_run(directory: Path, run_id: str | None = None, expected_nodes: int | None = None) -> CombinedSummary:
    summaries = node_summaries(directory, run_id)
    nodes = [s.node for s in summaries]
    combined = combine_energies([{name: w.energy for name, w in s.windows.items()} for s in summaries])
    partial = None
    if expected_nodes is not None and len(summaries) < expected_nodes:
        partial = (f"only {len(summaries)} of {expected_nodes} nodes' samplers left a trace ({', '.join(nodes)}): "
                   "the run's energy is not known")
        combined = {name: WindowEnergy.unavailable(partial, energy.devices)
                    for name, energy in combined.items()}
    windows = {}
    for name, energy in combined.items():
        spans = [s.windows[name] for s in summaries if name in s.windows]
        windows[name] = SummaryWindow(duration_s=max(w.duration_s for w in spans), steps=max(w.steps for w in spans),
                                      work=spans[0].work, energy=energy)
    result = CombinedSummary(
        run_id=summaries[0].run_id, nodes=nodes, expected_nodes=expected_nodes, partial=partial,
        recovered_nodes=[s.node for s in summaries if s.recovered_from_segments], finished_at=utc_now(),
        windows=windows)
    write_json_atomic(directory / SUMMARY_FILE, result.to_dict())
    return result
