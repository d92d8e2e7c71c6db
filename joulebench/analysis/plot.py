"""`joulebench plot RUN_DIR -o trace.png`: power with the windows shaded and the phases marked, clocks, utilisation.

A glance at the trace shows whether a window's number can be trusted: is the steady window flat,
does it start after the warm-up, did clocks drop or utilisation sag inside it. Nodes are put on
one time axis through each sampler's wall/monotonic clock pair; window energies in the legend are
the samplers' own (summary.json) or, for a bare trace, recomputed with the same estimator.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from jpwr import ExitCode, ValidationError, WindowEnergy
from jpwr.energy import ACCELERATORS, combine_energies
from jpwr.errors import ArgumentParser
from jpwr.output import atomic_path, fmt
from jpwr.trace import (
    REPLAYED,
    SEGMENT_DIR,
    SUMMARY_FILE,
    TRACE_FILE,
    Domain,
    NodeSummary,
    Signal,
    TraceData,
    headline_domains,
    load_trace,
    spans_from_marks,
    window_energy,
)

if TYPE_CHECKING:  # matplotlib is an extra (reports): imported when drawing, so --help works without it
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

IMAGE_SUFFIXES = (".png", ".svg", ".pdf")
LABEL_ROW = 0.06  # axes fraction of the power axis per window label, from its top down
WINDOW_COLOURS = {"steady": "tab:green", "warmup": "tab:orange", "command": "tab:gray"}
PHASE_COLOURS = {"forward": "tab:blue", "backward": "tab:red", "optimizer": "tab:purple", "grad_reduce": "tab:brown",
                 "pipeline_p2p": "tab:olive"}
SEARCH_DEPTH = 5  # RUN_DIR/<node>, <record dir>/energy/<node>, JUBE <run>/<step>/work/run/energy/<node>
COUNTER_MIN_GAP_S = 0.5


@dataclasses.dataclass
class NodeTrace:
    """One node's trace, its sampler summary when there is one, and its offset to wall time."""

    name: str
    trace: TraceData
    summary: NodeSummary | None
    wall_offset_ns: int  # wall = monotonic + offset; 0 when the sampler recorded no clock pair


def _is_node_dir(path: Path) -> bool:
    return (path / TRACE_FILE).is_file() or (path / SEGMENT_DIR).is_dir()


def find_trace_sources(path: Path) -> list[Path]:
    """Node directories (or one .h5 file) under PATH; a clear error when there are none."""
    if path.is_file() and path.suffix == ".h5":
        return [path]
    if path.is_dir() and _is_node_dir(path):
        return [path]
    found: list[Path] = []
    if path.is_dir():
        level = [path]
        for _ in range(SEARCH_DEPTH):
            level = sorted(p for d in level for p in d.iterdir() if p.is_dir() and p.name != SEGMENT_DIR)
            found += [p for p in level if _is_node_dir(p)]
    if not found:
        raise ValidationError(
            f"no jpwr trace at {path} (looked for <node>/{TRACE_FILE} or <node>/{SEGMENT_DIR}/ up to "
            f"{SEARCH_DEPTH} levels down)",
            "pass a jpwr --out directory, one node directory, or a trace .h5 file")
    return found


def load_node(source: Path) -> NodeTrace:
    trace = load_trace(source)
    summary_path = source / SUMMARY_FILE if source.is_dir() else None
    summary = (NodeSummary.from_dict(json.loads(summary_path.read_text()))
               if summary_path and summary_path.is_file() else None)
    pairs = trace.info.get("clock_pairs_wall_mono_ns") or []
    offset = int(pairs[0][0]) - int(pairs[0][1]) if pairs else 0
    name = str(trace.info.get("node") or source.stem)
    return NodeTrace(name, trace, summary, offset)


def load_nodes(path: Path) -> list[NodeTrace]:
    """The nodes of one run; several runs under PATH would put unrelated traces on one axis."""
    nodes = [load_node(s) for s in find_trace_sources(path)]
    run_ids = sorted({str(n.trace.info.get("run_id")) for n in nodes})
    if len(run_ids) > 1:
        raise ValidationError(f"{path} holds traces of {len(run_ids)} runs ({', '.join(run_ids[:4])}"
                              f"{', ...' if len(run_ids) > 4 else ''})",
                              "pass the directory of one run (its jpwr --out directory or one node directory)")
    return nodes


def node_window_energies(node: NodeTrace) -> dict[str, WindowEnergy]:
    """The sampler's window energies, else the estimator run offline on the saved trace (same code)."""
    if node.summary is not None:
        return {name: w.energy for name, w in node.summary.windows.items()}
    interval = float(node.trace.info.get("interval_s") or 0.1)
    empty = node.trace.info.get("empty_selection")
    return {name: window_energy(node.trace, span, interval, node.name, empty_selection=empty)
            for name, span in spans_from_marks(node.trace.marks).items()}


def energy_label(name: str, energy: WindowEnergy | None, duration_s: float, allow_partial: bool = False) -> str:
    """Legend text of a window: energy with method, coverage and bound, or n/a with the reason; an untrusted
    window's energy over the time its data cover only when asked for (--allow-partial), labelled partial."""
    head = f"{name}: {duration_s:.1f} s"
    if allow_partial and energy is not None and energy.untrusted_reason and energy.partial_energy_j is not None:
        return (f"{head}, {fmt(energy.partial_energy_j, 5)} J (partial: covered time only, "
                f"coverage {fmt(None if energy.coverage is None else 100 * energy.coverage, 3)}%), "
                f"±{fmt(energy.partial_error_bound_j, 2)} J")
    if energy is None or energy.energy_j is None:
        reason = energy.unavailable_reason if energy else "not measured"
        return f"{head}, energy n/a ({_shorten(reason or 'unknown', 60)})"
    return (f"{head}, {fmt(energy.energy_j, 5)} J ({fmt(energy.energy_wh, 4)} Wh), {energy.method}, "
            f"coverage {fmt(None if energy.coverage is None else 100 * energy.coverage, 3)}%, "
            f"±{fmt(energy.error_bound_j, 2)} J")


def _shorten(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _device_label(node: NodeTrace, domain: Domain, several_nodes: bool) -> str:
    base = f"{domain.kind.value}{domain.index if domain.index is not None else ''}"
    return f"{node.name}/{base}" if several_nodes else f"{base} ({domain.name})"


def _counter_power(t_s: np.ndarray, energy_j: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean power between counter knots at least COUNTER_MIN_GAP_S apart, as (edges, values) for a step line.

    Reads taken during the after-mark chase are milliseconds apart; ΔE/Δt over such short gaps is
    dominated by the knot timing error, so knots are thinned before dividing.
    """
    ok = ~np.isnan(energy_j)
    t_s, energy_j = t_s[ok], energy_j[ok]
    change = np.concatenate(([0], np.flatnonzero(np.diff(energy_j) != 0) + 1)) if len(t_s) else np.array([], int)
    knots: list[int] = []
    for i in change:
        if not knots or t_s[i] - t_s[knots[-1]] >= COUNTER_MIN_GAP_S:
            knots.append(int(i))
    if len(knots) < 2:
        return np.array([]), np.array([])
    kt, ke = t_s[knots], energy_j[knots]
    watts = np.diff(ke) / np.diff(kt)
    watts[watts < 0] = np.nan  # a counter reset or wrap: no power shown rather than a negative one
    return kt, np.append(watts, watts[-1])  # repeat the last value so the last step is drawn to its end


def plot_trace(nodes: Sequence[NodeTrace], title: str | None = None, allow_partial: bool = False) -> Figure:
    """Power per device (instant, and counter-derived as steps), windows shaded; SM clock and utilisation below."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(13, 8.5), layout="constrained")
    ax_power, ax_clock, ax_util = fig.subplots(3, 1, sharex=True, height_ratios=(3, 1.3, 1.3))
    origin = _origin_ns(nodes)
    several = len(nodes) > 1
    for node in nodes:
        _plot_node(node, origin, several, ax_power, ax_clock, ax_util)
    windows, domain = _shade_windows(nodes, origin, (ax_power, ax_clock, ax_util), allow_partial)
    window_handles = windows + _mark_phases(nodes, origin, ax_power)
    ax_power.set_ylabel("accelerator power (W)" if domain.startswith(ACCELERATORS) else f"{domain} power (W)")
    ax_power.set_ylim(bottom=0)
    _label_headroom(ax_power, len(windows))
    ax_clock.set_ylabel("clock (MHz)")
    ax_util.set_ylabel("GPU utilisation (%)")
    ax_util.set_ylim(-2, 102)
    ax_util.set_xlabel("time since first reading (s)" + (", nodes aligned by wall clock" if several else ""))
    handles, _ = ax_power.get_legend_handles_labels()
    ax_power.legend(handles=handles + window_handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8,
                    title=f"devices and windows (energy: {domain})", title_fontsize=8)
    for ax in (ax_clock, ax_util):
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
        ax.grid(alpha=0.3)
    ax_power.grid(alpha=0.3)
    run_id = nodes[0].trace.info.get("run_id", "") if nodes else ""
    replayed = any(REPLAYED in d.name for n in nodes for d in n.trace.domains)
    fig.suptitle((title or f"jpwr trace {run_id} ({len(nodes)} node{'s' if several else ''})")
                 + (f" — {REPLAYED}" if replayed else ""))
    return fig


def _origin_ns(nodes: Sequence[NodeTrace]) -> int:
    starts = [min(r.t_before_ns for r in rows) + n.wall_offset_ns
              for n in nodes for rows in n.trace.readings.values() if rows]
    if not starts:
        raise ValidationError("the trace holds no sensor readings", "check jpwr info on that machine: no sensor "
                                                                    "was available when it ran")
    return min(starts)


def _plot_node(node: NodeTrace, origin: int, several: bool, ax_power, ax_clock, ax_util) -> None:
    trace = node.trace
    for domain in headline_domains(trace.domains)[0]:  # the accelerators, else RAPL's packages and DRAM
        label = _device_label(node, domain, several)
        sensors = {s.signal: s for s in trace.sensors if s.domain_id == domain.id}
        power = sensors.get(Signal.POWER_INSTANT) or sensors.get(Signal.POWER_AVERAGE)
        colour = None
        if power is not None:
            series = trace.series(power.id)
            t = (series.t_ns + node.wall_offset_ns - origin) / 1e9
            kind = "instant" if power.signal is Signal.POWER_INSTANT else f"{power.avg_window_s or '?'} s average"
            (line,) = ax_power.plot(t, series.value, lw=0.9, label=f"{label}: {kind} power")
            colour = line.get_color()
        counter = sensors.get(Signal.ENERGY_COUNTER)
        if counter is not None:
            series = trace.series(counter.id)
            edges, watts = _counter_power((series.t_ns + node.wall_offset_ns - origin) / 1e9, series.value)
            if len(watts):
                ax_power.step(edges, watts, where="post", lw=1.4, alpha=0.8, color=colour, ls="--",
                              label=f"{label}: counter ΔE/Δt")
        _plot_metric(trace, domain.id, "sm_clock_hz", 1e-6, node, origin, ax_clock, f"{label} SM", colour, "-")
        _plot_metric(trace, domain.id, "memory_clock_hz", 1e-6, node, origin, ax_clock, f"{label} memory", colour,
                     ":")
        _plot_metric(trace, domain.id, "utilization_gpu", 100.0, node, origin, ax_util, label, colour, "-")


def _plot_metric(trace: TraceData, domain_id: str, name: str, scale: float, node: NodeTrace, origin: int, ax,
                 label: str, colour: str | None, style: str) -> None:
    rows = [(m.t_ns, m.value) for m in trace.metrics if m.domain_id == domain_id and m.name == name]
    if not rows:
        return
    t, v = np.array(rows, dtype=float).T
    ax.plot((t + node.wall_offset_ns - origin) / 1e9, v * scale, lw=0.9, color=colour, ls=style, label=label)


def _label_headroom(ax, rows: int) -> None:
    """Raise the power axis' top so that the window labels' rows (from the top down) lie above every point of the
    curves: a label is never hidden by the curve, nor the curve by a label."""
    if rows:
        bottom, top = ax.get_ylim()
        ax.set_ylim(bottom, bottom + (top - bottom) / (1 - LABEL_ROW * rows))


def _shade_windows(nodes: Sequence[NodeTrace], origin: int, axes, allow_partial: bool) -> tuple[list[Patch], str]:
    """Shade every node's windows; one legend entry per window with its energy summed over nodes. Also returns
    what that energy covers (its domain: accelerators, or CPU packages and DRAM where no accelerator was metered)."""
    from matplotlib.patches import Patch

    per_node = [node_window_energies(n) for n in nodes]
    combined = combine_energies(per_node) if per_node else {}
    handles = []
    names: list[str] = []
    for node in nodes:
        for name, span in spans_from_marks(node.trace.marks).items():
            colour = WINDOW_COLOURS.get(name, f"C{(len(names) + 4) % 10}")
            t0 = (span.t0_ns + node.wall_offset_ns - origin) / 1e9
            t1 = (span.t1_ns + node.wall_offset_ns - origin) / 1e9
            alpha = 0.08 if name == "command" else 0.18
            for ax in axes:
                ax.axvspan(t0, t1, color=colour, alpha=alpha, lw=0)
            if name not in names:
                names.append(name)
                y = 0.98 - LABEL_ROW * (len(names) - 1)
                axes[0].text(t0, y, f" {name}", transform=axes[0].get_xaxis_transform(), va="top", fontsize=8,
                             color=colour, zorder=5)
                handles.append(Patch(color=colour, alpha=0.35,
                                     label=energy_label(name, combined.get(name), (span.t1_ns - span.t0_ns) / 1e9,
                                                        allow_partial)))
    return handles, ", ".join(sorted({e.domain for e in combined.values() if e.domain})) or "n/a"


def _mark_phases(nodes: Sequence[NodeTrace], origin: int, ax) -> list[Patch]:
    """Phase marks (jpwr.phases) as a strip along the bottom of the power axis, one row per node (its lowest
    local rank): where each step's forward, backward, optimizer... ran on the device."""
    from matplotlib.patches import Patch

    colours: dict[str, str] = {}
    for row, node in enumerate(nodes):
        batches = node.trace.phases
        if not batches:
            continue
        rank = min(b.local_rank for b in batches)
        spans: dict[str, list[tuple[float, float]]] = {}
        for batch in (b for b in batches if b.local_rank == rank):
            for name, a, b in batch.intervals():
                spans.setdefault(name, []).append(((a + node.wall_offset_ns - origin) / 1e9, (b - a) / 1e9))
        for name, bars in spans.items():
            colour = colours.setdefault(name, PHASE_COLOURS.get(name, f"C{(len(colours) + 5) % 10}"))
            ax.broken_barh(bars, (0.005 + 0.035 * row, 0.03), transform=ax.get_xaxis_transform(), color=colour, lw=0)
    return [Patch(color=c, label=f"phase: {name} (strip at the bottom)") for name, c in colours.items()]


def save_figure(fig: Figure, path: Path) -> Path:
    """Write the image via a temporary file and rename, so a viewer never reads half a PNG; the format is the
    name's (the temporary name ends in .tmp)."""
    suptitle = fig.get_suptitle()  # also in the PNG's own Title, so the file says what it shows
    image = path.suffix.lstrip(".").lower()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110, format=image,
                    metadata={"Title": suptitle} if suptitle and image == "png" else None)
    return path


def check_image_path(path: Path) -> None:
    if path.suffix.lower() not in IMAGE_SUFFIXES:
        raise ValidationError(f"output {path} has suffix {path.suffix or '(none)'!r}",
                              f"name the image with one of {', '.join(IMAGE_SUFFIXES)}, e.g. -o trace.png")


def main(argv: Sequence[str]) -> int:
    parser = ArgumentParser(prog="joulebench plot", description="Plot a jpwr trace with its windows shaded.")
    parser.add_argument("run_dir", type=Path, help="jpwr --out directory, one node directory, or a trace .h5 file")
    parser.add_argument("-o", "--output", type=Path, default=Path("trace.png"), help="image file (.png, .svg, .pdf)")
    parser.add_argument("--title", default=None)
    parser.add_argument("--allow-partial", action="store_true",
                        help="label untrusted windows with the energy of the time their data cover, marked partial")
    args = parser.parse_args(argv)
    check_image_path(args.output)
    fig = plot_trace(load_nodes(args.run_dir), args.title, args.allow_partial)
    print(f"joulebench plot: wrote {save_figure(fig, args.output)}")
    return ExitCode.OK
