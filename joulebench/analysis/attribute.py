"""`joulebench attribute RUN_DIR`: where the joules of a window go, per phase (and per kernel class), two ways.

Two estimators, both reported, never mixed:
* fit: the window's phase marks (jpwr.phases) joined with the energy counter's knots; mean power per phase
  by non-negative least squares over the counter segments (joulebench.analysis.phase_fit), 95 % block-
  bootstrap intervals, closure judged on held-out blocks. With --profile, the same over kernel classes.
* replay: the driver's replay windows (--replay-phases), J per invocation (joulebench.analysis.replay).
Inference records get the prefill/decode split of their windows. The result is printed and stored as the
run record's `attribution` block (docs/attribution.md).

    joulebench attribute RUN_DIR [--window steady] [--phases forward,backward] [--profile KERNELS.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from joulebench.analysis.attribution_text import render
from joulebench.analysis.kernel_classes import CATEGORY_NAMES, category
from joulebench.analysis.phase_fit import LabelFit, Timeline, exclusive_timeline, fit_labels, held_out_folds
from joulebench.analysis.plausible import device_power_problem
from joulebench.analysis.plausible import idle_power_w as recorded_idle_w
from joulebench.analysis.plot import find_trace_sources
from joulebench.analysis.replay import add_dynamic, inference_estimator, replay_estimator
from joulebench.arguments import SEED, WATTS, Number, comma_list, state_ranges
from joulebench.figures import rejection
from joulebench.phases import STANDARD_PHASES
from joulebench.record import RECORD_FILE, RunRecord, headline_domain, read_run_record, write_run_record
from joulebench.segment_fit import MIN_SEGMENTS, Fold, counter_knots, window_segments
from jpwr import ExitCode, FormatError, ValidationError, WindowEnergy
from jpwr.errors import ArgumentParser
from jpwr.output import utc_now
from jpwr.trace import PhaseBatch, Signal, TraceData, accelerator_domains, load_trace, spans_from_marks, window_energy

UNMARKED = "unmarked"
NO_KERNEL = "idle (no kernel)"
KERNEL_FILE_KIND = "joulebench.kernel_intervals"
DEFAULT_DRAWS = 200
DRIFT_REASON = ("the two halves of the window misfit in opposite directions: the device's power drifted between them "
                "(a window that is not steady, e.g. a GPU still warming up after a low-power start-up or compilation); "
                "lengthen the warm-up (--warmup-iterations) so that the window opens at a steady temperature")
SLOW_COUNTER_S = 0.3  # segments longer than this: the counter was read too rarely to separate phases
FIT_METHOD = ("non-negative least squares of the counter's segment energies on the seconds each {what} ran in "
              "them, corrected for knot timing; 95 % intervals from a bootstrap over 1 s blocks; closure: each "
              "half of the window predicted by a fit on the other half")


@dataclasses.dataclass
class DeviceFit:
    """One accelerator's fit and held-out folds."""

    where: str  # node/device
    fit: LabelFit
    folds: list[Fold]


# ---- input -----------------------------------------------------------------------------------------------
def load_record(run_dir: Path) -> tuple[Path, RunRecord]:
    path = run_dir / RECORD_FILE if run_dir.is_dir() else run_dir
    if not path.is_file():
        raise ValidationError(f"no {RECORD_FILE} at {run_dir}", "pass the --out-dir of a finished driver run")
    try:
        record = read_run_record(path)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValidationError(f"{path} is not a readable run record ({exc})", "pass a driver's run_record.json") \
            from exc
    rejected = rejection(record)  # one rule for every verb: a window with impossible figures is not attributed
    if rejected:
        raise FormatError(f"{path}: {rejected}", "attribute the record its driver wrote (these values cannot have "
                                                 "been measured), or restore the edited ones")
    return path, record


def run_traces(run_dir: Path, record: RunRecord, window: str) -> list[TraceData]:
    """The node traces of this run: the one holding rank 0's begin mark of `window`, and its run's other nodes."""
    own = record.window(window)
    if own is None:
        names = ", ".join(w.name for w in record.windows) or "none"
        raise ValidationError(f"the run record has no window {window!r} (windows: {names})",
                              "pass --window with one of the record's windows")
    try:
        traces = [load_trace(source) for source in find_trace_sources(run_dir)]
    except ValidationError as exc:
        raise ValidationError(f"{exc.problem}; attribution needs the run's jpwr trace",
                              "run the driver under `jpwr --out RUN_DIR/jpwr -- ...` or with --energy-methods "
                              "(its trace lands in RUN_DIR/jpwr)") from exc
    mine = next((t for t in traces if any(m.name == window and m.edge == "begin" and m.t_ns == own.t_start_ns
                                          for m in t.marks)), None)
    if mine is None:
        raise ValidationError(f"no trace under {run_dir} holds this record's {window!r} window",
                              "keep the run's jpwr directory beside its run_record.json")
    return [t for t in traces if t.info.get("run_id") == mine.info.get("run_id") and window in
            spans_from_marks(t.marks)]


def phase_timeline(batches: Sequence[PhaseBatch], selected: Sequence[str] | None) -> Timeline:
    """One rank's phase intervals as a timeline; phases left out by --phases count as unmarked."""
    rows = [(name, a, b) for batch in batches for name, a, b in batch.intervals()
            if selected is None or name in selected]
    present = {name for name, _, _ in rows}
    labels = tuple([p for p in STANDARD_PHASES if p in present] + sorted(present - set(STANDARD_PHASES)))
    index = {name: i for i, name in enumerate(labels)}
    return Timeline(labels, np.array([index[n] for n, _, _ in rows], dtype=int),
                    np.array([a for _, a, _ in rows], dtype=float), np.array([b for _, _, b in rows], dtype=float))


def check_selection(selected: Sequence[str] | None, available: set[str]) -> None:
    unknown = sorted(set(selected or ()) - available)
    if unknown:
        raise ValidationError(f"--phases names {', '.join(unknown)}, not marked in this window",
                              f"choose from {', '.join(sorted(available)) or '(none)'}")


# ---- the fit over phases ---------------------------------------------------------------------------------
def fit_devices(trace: TraceData, window: str, timelines: dict[int, Timeline], rest: str, draws: int,
                rng: np.random.Generator) -> list[DeviceFit]:
    """Pair local rank i with the node's i-th accelerator (CUDA_VISIBLE_DEVICES order) and fit each."""
    node = str(trace.info.get("node", "node"))
    span = spans_from_marks(trace.marks)[window]
    devices = sorted(accelerator_domains(trace.domains), key=lambda d: (d.index is None, d.index or 0, d.id))
    if not devices:
        raise ValidationError(f"node {node}: the sampler metered no accelerator, and the phases are split on an "
                              "accelerator's energy counter (a CPU run's RAPL energy stays whole)",
                              "attribute a run metered on an accelerator; to see the verb on this machine, "
                              "`joulebench demo` replays a recorded H100 trace")
    if len(devices) != len(timelines):
        raise ValidationError(f"node {node}: {len(timelines)} rank(s) marked phases but the sampler metered "
                              f"{len(devices)} accelerator(s), so ranks cannot be paired with devices",
                              "meter exactly the devices the run uses (restrict CUDA_VISIBLE_DEVICES or the Slurm "
                              "GPU binding)")
    fits = []
    for device, local_rank in zip(devices, sorted(timelines), strict=True):
        where = f"{node}/{device.id}"
        segments = window_segments(counter_knots(trace, device), span.t0_ns, span.t1_ns)
        if len(segments) < MIN_SEGMENTS:
            raise _too_few(where, len(segments))
        timeline = timelines[local_rank]
        fits.append(DeviceFit(where, fit_labels(timeline, segments, span.t0_ns, span.t1_ns, draws, rng, rest),
                              held_out_folds(timeline, segments, draws, rng)))
    return fits


class FitUnavailable(Exception):
    """The fit cannot run on this data (said in the block, not an input error)."""


def _too_few(where: str, count: int) -> FitUnavailable:
    return FitUnavailable(f"{where}: {count} counter segments inside the window, the fit needs {MIN_SEGMENTS} "
                          "(no energy counter, or a window shorter than ~20 counter periods)")


def combine(fits: Sequence[DeviceFit], energy: WindowEnergy | None, steps: int, what: str) -> dict[str, Any]:
    """Rows over all devices: energies add; a label below resolution on any device gets no number."""
    labels = list(dict.fromkeys(label for f in fits for label in f.fit.labels))
    total = energy.energy_j if energy is not None else None
    rows = []
    for label in labels:
        parts = [(f, f.fit.labels.index(label)) for f in fits if label in f.fit.labels]
        seconds = [f.fit.window_seconds[k] for f, k in parts]
        reasons = [(f.where, f.fit.reason(k)) for f, k in parts]
        reasons = [(w, r) for w, r in reasons if r]
        row: dict[str, Any] = {"phase": label, "seconds": float(np.mean(seconds)),
                               "device_seconds": float(np.sum(seconds)),
                               "seconds_per_step": float(np.mean(seconds)) / steps if steps else None}
        if reasons:
            text = reasons[0][1] if len(fits) == 1 else "; ".join(f"{w}: {r}" for w, r in reasons)
            rows.append({**row, "status": "below resolution", "reason": text})
            continue
        joules = sum(f.fit.power_w[k] * f.fit.window_seconds[k] for f, k in parts)
        draws = sum(f.fit.draws_w[:, k] * f.fit.window_seconds[k] for f, k in parts)
        watts = sum(f.fit.power_w[k] for f, k in parts)
        draws_w = sum(f.fit.draws_w[:, k] for f, k in parts)
        interval = [float(v) for v in np.percentile(draws, [2.5, 97.5])]
        row.update(status="resolved", reason=None, energy_j=float(joules), energy_j_interval=interval,
                   mean_power_w=float(watts), mean_power_w_interval=[float(v) for v in
                                                                     np.percentile(draws_w, [2.5, 97.5])],
                   mean_power_w_per_device=float(watts) / len(parts),
                   energy_per_step_j=float(joules) / steps if steps else None,
                   energy_per_step_j_interval=[v / steps for v in interval] if steps else None,
                   share=float(joules) / total if total else None,
                   share_interval=[v / total for v in interval] if total else None)
        rows.append(row)
    fitted = sum(f.fit.power_w @ f.fit.window_seconds for f in fits)
    folds = [[f.folds[i] for f in fits if i < len(f.folds)] for i in range(max(len(f.folds) for f in fits))]
    held_out: list[dict[str, Any]] = [
        {"measured_j": sum(x.measured_j for x in fold), "predicted_j": sum(x.predicted_j for x in fold),
         "bound_j": sum(x.bound_j for x in fold)} for fold in folds]
    for fold in held_out:
        fold["residual_j"] = fold["measured_j"] - fold["predicted_j"]
        fold["status"] = "closes" if abs(fold["residual_j"]) <= fold["bound_j"] else "misfit"
    first = fits[0].fit
    closure = {
        "held_out": held_out,
        "status": "closes" if held_out and all(f["status"] == "closes" for f in held_out) else "misfit",
        "in_sample": {"fitted_j": float(fitted), "measured_j": total,
                      "bound_j": energy.error_bound_j if energy is not None else None,
                      "note": "on the segments the fit used: closes almost by construction, not the test"},
    }
    if _halves_differ(held_out):
        closure["reason"] = DRIFT_REASON
    return {
        "method": FIT_METHOD.format(what=what), "devices": [f.where for f in fits], "rows": rows,
        "segments": sum(f.fit.segments for f in fits), "segment_s": first.segment_s, "knot_half_s": first.knot_half_s,
        "bootstrap_draws": int(first.draws_w.shape[0]),
        "closure": closure,
        "notes": _slow_counter_note(first),
    }


def _halves_differ(held_out: list[dict[str, Any]]) -> bool:
    """Both folds misfit with opposite residuals: one half's power differs from the other's, whatever the phases."""
    return (len(held_out) == 2 and all(f["status"] == "misfit" for f in held_out)
            and held_out[0]["residual_j"] * held_out[1]["residual_j"] < 0)


def _slow_counter_note(fit: LabelFit) -> list[str]:
    if fit.segment_s <= SLOW_COUNTER_S:
        return []
    return [f"counter segments are {fit.segment_s:.2f} s long (knots ±{fit.knot_half_s * 1e3:.0f} ms): the counter "
            "was read too rarely to separate phases; meter with `jpwr --interval 20 --counter-interval 20 -- ...`"]


def phase_fit(traces: Sequence[TraceData], record: RunRecord, window: str, selected: Sequence[str] | None,
              draws: int, rng: np.random.Generator) -> dict[str, Any]:
    own = record.window(window)
    assert own is not None  # run_traces checked it
    batches = [b for t in traces for b in t.phases if b.window == window]
    if not batches:
        raise ValidationError(f"the {window!r} window has no phase marks in the trace",
                              "phase marks come from llm_training and resnet50 (--framework pytorch) runs under a "
                              "jpwr sampler; runs recorded before they existed cannot be attributed")
    check_selection(selected, {name for b in batches for name in b.names})
    notes = _lost_parts(batches)
    rest = UNMARKED if selected is None else f"{UNMARKED} and other phases"
    fits: list[DeviceFit] = []
    try:
        for trace in traces:
            ranks = sorted({b.local_rank for b in trace.phases if b.window == window})
            timelines = {r: phase_timeline([b for b in trace.phases if b.window == window and b.local_rank == r],
                                           selected) for r in ranks}
            fits += fit_devices(trace, window, timelines, rest, draws, rng)
    except FitUnavailable as exc:
        return {"method": FIT_METHOD.format(what="phase"), "unavailable_reason": str(exc)}
    block = combine(fits, own.energy, own.steps, "phase")
    present = {row["phase"] for row in block["rows"]}
    block["notes"] = notes + block["notes"] + [
        f"{p} was not marked in this window" + (" (one data-parallel replica: nothing to reduce)"
                                               if p == "grad_reduce" else "")
        for p in STANDARD_PHASES if p not in present and (selected is None or p in selected)
        and p != "pipeline_p2p"]
    block["clock"] = sorted({b.clock for b in batches})
    return block


def _lost_parts(batches: Sequence[PhaseBatch]) -> list[str]:
    """A batch is sent in parts; a part lost on the way leaves a gap the fit counts as unmarked."""
    parts: dict[int, tuple[set[int], int]] = {}
    for b in batches:
        parts.setdefault(b.rank, (set(), b.parts))[0].add(b.part)
    return [f"rank {rank}: {len(seen)} of {expected} parts of its phase marks arrived; the missing time counts as "
            f"{UNMARKED}" for rank, (seen, expected) in sorted(parts.items()) if len(seen) < expected]


# ---- the fit over kernel classes -------------------------------------------------------------------------
def kernel_fit(profile: Path, run_dir: Path, draws: int, rng: np.random.Generator) -> dict[str, Any]:
    """Kernel intervals written by benchmarks/kernel_profile.py --intervals-out, fitted on their own trace."""
    try:
        data = json.loads(profile.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValidationError(f"--profile {profile} is not readable JSON ({exc})",
                              "pass the file benchmarks/kernel_profile.py --intervals-out wrote") from exc
    if data.get("kind") != KERNEL_FILE_KIND:
        raise ValidationError(f"--profile {profile} is not a kernel interval file (kind {data.get('kind')!r})",
                              "pass the file benchmarks/kernel_profile.py --intervals-out wrote")
    window = str(data["window"])
    traces = []
    for folder in dict.fromkeys([profile.parent, run_dir]):
        try:
            traces += [load_trace(s) for s in find_trace_sources(folder)]
        except ValidationError:
            continue
    trace = next((t for t in traces if window in spans_from_marks(t.marks)), None)
    if trace is None:
        raise ValidationError(f"no jpwr trace beside {profile} holds its window {window!r}",
                              "run kernel_profile.py under `jpwr --out DIR -- ...` and keep DIR next to the file")
    names = [str(n) for n in data["names"]]
    classes = [category(n) for n in names]
    labels = tuple(c for c in CATEGORY_NAMES if c in set(classes))
    label_of_name = np.array([labels.index(c) for c in classes], dtype=int)
    timeline = exclusive_timeline(labels, label_of_name[np.asarray(data["name_index"], dtype=int)],
                                  np.asarray(data["t0_ns"], dtype=float), np.asarray(data["t1_ns"], dtype=float))
    local_rank = int(data.get("local_rank", 0))
    span = spans_from_marks(trace.marks)[window]
    energy = window_energy(trace, span, float(trace.info.get("interval_s") or 0.1), str(trace.info.get("node")))
    devices = sorted(accelerator_domains(trace.domains), key=lambda d: (d.index is None, d.index or 0, d.id))
    if local_rank >= len(devices):
        raise ValidationError(f"--profile {profile}: local rank {local_rank} but {len(devices)} metered device(s)",
                              "profile on a node whose sampler meters the profiled GPU")
    device = devices[local_rank]
    own = next((d for d in energy.per_device if d.domain == device.id), None)
    segments = window_segments(counter_knots(trace, device), span.t0_ns, span.t1_ns)
    base = {"source": str(profile), "window": window, "profiled_steps": data.get("steps"),
            "note": "a separate profiled run of the same configuration (the profiler adds its own overhead)"}
    if len(segments) < MIN_SEGMENTS:
        return {**base, "method": FIT_METHOD.format(what="kernel class"),
                "unavailable_reason": str(_too_few(device.id, len(segments)))}
    fit = DeviceFit(f"{trace.info.get('node')}/{device.id}",
                    fit_labels(timeline, segments, span.t0_ns, span.t1_ns, draws, rng, NO_KERNEL),
                    held_out_folds(timeline, segments, draws, rng))
    own_energy = None if own is None else WindowEnergy(energy_j=own.energy_j, mean_power_w=None, devices=1,
                                                       method=own.method, coverage=None,
                                                       error_bound_j=own.error_bound_j)
    return {**base, **combine([fit], own_energy, int(data.get("steps") or 0), "kernel class")}


# ---- the block -------------------------------------------------------------------------------------------
def counter_period_s(traces: Sequence[TraceData]) -> float | None:
    periods = [s.est_update_s for t in traces for s in t.sensors if s.signal is Signal.ENERGY_COUNTER
               and s.est_update_s]
    return max(periods) if periods else None


def attribute(run_dir: Path, window: str = "steady", selected: Sequence[str] | None = None,
              profile: Path | None = None, draws: int = DEFAULT_DRAWS, seed: int = 0,
              idle_power_w: float | None = None) -> tuple[Path, RunRecord, dict[str, Any]]:
    """The attribution block of one run (not yet written); idle power per device: given, else the record's."""
    path, record = load_record(run_dir)
    idle_source = "--idle-power-w"
    low = device_power_problem("--idle-power-w", idle_power_w) if idle_power_w else None  # 0: every joule dynamic
    if low:
        raise ValidationError(low, "give the devices' idle power per device in W (0 = every joule dynamic), or leave "
                                   "it out to use the record's idle baseline")
    if idle_power_w is None:
        idle_power_w, idle_source = recorded_idle_w(record, record.window(window))
    block: dict[str, Any] = {"window": window, "computed_at": utc_now(), "tool": "joulebench attribute",
                             "energy_domain": headline_domain(record), "idle_power_w_per_device": idle_power_w,
                             "idle_source": idle_source, "estimators": {}}
    if record.benchmark == "llm_inference":
        block["estimators"]["windows"] = inference_estimator(record, idle_power_w)
        return path, record, block
    rng = np.random.default_rng(seed)
    traces = run_traces(path.parent, record, window)
    own = record.window(window)
    assert own is not None
    block.update(window_energy_j=own.energy.energy_j if own.energy else None,
                 window_error_bound_j=own.energy.error_bound_j if own.energy else None,
                 window_duration_s=own.duration_s, steps=own.steps)
    fit = phase_fit(traces, record, window, selected, draws, rng)
    devices = own.energy.devices if own.energy and own.energy.devices else len(fit.get("devices", [])) or 1
    replicas = int(record.config.get("data_parallel") or record.config.get("devices") or 1)
    if idle_power_w is not None and "rows" in fit:
        add_dynamic(fit["rows"], idle_power_w, "energy_j", "device_seconds")
    block["estimators"]["fit"] = fit
    block["estimators"]["replay"] = replay_estimator(record, counter_period_s(traces), devices, replicas,
                                                     idle_power_w)
    if profile is not None:
        kernels = kernel_fit(profile, path.parent, draws, rng)
        if idle_power_w is not None and "rows" in kernels:
            add_dynamic(kernels["rows"], idle_power_w, "energy_j", "device_seconds")
        block["estimators"]["fit_kernel_classes"] = kernels
    return path, record, block


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog="joulebench attribute", description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", type=Path, help="a driver's --out-dir (run_record.json and its jpwr trace)")
    parser.add_argument("--window", default="steady", help="window to attribute (default steady)")
    parser.add_argument("--phases", type=lambda text: comma_list(text, "phase", "forward,backward"),
                        help="comma list of phases to fit; the others count as unmarked")
    parser.add_argument("--profile", type=Path, help="kernel intervals from benchmarks/kernel_profile.py "
                                                     "--intervals-out: also fit kernel classes")
    parser.add_argument("--bootstrap", type=Number(int, 20, 10_000), default=DEFAULT_DRAWS,
                        help=f"bootstrap draws (default {DEFAULT_DRAWS})")
    parser.add_argument("--seed", type=SEED, default=0, help="bootstrap seed (default 0)")
    parser.add_argument("--idle-power-w", type=WATTS, help="idle power per device for the idle/dynamic split "
                                                    "(default: the record's idle baseline, when it has one; 0 = "
                                                    "every joule dynamic)")
    parser.add_argument("--no-write", action="store_true", help="print only; leave the run record as it is")
    return state_ranges(parser)


def main(argv: Sequence[str]) -> int:
    args = build_parser().parse_args(argv)
    path, record, block = attribute(args.run_dir, args.window, args.phases, args.profile, args.bootstrap, args.seed,
                                    args.idle_power_w)
    print(render(record, block))
    if not args.no_write:
        record.attribution = block
        write_run_record(path, record)
        print(f"joulebench attribute: wrote the attribution block to {path}")
    return ExitCode.OK
