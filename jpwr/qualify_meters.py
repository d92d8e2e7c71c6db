"""The meters `jpwr qualify` compares, each giving the energy of a window on the same devices.

Meter specs:
    nvml, amdsmi, auto, ...     jpwr's own estimate (counter-anchored, jpwr.estimator) over the job's accelerators
    nvml-power-poll[:100ms]     nvmlDeviceGetPowerUsage polled at that interval and summed as right rectangles
                                (P_i · (t_i - t_(i-1)) over the samples inside the window), as jpwr 0.0.10 and
                                CARAML do; on Ampere and newer that call is a 1 s trailing average
    csv:PATH                    a site's PDU or BMC export: a time column (Unix seconds, or ISO 8601; naive times
                                are local time) and a power column (W; kW or mW when the name says so);
                                integrated as trapezoids, clipped to the window
A CSV meter runs on someone else's clock; `jpwr.qualify` checks its offset before trusting a window.
"""

from __future__ import annotations

import contextlib
import csv
import datetime as dt
import re
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import numpy as np

from jpwr.channel import Mark
from jpwr.clock import SYSTEM_CLOCK
from jpwr.errors import MethodUnavailableError, ValidationError
from jpwr.summary import NodeSummary

POLL_PREFIX = "nvml-power-poll"
SPEC_FORMS = "a jpwr method (nvml, amdsmi, auto, ...), nvml-power-poll[:100ms] or csv:PATH"
TIME_NAMES = ("time", "timestamp", "time_s", "timestamp_s", "t", "datetime", "date", "unix_time", "epoch")


class Meter(Protocol):
    spec: str
    live: bool  # measures during the run (else it is read afterwards, e.g. a CSV export)

    def start(self) -> None: ...

    def mark(self, name: str, edge: str, t_mono_ns: int) -> None: ...

    def stop(self) -> None: ...

    def energy(self, name: str, t0_wall_s: float, t1_wall_s: float, t0_mono_ns: int | None,
               t1_mono_ns: int | None) -> tuple[float | None, str | None]:
        """(joules, None) or (None, why not)."""
        ...


class JpwrMeter:
    """jpwr's sampler in this process: the window's counter-anchored energy over the job's accelerators."""

    live = True

    def __init__(self, spec: str, out_dir: Path) -> None:
        from jpwr.backends import parse_methods
        from jpwr.sampler import Sampler, open_backends

        self.spec = spec
        backends, discoveries = open_backends(parse_methods(spec), SYSTEM_CLOCK)
        self.sampler = Sampler(backends, discoveries, out_dir / "jpwr", run_id="qualify")
        self._summary: NodeSummary | None = None

    def start(self) -> None:
        self.sampler.start()

    def mark(self, name: str, edge: str, t_mono_ns: int) -> None:
        self.sampler.add_mark(Mark(name, edge, 0, t_mono_ns))

    def stop(self) -> None:
        self._summary = self.sampler.stop()

    def energy(self, name: str, t0_wall_s: float, t1_wall_s: float, t0_mono_ns: int | None,
               t1_mono_ns: int | None) -> tuple[float | None, str | None]:
        window = self._summary.windows.get(name) if self._summary else None
        if window is None:
            return None, f"{self.spec}: window {name} was not metered"
        return window.energy.energy_j, window.energy.unavailable_reason


class PollMeter:
    """nvmlDeviceGetPowerUsage summed over the job's NVIDIA GPUs every `interval_s`, on absolute deadlines."""

    live = True

    def __init__(self, spec: str, interval_s: float) -> None:
        from jpwr.backends import create_backend
        from jpwr.selectors import job_devices

        self.spec, self.interval_s = spec, interval_s
        backend = create_backend("nvml", SYSTEM_CLOCK, selectors=job_devices("nvidia").selector_list)
        found = backend.discover()
        uuids = [d.device_uuid for d in found.domains if d.kind.value == "gpu" and d.device_uuid]
        backend.close()
        if not uuids:
            raise MethodUnavailableError(f"meter {spec!r}: no NVIDIA GPU ({'; '.join(found.unavailable)}). "
                                         "Fix: run it where NVML sees the job's GPUs")
        import pynvml

        self._nv = pynvml
        pynvml.nvmlInit()
        self._handles = [pynvml.nvmlDeviceGetHandleByUUID(u) for u in uuids]
        self.samples: list[tuple[int, float]] = []  # (monotonic ns, W summed over the GPUs)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="jpwr-qualify-poll", daemon=True)

    def _loop(self) -> None:
        deadline = time.monotonic_ns()
        period = int(self.interval_s * 1e9)
        while not self._stop.is_set():
            t0 = time.monotonic_ns()
            watts = sum(self._nv.nvmlDeviceGetPowerUsage(h) for h in self._handles) / 1000.0
            self.samples.append(((t0 + time.monotonic_ns()) // 2, watts))
            deadline += period
            self._stop.wait(max(0.0, (deadline - time.monotonic_ns()) / 1e9))

    def start(self) -> None:
        self._thread.start()

    def mark(self, name: str, edge: str, t_mono_ns: int) -> None:
        """Windows are cut from the samples afterwards."""

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        with contextlib.suppress(self._nv.NVMLError):
            self._nv.nvmlShutdown()

    def energy(self, name: str, t0_wall_s: float, t1_wall_s: float, t0_mono_ns: int | None,
               t1_mono_ns: int | None) -> tuple[float | None, str | None]:
        t = np.array([s[0] for s in self.samples], dtype=float)
        p = np.array([s[1] for s in self.samples])
        inside = (t >= (t0_mono_ns or 0)) & (t <= (t1_mono_ns or 0))
        if inside.sum() < 2:
            return None, f"{self.spec}: fewer than two samples inside window {name}"
        t, p = t[inside], p[inside]
        return float(np.sum(p[1:] * np.diff(t)) / 1e9), None  # right rectangles, nothing outside the samples


class CsvMeter:
    """A power export read after the run; `offset_s` is added to our wall clock to reach the CSV's."""

    live = False

    def __init__(self, spec: str, path: Path, offset_s: float = 0.0, role: str = "a") -> None:
        self.spec, self.path, self.offset_s, self.role = spec, path, offset_s, role
        self.t: np.ndarray = np.array([])
        self.p: np.ndarray = np.array([])
        self.detected_offset_s: float | None = None  # set by jpwr.qualify's clock check
        self.offset_strength: float | None = None

    def start(self) -> None:
        """Nothing to start: the site's meter records on its own."""

    def mark(self, name: str, edge: str, t_mono_ns: int) -> None:
        """Windows are cut from the export afterwards."""

    def stop(self) -> None:
        """Nothing to stop; the export is read by `load` once it exists."""

    def load(self) -> None:
        self.t, self.p = read_power_csv(self.path)

    def energy(self, name: str, t0_wall_s: float, t1_wall_s: float, t0_mono_ns: int | None,
               t1_mono_ns: int | None) -> tuple[float | None, str | None]:
        a, b = t0_wall_s + self.offset_s, t1_wall_s + self.offset_s
        if len(self.t) < 2 or a < self.t[0] or b > self.t[-1]:
            span = f"{_iso(self.t[0])} to {_iso(self.t[-1])}" if len(self.t) else "nothing"
            return None, (f"{self.spec} covers {span}, not window {name} ({_iso(a)} to {_iso(b)} on its clock): "
                          "a clock or time-zone offset, or an export of another period")
        return trapezoid(self.t, self.p, a, b), None


def trapezoid(t: np.ndarray, p: np.ndarray, a: float, b: float) -> float:
    """Integral of the piecewise-linear curve through (t, p) over [a, b] (inside the samples' span)."""
    inner = (t > a) & (t < b)
    knots_t = np.concatenate([[a], t[inner], [b]])
    knots_p = np.interp(knots_t, t, p)
    return float(np.sum((knots_p[1:] + knots_p[:-1]) / 2 * np.diff(knots_t)))


def _iso(wall_s: float) -> str:
    return dt.datetime.fromtimestamp(wall_s, dt.UTC).isoformat(timespec="milliseconds")


def _seconds(text: str) -> float:
    """A CSV time value as Unix seconds: numbers (s, ms, µs or ns by magnitude) or ISO 8601."""
    try:
        value = float(text)
    except ValueError:
        return dt.datetime.fromisoformat(text.strip().replace("Z", "+00:00")).timestamp()
    for above, per_second in ((1e17, 1e9), (1e14, 1e6), (1e11, 1e3)):  # ns, µs, ms since the epoch
        if value > above:
            return value / per_second
    return value


def _power_column(names: Sequence[str]) -> tuple[str, float] | None:
    for name in names:
        key = name.strip().lower()
        if "power" in key or key in ("w", "watts", "watt", "p", "kw", "mw"):
            if re.search(r"\bkw\b|_kw\b|\(kw\)|kilowatt", key) or key == "kw":
                return name, 1000.0
            if re.search(r"\bmw\b|_mw\b|\(mw\)|milliwatt", key) or key == "mw":
                return name, 0.001
            return name, 1.0
    return None


def read_power_csv(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """(Unix seconds sorted, W) from a CSV with a time and a power column."""
    if not path.is_file():
        raise ValidationError(f"csv meter file {path} does not exist",
                              "export the site meter's readings for the qualification period to that path")
    with open(path, newline="") as fh:
        rows = list(csv.DictReader(fh))
    names = list(rows[0]) if rows else []
    time_col = next((n for n in names if n.strip().lower() in TIME_NAMES), None) or next(
        (n for n in names if "time" in n.lower()), None)
    power = _power_column(names)
    if time_col is None or power is None:
        raise ValidationError(f"{path}: cannot tell the time and power columns apart in header {names}",
                              "name them e.g. `time` (Unix seconds or ISO 8601) and `power_w` (or power_kw)")
    try:
        t = np.array([_seconds(r[time_col]) for r in rows])
        p = np.array([float(r[power[0]]) * power[1] for r in rows])
    except (ValueError, TypeError) as exc:
        fix = f"column {time_col!r} must hold Unix seconds or ISO 8601 times, {power[0]!r} numbers"
        raise ValidationError(f"{path}: unreadable value ({exc})", fix) from None
    order = np.argsort(t, kind="stable")
    return t[order], p[order]


def parse_meter(spec: str, out_dir: Path, offset_s: float = 0.0, role: str = "a") -> Meter:
    """A meter from its spec (see the module docstring); bad specs are a ValidationError."""
    if spec.startswith("csv:"):
        if not spec[4:]:
            raise ValidationError(f"meter {spec!r} names no file", "write csv:PATH, e.g. csv:pdu_export.csv")
        return CsvMeter(spec, Path(spec[4:]), offset_s, role)
    if spec == POLL_PREFIX or spec.startswith(POLL_PREFIX + ":"):
        interval = spec.partition(":")[2] or "100ms"
        match = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s)", interval)
        if not match or float(match.group(1)) <= 0:
            raise ValidationError(f"meter {spec!r}: interval {interval!r}", "write e.g. nvml-power-poll:100ms or :0.5s")
        return PollMeter(spec, float(match.group(1)) / (1000.0 if match.group(2) == "ms" else 1.0))
    if ":" in spec:
        raise ValidationError(f"unknown meter {spec!r}", f"use {SPEC_FORMS}")
    return JpwrMeter(spec, out_dir)
