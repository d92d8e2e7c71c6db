"""Analysis' run layer: the run records under the paths a verb is given, each read once into a `Run`.

Every verb over run records (report, report --pareto, recommend and its re-measuring, plan) finds records here
(`record_paths`), checks their schema versions (`check_versions`) and reads each (`load_runs`): its system (the JUBE
job's JB_SYSTEM, else the record's), its steady window's latent metrics from the traces stored beside it, and its
figures with the checks of joulebench.figures. A record that cannot be read becomes a rejected run that names why,
so that one bad record never stops a verb over many.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from joulebench.analysis.diagnose import STEADY, UnitCost, unit_cost
from joulebench.analysis.plot import find_trace_sources
from joulebench.figures import rejection
from joulebench.latents import steady_latents
from joulebench.record import (
    MEASURED_STATUSES,
    READABLE_SCHEMA_VERSIONS,
    RECORD_FILE,
    RecordShapeError,
    RunRecord,
    headline_domain,
    parse_record,
    read_record_document,
)
from jpwr import FormatError, ValidationError
from jpwr.energy import ACCELERATORS
from jpwr.output import fmt
from jpwr.trace import TraceData, load_trace

JUBE_SETTINGS = "job.env"
SERIES_CONFIG_KEYS = ("model", "framework", "precision", "task")



@dataclasses.dataclass
class Run:
    """One run record with what the report needs beside it: where it came from, its system, its latents."""

    path: Path
    record: RunRecord
    system: str
    latents: dict[str, float]
    unreadable: str | None = None  # what failed reading the record (read_run): then a rejected row only

    @property
    def label(self) -> str:
        return f"{self.system} [{self.record.run_id}]"

    @property
    def series(self) -> str:
        """Chart series: system, device model and count, and what else changes the work (model, framework,
        precision), so that one line joins only runs that differ in batch size."""
        device = self.record.hardware.get("device_name") or "device n/a"
        head = f"{device} ×{fmt(self.cost.devices)}"
        if device != self.system:
            head = f"{self.system}: {head}"
        extras = [str(self.record.config[k]) for k in SERIES_CONFIG_KEYS if self.record.config.get(k) is not None]
        if self.domain not in (None, ACCELERATORS):  # one line never joins energies of different domains
            extras.append(f"energy: {self.domain}")
        return ", ".join([head, *extras])

    @property
    def domain(self) -> str | None:
        return headline_domain(self.record)

    @property
    def usable(self) -> bool:
        """FAILED and INVALID runs measured nothing; a TIMEOUT or CANCELLED run stopped cleanly and its steady
        window is a measurement of the iterations it completed."""
        return self.record.status in MEASURED_STATUSES

    @property
    def cost(self) -> UnitCost:
        return unit_cost(self.record, self.label)

    @functools.cached_property
    def rejected(self) -> str | None:
        """Why this record's figures cannot be used (joulebench.figures), or None: a rejected run is shown
        flagged, and kept out of every chart, ranking, diagnosis and front."""
        if self.unreadable:
            return f"record unreadable: {self.unreadable}. Fix: regenerate {self.path} with the driver, or leave it out"
        return rejection(self.record)

    def metric(self, key: str) -> float | None:
        """A metrics figure of a usable, not rejected run; None (n/a) otherwise."""
        value = self.record.metrics.get(key) if self.usable and not self.rejected else None
        return float(value) if isinstance(value, int | float) and math.isfinite(value) else None


def record_paths(paths: Sequence[Path]) -> list[Path]:
    """run_record.json files under each directory, and files named directly."""
    found: list[Path] = []
    for path in paths:
        if path.is_dir():
            found += sorted(path.rglob(RECORD_FILE))
        elif path.is_file():
            found.append(path)
        else:
            raise ValidationError(f"{path} does not exist", "pass a JUBE run directory or run_record.json files")
    if not found:
        raise ValidationError(f"no {RECORD_FILE} under {', '.join(map(str, paths)) or '(no path given)'}",
                              "pass a JUBE run directory whose jobs have finished (each writes "
                              f"work/run/{RECORD_FILE}) or the run record files themselves")
    return found


def check_versions(documents: dict[Path, dict[str, Any]]) -> None:
    """Every input of a schema version this reader understands (version 1 records load as they are)."""
    unreadable = {p: d.get("schema_version") for p, d in documents.items()
                  if d.get("schema_version") not in READABLE_SCHEMA_VERSIONS}
    if unreadable:
        path, version = next(iter(unreadable.items()))
        more = f" and {len(unreadable) - 1} more" if len(unreadable) > 1 else ""
        raise ValidationError(f"run record schema_version {version!r} is not supported (e.g. {path}{more})",
                              f"use a joulebench that reads schema_version {version!r}, or records of version "
                              f"{', '.join(map(str, READABLE_SCHEMA_VERSIONS))}")


def jube_system(record_path: Path) -> str | None:
    """JB_SYSTEM from the JUBE job's job.env (work/job.env beside work/run/run_record.json)."""
    for directory in (record_path.parent, record_path.parent.parent):
        settings = directory / JUBE_SETTINGS
        if settings.is_file():
            for line in settings.read_text().splitlines():
                if line.startswith("JB_SYSTEM="):
                    words = shlex.split(line.partition("=")[2])
                    return words[0] if words else None
    return None


def system_of(record: RunRecord, path: Path) -> str:
    launch_nodes = record.launch.get("num_nodes")
    return str(jube_system(path) or record.config.get("system") or record.hardware.get("device_name")
               or f"{record.launch.get('launcher', 'unknown')} ×{launch_nodes or '?'} nodes")


def record_latents(record_path: Path, record: RunRecord) -> dict[str, float]:
    """Latent metrics of the steady window from this run's traces stored beside the record, if any.

    A directory may hold several runs' traces; a trace belongs to the record when it holds rank 0's
    steady-window begin mark, whose monotonic stamp the record keeps (Window.t_start_ns).
    """
    steady = record.window(STEADY)
    if steady is None:
        return {}
    # a trace file kept beside the record (results folders); a load record's per-request table is no trace, nor is
    # a hidden file (an atomic writer's temporary one)
    request_table = (record.requests or {}).get("file") if isinstance(record.requests, dict) else None
    sources = sorted(p for p in record_path.parent.glob("*.h5")
                     if p.name != request_table and not p.name.startswith("."))
    with contextlib.suppress(ValidationError):
        sources += find_trace_sources(record_path.parent)
    by_out_dir: dict[Path, list[TraceData]] = {}  # one group per jpwr --out directory (or lone file)
    for source in sources:
        by_out_dir.setdefault(source if source.is_file() else source.parent, []).append(load_trace(source))
    for traces in by_out_dir.values():
        if any(m.name == STEADY and m.edge == "begin" and m.t_ns == steady.t_start_ns for t in traces for m in t.marks):
            return steady_latents(traces)
    return {}


def _sort_key(run: Run) -> tuple[str, str, float, str]:
    return run.record.benchmark, run.series, run.cost.batch_size or 0.0, run.record.run_id


def read_run(path: Path, data: dict[str, Any]) -> Run:
    """The one reading of a run record for analysis, with its system and latents; a record whose structure is in
    the wrong shape (an object where a list belongs, a null id, a text where a number belongs) or whose files beside
    it cannot be read becomes an unreadable run (a rejected row naming why), so that one bad record never stops a
    report over many."""
    try:
        record = parse_record(data)
        run = Run(path, record, system_of(record, path), record_latents(path, record))
        _sort_key(run)  # series and cost (with the figures' checks): read first by every verb, so failing here
    except RecordShapeError as exc:
        return unreadable_run(path, data, str(exc))
    except (KeyError, ValueError, TypeError, AttributeError, IndexError, OSError, ValidationError) as exc:
        problem = exc.problem if isinstance(exc, ValidationError) else f"{type(exc).__name__}: {exc}"
        return unreadable_run(path, data, problem)
    return run


def unreadable_run(path: Path, data: dict[str, Any], problem: str) -> Run:
    """A rejected run standing for a record that cannot be read: identified by whatever of benchmark, run id and
    status is text, else by its directory; no figures, no system, no latents."""
    def text(key: str, missing: str) -> str:
        value = data.get(key)
        return value if isinstance(value, str) and value else missing

    record = RunRecord(benchmark=text("benchmark", "n/a"), run_id=text("run_id", path.parent.name), status="INVALID")
    record.status = text("status", "n/a")  # shown as the file says, or n/a; never a status of a run that was read
    return Run(path, record, "n/a", {}, unreadable=problem)


def load_runs(paths: Sequence[Path]) -> list[Run]:
    """Every run record under the paths, read once; an unreadable one (not JSON, truncated, no run record, the wrong
    shape) is a rejected run (read_run), unless none can be read: then there is nothing to report, and the first is
    refused."""
    documents: dict[Path, dict[str, Any]] = {}
    failed: dict[Path, FormatError] = {}
    found = record_paths(paths)
    for path in found:
        try:
            documents[path] = read_record_document(path)
        except FormatError as exc:
            failed[path] = exc
    check_versions(documents)
    runs = [read_run(path, documents[path]) if path in documents else unreadable_run(path, {}, failed[path].problem)
            for path in found]
    if all(run.unreadable for run in runs):
        if runs[0].path in failed:
            raise failed[runs[0].path]
        raise ValidationError(f"{runs[0].path} is not a valid run record ({runs[0].unreadable})",
                              "regenerate it with the driver, or leave it out")
    return sorted(runs, key=_sort_key)
