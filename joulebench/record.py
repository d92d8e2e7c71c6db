"""The run record: one JSON file per run, the same schema for every driver (joulebench core).

Throughput and energy come from the same named windows (warm-up, steady state), so a
tokens/Wh figure divides work and energy measured over identical intervals. SI units
throughout; Wh is added beside J because result tables quote it. Missing values are
null in JSON and "n/a" in text, never 0. See docs/run-record.md.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import os
import platform
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeGuard, TypeVar

from joulebench.record_shape import Block, RecordShapeError, checked_block, checked_metrics, record_shape_problems
from joulebench.record_types import (
    HEADLINE_ENERGY_FIGURES,
    TRUSTED_ENERGY_FIGURES,
    DeviceFigures,
    DisturbedBlock,
    FootprintBlock,
    HardwareBlock,
    JobBlock,
    LaunchBlock,
    MeterBlock,
    Metrics,
    RequestsBlock,
    SteadyFigures,
    metrics_type,
)
from jpwr import ExitCode, FormatError, Window, WindowEnergy
from jpwr.energy import ACCELERATORS, J_PER_WH
from jpwr.output import fmt, utc_now, write_json_atomic

SCHEMA_VERSION = 4
RECORD_FILE = "run_record.json"  # the record's name in a run's output directory
RECORD_KIND = "joulebench.run_record"  # the file's `kind`: what tells a run record from other JSON
# Version 1 records (three statuses, no `job`) and version 2 (no `warnings`, no reserved blocks) load unchanged;
# version 3 (an inference engine's detail in "slot" words) loads with that detail's keys renamed (ENGINE_DETAIL_KEYS).
READABLE_SCHEMA_VERSIONS = (1, 2, 3, 4)
# Schema 4's names for the keys of `config.engine_detail` that earlier versions wrote: a row is one request's place
# in a decode step, a cache position one token's place in a row's KV cache, the bucket the attended positions round to.
ENGINE_DETAIL_KEYS = {"slot_bucket": "position_bucket", "request_slots": "rows", "cache_slots": "cache_positions"}
# OK: ran to its end. PARTIAL: ran to its end, energy coverage below the threshold (headline energy n/a).
# TIMEOUT: stopped at the stop budget or Slurm's limit. CANCELLED: scancel-ed, preempted, or never startable.
# FAILED: an error ended it. INVALID: refused before submission (no job ran). See docs/run-record.md.
STATUSES = ("OK", "PARTIAL", "TIMEOUT", "CANCELLED", "FAILED", "INVALID")
# Statuses whose steady window, where one exists, measured completed iterations (a clean early stop included).
MEASURED_STATUSES = ("OK", "PARTIAL", "TIMEOUT", "CANCELLED")
# The one exit-code table: a driver's process and a JUBE job script both exit with the code of their final status.
# 0 is Slurm's COMPLETED; 124 (coreutils `timeout`) and 143 (128 + SIGTERM) match what Slurm itself records for a
# time limit and a cancellation; INVALID (64, sysexits' EX_USAGE) never starts a run. A FAILED run exits 1, or with
# the code of the joulebench error that ended it (64 for a configuration refused on the device, 73 for an output
# directory that cannot be written, ...), so that a wrapper can tell a bad configuration from a crash.
EXIT_CODES = {"OK": 0, "PARTIAL": 0, "FAILED": 1, "TIMEOUT": 124, "CANCELLED": 143, "INVALID": 64}
# Beside the table: a run whose record could not be written to its output directory (a full or read-only disk) exits
# 74 (sysexits' EX_IOERR) whatever its status, so that no wrapper takes a run without its record for a finished one;
# its summary line still names the status, and the record went to another file system or to stderr
# (joulebench.lifecycle). 73 (EX_CANTCREAT) is an output directory found unwritable before the run began.
RECORD_NOT_WRITTEN = int(ExitCode.IO)

# Distributions whose versions change results; recorded in every run record.
TRACKED_DISTRIBUTIONS = (
    "joulebench", "torch", "torchvision", "megatron-core", "tensorflow", "tensorflow-cpu",
    "keras", "numpy", "nvidia-ml-py", "amdsmi", "h5py",
)


def per_device_figures(energy: WindowEnergy | None) -> list[DeviceFigures]:
    """Each headline device's energy, mean power and utilisation over the window, in the meter's order (node, then
    the vendor's index); none without a window energy. An untrusted device's figures are None, as in the meter."""
    return [DeviceFigures(node=d.node, index=d.index, uuid=d.uuid, name=d.name, energy_j=d.energy_j,
                          mean_power_w=d.mean_power_w, utilization_gpu=d.utilization_gpu)
            for d in (energy.per_device if energy else ())]


def steady_metrics(
    window: Window,
    work_unit: str,
    devices: int | None,
    flops_per_unit: float | None = None,
    peak_flops_per_device: float | None = None,
) -> SteadyFigures:
    """The steady window's headline figures (record_types.SteadyFigures, their one declaration), which each driver
    extends with its own keys into its record's metrics (its type of record_types.Metrics): one computation for
    every driver, so that rates, MFU and work per Wh are computed the same way everywhere. FLOPs are model FLOPs (no
    recompute counted); four figures are named after the work unit (tokens_per_s, images_per_wh, ...). `devices`:
    the devices that did the work (joulebench.figures.work_devices); None: per-device figures n/a."""
    work = window.work.get(work_unit)
    duration = window.duration_s
    rate = work / duration if work is not None and duration > 0 else None
    per_device = rate / devices if rate is not None and devices else None
    flops_dev = per_device * flops_per_unit if per_device is not None and flops_per_unit else None
    energy, split = window.energy, window.split
    energy_wh = energy.energy_wh if energy else None
    # An untrusted window's figures from the time its devices did cover: never headline figures (those are None),
    # shown only when asked for (`joulebench report --allow-partial`) and labelled partial there.
    untrusted = energy.untrusted_reason if energy else None
    partial_w = energy.partial_mean_power_w if energy and untrusted else None
    partial_wh = partial_w * duration / J_PER_WH if partial_w is not None and duration > 0 else None
    figures: dict[str, object] = {
        "window": window.name, "work_unit": work_unit, "iterations": window.steps, "duration_s": duration,
        "time_per_iteration_s": duration / window.steps if window.steps > 0 else None,
        f"{work_unit}_per_s": rate, f"{work_unit}_per_s_per_device": per_device,
        "model_flops_per_unit": flops_per_unit,
        "model_tflops_per_device": None if flops_dev is None else flops_dev / 1e12,
        "peak_tflops_per_device": None if peak_flops_per_device is None else peak_flops_per_device / 1e12,
        "mfu": flops_dev / peak_flops_per_device if flops_dev and peak_flops_per_device else None,
        "energy_wh": energy_wh, f"{work_unit}_per_wh": work / energy_wh if work is not None and energy_wh else None,
        "mean_power_w_per_device": energy.mean_power_w_per_device if energy else None,
        "energy_method": energy.method if energy else None,
        "energy_coverage": energy.coverage if energy else None,
        "energy_error_bound_j": energy.error_bound_j if energy else None,
        "energy_unavailable_reason": energy.unavailable_reason if energy else "no energy measured",
        "energy_devices": energy.devices if energy else None,
        "energy_warning": _device_mismatch(energy, devices),
        "idle_power_w": split.idle_power_w if split else None,
        "dynamic_energy_wh": split.dynamic_j / J_PER_WH if split and split.dynamic_j is not None else None,
        "dynamic_energy_error_bound_j": split.dynamic_bound_j if split else None,
        "energy_untrusted_reason": untrusted,
        "partial_mean_power_w_per_device": partial_w / devices if partial_w is not None and devices else None,
        f"partial_{work_unit}_per_wh": work / partial_wh if work is not None and partial_wh else None,
        "per_device": per_device_figures(energy),
        "outside_job_devices": len(energy.outside_job) if energy and energy.outside_job else None,
        "outside_job_energy_j": energy.outside_job_energy_j if energy else None,
    }
    # keys built from the unit: SteadyFigures declares them for the drivers' units (record_types.WORK_UNITS)
    return checked_block(SteadyFigures, figures, "metrics")


Figures = TypeVar("Figures", bound=Mapping[str, object])


def driver_metrics(record: RunRecord, kind: type[Figures]) -> Figures | None:
    """The record's metrics as `kind`, its driver's type (record_types.TrainingMetrics, LoadMetrics, ...), where
    its driver writes that type, else None: how a reader of a driver's own keys narrows the union first, by the
    record's benchmark (record_types.metrics_type, the type the block was checked as when it was read)."""
    metrics = record.metrics
    return metrics if _written_as(metrics, kind, record.benchmark) else None


def _written_as(metrics: Metrics, kind: type[Figures], benchmark: str) -> TypeGuard[Figures]:
    return metrics_type(benchmark, metrics) is kind


def settle_status(record: RunRecord) -> None:
    """A run that ended as planned but whose headline window's energy is untrusted (coverage below the
    threshold, faults) is PARTIAL, with the meter's reason (device, time, read error)."""
    reason = record.metrics.get("energy_untrusted_reason")
    if record.status == "OK" and reason:
        record.status = "PARTIAL"
        record.status_reason = f"energy of the {record.metrics.get('window', 'steady')} window untrusted: {reason}"


def _device_mismatch(energy: WindowEnergy | None, devices: int | None) -> str | None:
    """Say so when the sampler metered other devices than the run used (e.g. an idle GPU beside it)."""
    if energy is None or energy.energy_j is None or devices is None or energy.devices == devices:
        return None
    if energy.domain and not energy.domain.startswith(ACCELERATORS):  # RAPL counts CPU packages, not the run's
        return None
    return (f"energy covers {energy.devices} metered devices but the run used {devices}: restrict the job's "
            "devices (CUDA_VISIBLE_DEVICES, Slurm GPU binding) so that idle devices are not counted")


def no_figures() -> Metrics:
    """A record's metrics before its driver's figures are in: empty, as any driver's type."""
    return {}


@dataclasses.dataclass
class RunRecord:
    """Everything one run produced; written once at the end (and on failure) by global rank 0."""

    benchmark: str  # "llm_training", "resnet50", ...
    run_id: str
    status: str = "OK"
    status_reason: str | None = None
    started_at: str = dataclasses.field(default_factory=lambda: utc_now())
    finished_at: str | None = None
    config: dict[str, Any] = dataclasses.field(default_factory=dict)
    launch: LaunchBlock = dataclasses.field(default_factory=lambda: LaunchBlock())
    hardware: HardwareBlock = dataclasses.field(default_factory=lambda: HardwareBlock())
    software: dict[str, Any] = dataclasses.field(default_factory=dict)
    windows: list[Window] = dataclasses.field(default_factory=list)
    metrics: Metrics = dataclasses.field(default_factory=lambda: no_figures())
    meter: MeterBlock = dataclasses.field(default_factory=lambda: MeterBlock())  # sampler, methods, idle baseline
    job: JobBlock = dataclasses.field(default_factory=lambda: JobBlock())  # scheduler job: id, time limit, stop budget
    attribution: dict[str, Any] | None = None  # added by `joulebench attribute` (docs/attribution.md)
    # Every warning of the run (driver, meter, record checks), in the order they arose; the JUBE table's Note reads it.
    warnings: list[str] = dataclasses.field(default_factory=list)
    # Schema 3's optional blocks (and 4's), reserved here and filled by the drivers and analysis that produce them
    # (docs/run-record.md): the per-request table's reference, what disturbed the run, carbon and cost, and the
    # energy domain of the headline figures. Absent (None) until a producer writes them.
    requests: RequestsBlock | None = None
    disturbed: DisturbedBlock | None = None
    footprint: FootprintBlock | None = None
    energy_domain: str | None = None

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status {self.status!r} is not one of {STATUSES}")

    def window(self, name: str) -> Window | None:
        return next((w for w in self.windows if w.name == name), None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION, "kind": RECORD_KIND,
            "benchmark": self.benchmark, "run_id": self.run_id, "status": self.status,
            "status_reason": self.status_reason, "started_at": self.started_at,
            "finished_at": self.finished_at, "config": self.config, "launch": self.launch,
            "hardware": self.hardware, "software": self.software,
            "windows": [w.to_dict() for w in self.windows], "metrics": self.metrics, "meter": self.meter,
            "job": self.job, "warnings": list(self.warnings),
            **{key: value for key, value in self._optional_blocks().items() if value is not None},
        }

    def _optional_blocks(self) -> dict[str, Any]:
        return {"attribution": self.attribution, "requests": self.requests, "disturbed": self.disturbed,
                "footprint": self.footprint, "energy_domain": self.energy_domain}

    def warn(self, text: str) -> None:
        """Add a warning once (the same text from two sources is one warning)."""
        if text and text not in self.warnings:
            self.warnings.append(text)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RunRecord:
        version = data.get("schema_version")
        if version not in READABLE_SCHEMA_VERSIONS:
            raise ValueError(f"run record schema_version {version!r} is not supported (this reader reads "
                             f"{', '.join(map(str, READABLE_SCHEMA_VERSIONS))})")
        return cls(
            benchmark=data["benchmark"], run_id=data["run_id"], status=data["status"],
            status_reason=data.get("status_reason"), started_at=data["started_at"],
            finished_at=data.get("finished_at"), config=_config_of(data.get("config", {}), version),
            launch=checked_block(LaunchBlock, dict(data.get("launch", {})), "launch"),
            hardware=checked_block(HardwareBlock, dict(data.get("hardware", {})), "hardware"),
            software=dict(data.get("software", {})),
            windows=[Window.from_dict(w) for w in data.get("windows", [])],
            # the blocks as written: keys outside their TypedDicts (a newer writer's) are kept, not checked
            metrics=checked_metrics(data["benchmark"], dict(data.get("metrics", {}))),
            meter=checked_block(MeterBlock, dict(data.get("meter", {})), "meter"),
            job=checked_block(JobBlock, dict(data.get("job") or {}), "job"), attribution=data.get("attribution"),
            warnings=[str(w) for w in data.get("warnings") or []], requests=data.get("requests"),
            disturbed=_optional(DisturbedBlock, data.get("disturbed"), "disturbed"),
            footprint=_optional(FootprintBlock, data.get("footprint"), "footprint"),
            energy_domain=_typed(data.get("energy_domain"), str, "energy_domain", "a string"),
        )


def _config_of(config: Mapping[str, Any], version: int) -> dict[str, Any]:
    """The config block in schema 4's words: an earlier record's engine detail with its keys renamed in place (their
    order and values kept)."""
    detail = config.get("engine_detail")
    if version >= 4 or not isinstance(detail, dict):
        return dict(config)
    return {**config, "engine_detail": {ENGINE_DETAIL_KEYS.get(key, key): value for key, value in detail.items()}}


def _typed(value: Any, kind: type | tuple[type, ...], field: str, what: str) -> Any:
    """`value` where it is None or of `kind`; else a TypeError naming the field (read_run_record: a FormatError)."""
    if value is not None and not isinstance(value, kind):
        raise TypeError(f"{field} is {value!r}, not {what}")
    return value


def _optional(kind: type[Block], block: object, field: str) -> Block | None:
    """An optional block as its type (checked_block), None where the record has none."""
    return None if block is None else checked_block(kind, block, field)


def software_versions(extra: Iterable[str] = ()) -> dict[str, str | None]:
    """Versions actually installed (not the pins): Python, tracked distributions, CUDA where torch is loaded."""
    versions: dict[str, str | None] = {"python": platform.python_version(), "platform": platform.platform()}
    for dist in (*TRACKED_DISTRIBUTIONS, *extra):
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    versions.setdefault("joulebench", _source_version())
    torch = sys.modules.get("torch")
    if torch is not None:
        versions["torch_cuda"] = getattr(torch.version, "cuda", None)
        versions["torch_hip"] = getattr(torch.version, "hip", None)
    return versions


def _source_version() -> str:
    """Version of a checkout used without installing (PYTHONPATH on offline GPU machines), with its commit."""
    from jpwr import __version__

    repo = Path(__file__).resolve().parent.parent
    try:
        commit = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    return f"{__version__}+g{commit}" if commit else __version__


def headline_domain(record: RunRecord) -> str | None:
    """The energy domain of the record's headline figures: the recorded one, else its headline window's (records
    written before the field existed: their meter summed accelerators only, so "accelerators" is exact, not a
    guess); None where the headline has no energy."""
    if record.energy_domain:
        return record.energy_domain
    window = record.window(str(record.metrics.get("window") or "steady"))
    energy = window.energy if window else None
    if energy is None or (energy.energy_j is None and energy.partial_energy_j is None):
        return None
    return energy.domain or ACCELERATORS


def collect_warnings(record: RunRecord) -> None:
    """Bring the warnings that arose in other parts of the record (the metrics' device mismatch, each window's
    energy) into `record.warnings`, so that one list carries all of them to tables and reports."""
    record.warn(str(record.metrics.get("energy_warning") or ""))
    for window in record.windows:
        for text in window.energy.warnings if window.energy else ():
            record.warn(f"{window.name} window: {text}")


def settle_record(record: RunRecord) -> None:
    """The PARTIAL rule, the warnings list and the energy domain, once the figures are in: what the record is
    written with, also what --log-to gives the tools before it is written (repeating it changes nothing)."""
    settle_status(record)
    collect_warnings(record)
    record.energy_domain = headline_domain(record)


def write_run_record(path: str | os.PathLike[str], record: RunRecord) -> Path:
    """Every record is written through here, so the PARTIAL rule and the warnings list apply to all alike."""
    settle_record(record)
    if record.finished_at is None:
        record.finished_at = utc_now()
    return write_json_atomic(path, record.to_dict())


RECORD_FIX = "point at a run_record.json written by a joulebench driver (regenerate it), or leave the damaged one out"


def read_record_document(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A run record file as its JSON document (every key, also those RunRecord does not model); a file that cannot
    be read, is not JSON or is no run record is a FormatError naming the file and the fix."""
    try:
        data = json.loads(Path(path).read_text())
    except OSError as exc:
        raise FormatError(f"{path} cannot be read ({exc.strerror or exc})", RECORD_FIX) from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise FormatError(f"{path} is not readable JSON ({exc})", RECORD_FIX) from None
    if not isinstance(data, dict) or data.get("kind") != RECORD_KIND:
        kind = data.get("kind") if isinstance(data, dict) else f"a JSON {type(data).__name__}"
        raise FormatError(f"{path} is not a run record (kind {kind!r}, expected {RECORD_KIND!r})",
                          f"{RECORD_FIX}; for a jpwr trace use `joulebench plot`")
    return data


def parse_record(data: Mapping[str, Any]) -> RunRecord:
    """The one typed reading of a run record document: its shape checked (joulebench.record_shape), then the
    record; a RecordShapeError naming every field in the wrong shape otherwise. Its figures are judged apart
    (joulebench.figures), so that a record with impossible figures still reads as what it is."""
    found = record_shape_problems(data)
    if found:
        more = f" and {len(found) - 3} more" if len(found) > 3 else ""
        raise RecordShapeError(f"{'; '.join(found[:3])}{more}")
    try:
        record = RunRecord.from_dict(data)
    except (KeyError, ValueError, TypeError, AttributeError) as exc:  # a value the types do not rule out (status)
        raise RecordShapeError(f"missing field {exc}" if isinstance(exc, KeyError) else str(exc)) from None
    energy_as_its_window(record)
    return record


def energy_as_its_window(record: RunRecord) -> None:
    """The headline's energy figures n/a where its window has no energy (a null or missing energy block) or no
    trusted total (energy_j null), whatever the metrics say: a figure is never shown beside the window it was
    computed from saying n/a. The reason goes to energy_unavailable_reason, which every table's note shows."""
    window = record.window(str(record.metrics.get("window") or "steady"))
    if window is None or (window.energy is not None and window.energy.energy_j is not None):
        return
    energy = window.energy
    keys = HEADLINE_ENERGY_FIGURES if energy is None else TRUSTED_ENERGY_FIGURES
    metrics = record.metrics
    if not any(metrics.get(key) is not None for key in keys) and (energy is not None or not metrics.get("per_device")):
        return
    figures: dict[str, object] = {**metrics, **{key: None for key in keys if key in metrics}}
    if energy is None:
        figures["per_device"] = []
        if isinstance(record.requests, dict) and record.requests.get("energy"):
            record.requests["energy"] = {"unavailable_reason": f"the {window.name} window has no energy"}
    reason = (f"the {window.name} window's energy is missing from the record" if energy is None
              else f"the {window.name} window's energy is n/a ({energy.unavailable_reason or 'energy_j is null'})")
    figures["energy_unavailable_reason"] = metrics.get("energy_unavailable_reason") or reason
    record.metrics = checked_metrics(record.benchmark, figures)  # the keys set: the steady figures, every driver's


def record_from_document(path: str | os.PathLike[str], data: Mapping[str, Any]) -> RunRecord:
    """parse_record, its problem a FormatError naming the file."""
    try:
        return parse_record(data)
    except RecordShapeError as exc:
        raise FormatError(f"{path} is not a valid run record ({exc})", RECORD_FIX) from None


def read_run_record(path: str | os.PathLike[str]) -> RunRecord:
    """Load a run record (read_record_document, then parse_record): a file that is not one (unreadable, truncated,
    foreign, a field in the wrong shape) is a FormatError naming the file and what is wrong, never a traceback."""
    return record_from_document(path, read_record_document(path))


def summary_line(record: RunRecord, extra_keys: Sequence[str] = ()) -> str:
    """The one machine-readable line each driver prints at the end: `JOULEBENCH_RESULT key=value ...`.

    `extra_keys`: driver-specific metrics appended after the shared fields (e.g. energy per output token).
    """
    m = record.metrics
    unit = m.get("work_unit", "work")
    fields: list[tuple[str, Any]] = [
        ("benchmark", record.benchmark), ("status", record.status), ("run_id", record.run_id),
        ("iterations", m.get("iterations")), ("time_per_iteration_s", m.get("time_per_iteration_s")),
        (f"{unit}_per_s", m.get(f"{unit}_per_s")), (f"{unit}_per_s_per_device", m.get(f"{unit}_per_s_per_device")),
        ("model_tflops_per_device", m.get("model_tflops_per_device")), ("mfu", m.get("mfu")),
        ("energy_wh", m.get("energy_wh")), (f"{unit}_per_wh", m.get(f"{unit}_per_wh")),
        ("mean_power_w_per_device", m.get("mean_power_w_per_device")), ("energy_method", m.get("energy_method")),
        ("energy_coverage", m.get("energy_coverage")), ("energy_error_bound_j", m.get("energy_error_bound_j")),
        *((key, m.get(key)) for key in extra_keys),
    ]
    domain = headline_domain(record)
    if domain and domain != ACCELERATORS:  # the headline is not the accelerators': never read as if it were
        fields.append(("energy_domain", domain.replace(" ", "_")))
    parts = []
    for key, value in fields:
        text = value if isinstance(value, str) else fmt(value, 6)
        parts.append(f"{key}={text if text else 'n/a'}")
    return "JOULEBENCH_RESULT " + " ".join(parts)
