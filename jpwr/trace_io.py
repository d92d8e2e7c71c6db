"""Trace storage: append-only JSONL segments while running, one HDF5 file at the end.

Segments are flushed every second and on SIGTERM/SIGINT; a sampler killed hard (SIGKILL)
leaves every segment readable except possibly a torn last line, which the reader skips.
The same reader serves the HDF5 file and bare segments, so a killed run is still analysable.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from jpwr.channel import Mark
from jpwr.domains import Domain, MetricReading, Reading, Sensor, Status
from jpwr.errors import FormatError
from jpwr.output import atomic_path
from jpwr.phases import PhaseBatch

SEGMENT_DIR = "segments"
TRACE_FILE = "trace.h5"
ROWS_PER_SEGMENT = 50_000
STATUS_CODES = {s: i for i, s in enumerate(Status)}


class SegmentWriter:
    """Writes readings, metrics and marks as JSON lines; rotates files so none grows unbounded.

    A write that fails (a full disk) must not stop the sampling thread: the first error is kept
    in `error`, later rows are not written, and the sampler still holds every reading in memory.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory / SEGMENT_DIR
        self.directory.mkdir(parents=True, exist_ok=True)
        self._index = len(list(self.directory.glob("seg-*.jsonl")))
        self._rows = 0
        self._handle: TextIO | None = None
        self.error: OSError | None = None

    def _file(self) -> TextIO:
        if self._handle is None or self._rows >= ROWS_PER_SEGMENT:
            if self._handle is not None:
                self._handle.close()
            self._index += 1
            self._rows = 0
            self._handle = open(self.directory / f"seg-{self._index:05d}.jsonl", "a", buffering=1 << 16)  # noqa: SIM115
        return self._handle

    def write(self, record: dict[str, Any]) -> None:
        if self.error is not None:
            return
        try:
            self._file().write(json.dumps(record, separators=(",", ":")) + "\n")
        except OSError as exc:
            self.error = exc
            return
        self._rows += 1

    def header(self, domains: Iterable[Domain], sensors: Iterable[Sensor], info: dict[str, Any]) -> None:
        self.write({"k": "header", "domains": [d.to_dict() for d in domains],
                    "sensors": [s.to_dict() for s in sensors], "info": info})

    def reading(self, r: Reading) -> None:
        record = {"k": "r", "s": r.sensor_id, "a": r.t_before_ns, "b": r.t_after_ns, "v": r.value,
                  "st": r.status.value, "hw": r.hw_timestamp_ns}
        if r.error is not None:
            record["e"] = r.error
        self.write(record)

    def metric(self, m: MetricReading) -> None:
        self.write({"k": "m", "d": m.domain_id, "n": m.name, "t": m.t_ns, "v": m.value})

    def mark(self, m: Mark) -> None:
        self.write({"k": "mark", **m.to_dict()})

    def phases(self, batch: PhaseBatch) -> None:
        self.write({"k": "phases", **batch.to_dict()})

    def flush(self, sync: bool = False) -> None:
        if self._handle is None or self.error is not None:
            return
        try:
            self._handle.flush()
            if sync:
                os.fsync(self._handle.fileno())
        except OSError as exc:
            self.error = exc

    def close(self) -> None:
        if self._handle is not None:
            self.flush(sync=True)
            with contextlib.suppress(OSError):  # a full disk: the error is already in self.error
                self._handle.close()
            self._handle = None


@dataclasses.dataclass
class SensorSeries:
    """All readings of one sensor as arrays (monotonic ns; value NaN where not OK), in the order they arrived."""

    sensor: Sensor
    t_before_ns: np.ndarray
    t_after_ns: np.ndarray
    value: np.ndarray
    error: np.ndarray | None = None  # the vendor's error name per failed reading (object array), None if unknown
    reordered: int = 0  # readings that had arrived after a later-stamped one (set by `ordered`)
    duplicates: int = 0  # exact repeats dropped by `ordered`

    @property
    def t_ns(self) -> np.ndarray:
        return (self.t_before_ns + self.t_after_ns) // 2

    @property
    def valid(self) -> np.ndarray:
        return ~np.isnan(self.value)

    def ordered(self) -> SensorSeries:
        """The readings in time order, exact repeats dropped, with how many were out of order or repeated.

        A sampler whose threads interleave, or segments concatenated in the wrong order, can store readings
        out of time order; integrating them in arrival order turns a counter's normal increments into
        backward jumps. Ties in time are broken by value (a counter read twice at one stamp only rises).
        """
        n = len(self.value)
        if n == 0:
            return self
        order = np.lexsort((self.value, self.t_after_ns, self.t_before_ns))
        tb, ta, v = self.t_before_ns[order], self.t_after_ns[order], self.value[order]
        err = self.error[order] if self.error is not None else None
        same = (tb[1:] == tb[:-1]) & (ta[1:] == ta[:-1]) & ((v[1:] == v[:-1]) | (np.isnan(v[1:]) & np.isnan(v[:-1])))
        keep = np.concatenate(([True], ~same))
        reordered = int(np.sum(self.t_before_ns[1:] < np.maximum.accumulate(self.t_before_ns)[:-1]))
        return SensorSeries(self.sensor, tb[keep], ta[keep], v[keep], None if err is None else err[keep],
                            self.reordered + reordered, self.duplicates + int(np.sum(~keep)))

    def failures_between(self, a_ns: float, b_ns: float) -> tuple[list[str], float | None]:
        """The failed readings stamped in [a, b]: their distinct reasons (the vendor's error name, else the
        status) and when the first of them started (ns), or ([], None)."""
        inside = ~self.valid & (self.t_after_ns >= a_ns) & (self.t_before_ns <= b_ns)
        if not inside.any():
            return [], None
        first = float(self.t_before_ns[inside].min())
        if self.error is None:
            return ["read failed"], first
        return sorted({str(e) if e is not None else "read failed" for e in self.error[inside]}), first


@dataclasses.dataclass
class TraceData:
    """A node's whole trace, from HDF5 or from segments."""

    domains: list[Domain]
    sensors: list[Sensor]
    info: dict[str, Any]
    readings: dict[str, list[Reading]]
    metrics: list[MetricReading]
    marks: list[Mark]
    phases: list[PhaseBatch] = dataclasses.field(default_factory=list)  # per rank and window (jpwr.phases)

    def series(self, sensor_id: str) -> SensorSeries:
        sensor = next(s for s in self.sensors if s.id == sensor_id)
        rows = self.readings.get(sensor_id, [])
        return SensorSeries(
            sensor,
            np.array([r.t_before_ns for r in rows], dtype=np.int64),
            np.array([r.t_after_ns for r in rows], dtype=np.int64),
            np.array([r.value if r.status is Status.OK and r.value is not None else np.nan for r in rows],
                     dtype=np.float64),
            np.array([r.error or (None if r.status is Status.OK else r.status.value) for r in rows], dtype=object),
        )


def _domain_from_dict(d: dict[str, Any]) -> Domain:
    from jpwr.domains import Kind

    return Domain(
        id=d["id"], backend=d["backend"], kind=Kind(d["kind"]), name=d["name"], device_uuid=d.get("device_uuid"),
        pci_bus_id=d.get("pci_bus_id"), index=d.get("index"), contains=tuple(d.get("contains", ())),
        shared_with=tuple(d.get("shared_with", ())), attrs=tuple(sorted(dict(d.get("attrs", {})).items())),
    )


def _sensor_from_dict(d: dict[str, Any]) -> Sensor:
    from jpwr.domains import Signal

    fields = {f.name for f in dataclasses.fields(Sensor)}
    data = {k: v for k, v in d.items() if k in fields}
    data["signal"] = Signal(data["signal"])
    return Sensor(**data)


def _integer(value: Any, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{field} is {value!r}, not an integer")
    return value


def _number(value: Any, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{field} is {value!r}, not a number")
    return float(value)


def _segment_reading(rec: dict[str, Any]) -> Reading:
    """One reading line ("k": "r"), its stamps integers and its value a number or null."""
    value = rec["v"]
    return Reading(rec["s"], _integer(rec["a"], "a"), _integer(rec["b"], "b"),
                   None if value is None else _number(value, "v"), Status(rec["st"]), rec.get("hw"), rec.get("e"))


def read_segments(directory: Path) -> TraceData:
    """Load a node directory's segments, skipping a torn last line left by a hard kill."""
    domains: dict[str, Domain] = {}
    sensors: dict[str, Sensor] = {}
    info: dict[str, Any] = {}
    readings: dict[str, list[Reading]] = {}
    metrics: list[MetricReading] = []
    marks: list[Mark] = []
    phases: list[PhaseBatch] = []
    for path in sorted((directory / SEGMENT_DIR).glob("seg-*.jsonl")):
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            try:
                kind = rec.get("k")
                if kind == "r":
                    readings.setdefault(rec["s"], []).append(_segment_reading(rec))
                elif kind == "m":
                    metrics.append(MetricReading(rec["d"], rec["n"], _integer(rec["t"], "t"), _number(rec["v"], "v")))
                elif kind == "mark":
                    marks.append(Mark.from_dict(rec))
                elif kind == "phases":
                    phases.append(PhaseBatch.from_dict(rec))
                elif kind == "header":
                    domains.update({d["id"]: _domain_from_dict(d) for d in rec["domains"]})
                    sensors.update({s["id"]: _sensor_from_dict(s) for s in rec["sensors"]})
                    info.update(rec["info"])
            except (KeyError, TypeError, ValueError, AttributeError) as exc:
                what = f"missing field {exc}" if isinstance(exc, KeyError) else f"{type(exc).__name__}: {exc}"
                raise FormatError(f"{path} line {number} is not a jpwr segment record ({what})",
                                  "use the segments a sampler wrote (remove or repair the edited line), or the node's "
                                  "trace.h5") from None
    return TraceData(list(domains.values()), list(sensors.values()), info, readings, metrics, marks, phases)


def write_hdf5(path: Path, data: TraceData) -> Path:
    """Assemble the trace into one HDF5 file (written to a temporary name, then renamed).

    Columns are gzip-compressed and metric names are fixed-width bytes (not variable-length strings,
    whose per-row heap entries cost more than the data): traces are kept and committed as results.
    """
    import h5py

    sensor_ids = [s.id for s in data.sensors]
    with atomic_path(path) as tmp, h5py.File(tmp, "w") as h5:
        h5.attrs["schema"] = "jpwr.trace/1"
        h5.attrs["info"] = json.dumps(data.info)
        h5.attrs["domains"] = json.dumps([d.to_dict() for d in data.domains])
        h5.attrs["sensors"] = json.dumps([s.to_dict() for s in data.sensors])
        rows = [(i, r) for i, sid in enumerate(sensor_ids) for r in data.readings.get(sid, [])]
        g = h5.create_group("readings")
        _column(g, "sensor", np.array([i for i, _ in rows], dtype=np.int32))
        _column(g, "t_before_ns", np.array([r.t_before_ns for _, r in rows], dtype=np.int64))
        _column(g, "t_after_ns", np.array([r.t_after_ns for _, r in rows], dtype=np.int64))
        _column(g, "value", np.array([np.nan if r.value is None else r.value for _, r in rows], dtype=np.float64))
        _column(g, "status", np.array([STATUS_CODES[r.status] for _, r in rows], dtype=np.int8))
        _column(g, "hw_timestamp_ns", np.array([-1 if r.hw_timestamp_ns is None else r.hw_timestamp_ns
                                                for _, r in rows], dtype=np.int64))
        failed = [(k, r.error) for k, (_, r) in enumerate(rows) if r.error]  # few rows: stored sparsely
        _column(g, "error_row", np.array([k for k, _ in failed], dtype=np.int64))
        _column(g, "error_name", np.array([e.encode() for _, e in failed], dtype=np.bytes_))
        m = h5.create_group("metrics")
        m.attrs["columns"] = json.dumps(["domain", "name"])
        _column(m, "domain", np.array([x.domain_id.encode() for x in data.metrics], dtype=np.bytes_))
        _column(m, "name", np.array([x.name.encode() for x in data.metrics], dtype=np.bytes_))
        _column(m, "t_ns", np.array([x.t_ns for x in data.metrics], dtype=np.int64))
        _column(m, "value", np.array([x.value for x in data.metrics], dtype=np.float64))
        h5.attrs["marks"] = json.dumps([x.to_dict() for x in data.marks])
        _write_phases(h5, data.phases)
    return path


def _column(group: Any, name: str, values: np.ndarray) -> None:
    compress = {"compression": "gzip", "shuffle": True} if len(values) else {}
    group.create_dataset(name, data=values, **compress)


def read_hdf5(path: Path) -> TraceData:
    """Load a trace file; one that is truncated or not a jpwr trace is a FormatError naming the file."""
    if not Path(path).is_file():
        raise FileNotFoundError(errno.ENOENT, "no such trace file", str(path))
    try:
        return _read_hdf5(path)
    except (OSError, KeyError, ValueError, IndexError, TypeError, AttributeError) as exc:
        raise FormatError(f"{path} is not a readable jpwr trace ({type(exc).__name__}: {exc})",
                          "use the trace.h5 a sampler wrote; a node directory's segments/ can be read instead "
                          "(pass the node directory)") from None


def _read_hdf5(path: Path) -> TraceData:
    import h5py

    statuses = list(Status)
    with h5py.File(path, "r") as h5:
        domains = [_domain_from_dict(d) for d in json.loads(h5.attrs["domains"])]
        sensors = [_sensor_from_dict(s) for s in json.loads(h5.attrs["sensors"])]
        info = json.loads(h5.attrs["info"])
        if not isinstance(info, dict):
            raise TypeError(f"its info is a {type(info).__name__}, not an object")
        g = h5["readings"]
        errors: dict[int, str] = {}  # traces written before error names were kept have none
        if "error_row" in g:
            errors = {int(k): e.decode() for k, e in zip(g["error_row"][:], g["error_name"][:], strict=True)}
        readings: dict[str, list[Reading]] = {}
        for row, (idx, a, b, v, st, hw) in enumerate(zip(g["sensor"][:], g["t_before_ns"][:], g["t_after_ns"][:],
                                                         g["value"][:], g["status"][:], g["hw_timestamp_ns"][:],
                                                         strict=True)):
            sid = sensors[int(idx)].id
            readings.setdefault(sid, []).append(Reading(
                sid, int(a), int(b), None if np.isnan(v) else float(v), statuses[int(st)],
                None if hw < 0 else int(hw), errors.get(row)))
        m = h5["metrics"]
        metrics = [MetricReading(d.decode() if isinstance(d, bytes) else str(d),
                                 n.decode() if isinstance(n, bytes) else str(n), int(t), float(v))
                   for d, n, t, v in zip(m["domain"][:], m["name"][:], m["t_ns"][:], m["value"][:], strict=True)]
        marks = [Mark.from_dict(x) for x in json.loads(h5.attrs["marks"])]
        phases = _read_phases(h5)
    return TraceData(domains, sensors, info, readings, metrics, marks, phases)


def _write_phases(h5: Any, batches: list[PhaseBatch]) -> None:
    """One row per interval; each batch's identity (window, rank, clock, part) in a small JSON table."""
    g = h5.create_group("phases")
    g.attrs["batches"] = json.dumps([{k: v for k, v in b.to_dict().items() if k not in ("phase", "t0", "t1",
                                                                                           "base_ns")}
                                     for b in batches])
    _column(g, "batch", np.array([i for i, b in enumerate(batches) for _ in range(len(b))], dtype=np.int32))
    _column(g, "phase", np.array([k for b in batches for k in b.phase], dtype=np.int16))
    _column(g, "t0_ns", np.array([t for b in batches for t in b.t0_ns], dtype=np.int64))
    _column(g, "t1_ns", np.array([t for b in batches for t in b.t1_ns], dtype=np.int64))


def _read_phases(h5: Any) -> list[PhaseBatch]:
    if "phases" not in h5:  # traces written before phase marks existed
        return []
    g = h5["phases"]
    index, phase, t0, t1 = (g[name][:] for name in ("batch", "phase", "t0_ns", "t1_ns"))
    batches = []
    for i, meta in enumerate(json.loads(g.attrs["batches"])):
        rows = index == i
        batches.append(PhaseBatch.from_dict({**meta, "phase": phase[rows].tolist(), "t0": t0[rows].tolist(),
                                             "t1": t1[rows].tolist(), "base_ns": 0}))
    return batches


def load_trace(source: Path) -> TraceData:
    """A node's trace from a node directory (its assembled HDF5 when present, else its segments) or from a
    trace file itself: the one loader for every form a sampler leaves."""
    if source.is_file():
        return read_hdf5(source)
    h5 = source / TRACE_FILE
    return read_hdf5(h5) if h5.exists() else read_segments(source)
