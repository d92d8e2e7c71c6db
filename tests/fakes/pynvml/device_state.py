"""Settings of the fake GPUs (power limit, locked SM clock), who may change them, and how the replay responds.

State. Each fake GPU (keyed by UUID) has a power limit (default: the trace's `power_limit_mW`) and an optional locked
SM clock range. The state lives in memory, or, with JPWR_FAKE_NVML_STATE=<file> (or configure(state_file=...)), in a
JSON file shared by every process that uses the fake: a job's apply step, its sampler, the run and a later restore
see one device, and a test reads the file to check what was applied and restored. "{node}" in the path becomes
SLURMD_NODENAME (else the hostname), so test nodes sharing one host keep separate devices. Changes are serialised
with flock on <file>.lock and written atomically. Layout:

    {"kind": "fake_pynvml.device_state",
     "devices": {UUID: {"power_limit_mW": int, "locked_clocks_MHz": [min, max] | null,
                        "history": [[monotonic_ns, power_limit_mW, min | null, max | null], ...]}},
     "calls": [{"function": ..., "uuid": ..., "args": [...], "result": "ok" | NVML error name, "t_ns": ...}]}

`history` holds one entry per change, stamped with the configured clock (real CLOCK_MONOTONIC in subprocesses, so
processes agree); before the first entry the device has its defaults. `calls` logs every set/reset call, permitted
or refused, so a test can prove that a path called none.

Permission. As on a real GPU, every set/reset call raises NVML_ERROR_NO_PERMISSION unless the calling process is
privileged: configure(privileged=True) or JPWR_FAKE_NVML_PRIVILEGED=1. The fake ignores the real uid (tests run as
root here).

Clock response (`ClockResponse`, JSON in JPWR_FAKE_NVML_CLOCK_RESPONSE). A trace row recorded at SM clock f_r with
power P_r, in the trace phase p (the marked phase containing it: idle, steady, burst100, burst37), runs under the
device's settings at
    target clock  f = the locked maximum if a clock is locked, else f_r (the fake never boosts above the recording);
    power         P = S + (P_r - S) * (f / f_r) ** g_p      (S = static_w, g_p = the phase's power_exponent);
    power cap     if P exceeds the power limit L: P = L and f = f_r * ((L - S) / (P_r - S)) ** (1 / g_p).
Rows at or below S have no dynamic part and keep P_r. Under the recording's settings (its limit, no lock) every value
is the recording's, bit for bit. The energy counter integrates P over the rows (so it stays continuous across
changes), the power fields and GetPowerUsage report P, GetClockInfo(SM) reports f. Time cannot be stretched from
inside NVML: a caller that wants the time response of a phase asks `Replay.phase_time_factor(phase)`, which is
(1 - c_p) + c_p * mean(f_r) / mean(f) over the phase's rows (c_p = the phase's compute_fraction: the share of its
time that scales with 1/f), and sleeps or scales its own figures by it. Defaults: S = 80 W, g = 2.0, c = 0.9 for
every phase; all are stand-ins, not measurements.
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import fcntl
import json
import os
import socket
import tempfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

STATE_KIND = "fake_pynvml.device_state"


@dataclasses.dataclass(frozen=True)
class Settings:
    """What a device runs under: its power limit and the locked SM clock range (None = unlocked)."""

    power_limit_mw: int
    locked_mhz: tuple[int, int] | None = None


@dataclasses.dataclass(frozen=True)
class PhaseResponse:
    power_exponent: float = 2.0  # dynamic power scales with (f / f_recorded) ** power_exponent
    compute_fraction: float = 0.9  # share of the phase's time that scales with 1 / f


@dataclasses.dataclass(frozen=True)
class ClockResponse:
    static_w: float = 80.0
    phases: Mapping[str, PhaseResponse] = dataclasses.field(default_factory=dict)
    default: PhaseResponse = PhaseResponse()

    @classmethod
    def from_json(cls, text: str) -> ClockResponse:
        data = json.loads(text)
        return cls(static_w=float(data.get("static_w", cls.static_w)),
                   phases={name: PhaseResponse(**p) for name, p in data.get("phases", {}).items()},
                   default=PhaseResponse(**data.get("default", {})))

    def phase(self, name: str) -> PhaseResponse:
        return self.phases.get(name, self.default)

    def operating_point(self, phase: str, recorded_mhz: float, recorded_w: float,
                        settings: Settings) -> tuple[float, float, bool]:
        """(SM clock MHz, power W, capped by the power limit) of one recorded row under `settings`."""
        exponent = self.phase(phase).power_exponent
        target = float(settings.locked_mhz[1]) if settings.locked_mhz else float(recorded_mhz)
        dynamic = recorded_w - self.static_w
        if dynamic <= 0 or exponent == 0 or recorded_mhz <= 0:
            return target, recorded_w, False
        power = self.static_w + dynamic * (target / recorded_mhz) ** exponent
        limit = settings.power_limit_mw / 1000.0
        if power <= limit:
            return target, power, False
        headroom = max(limit - self.static_w, 0.0) / dynamic
        return recorded_mhz * headroom ** (1.0 / exponent), limit, True


class ScaledTrace:
    """The trace's rows under given settings: per-row phase, and cumulative energy per Settings (cached)."""

    def __init__(self, trace: Any, response: ClockResponse) -> None:
        self.trace, self.response = trace, response
        self.recorded = Settings(int(trace.meta["power_limit_mW"]))
        spans = _phase_spans(trace.marks)
        self.row_phase = [_phase_at(spans, r["usage_t_after_ns"] - trace.t_start_ns) for r in trace.rows]
        self._cumulative: dict[Settings, list[float]] = {}

    def row_point(self, index: int, settings: Settings, power_mw: float) -> tuple[float, float, bool]:
        """(SM clock MHz, power W, capped) of row `index` whose recorded power was power_mw, under `settings`."""
        row = self.trace.rows[index]
        if settings == self.recorded:
            return float(row["sm_clock_MHz"]), power_mw / 1000.0, False
        return self.response.operating_point(self.row_phase[index], row["sm_clock_MHz"], power_mw / 1000.0, settings)

    def cumulative_mj(self, settings: Settings) -> list[float]:
        """Counter value at each row under `settings`: each recorded increment scaled by the power ratio over the
        counter period it closes (the counter advances every ~100 ms, the rows are read more often)."""
        if settings not in self._cumulative:
            rows = self.trace.rows
            values = [float(rows[0]["energy_mJ"])]
            last_change_ns = rows[0]["counter_t_after_ns"]
            for i in range(1, len(rows)):
                delta_mj = rows[i]["energy_mJ"] - rows[i - 1]["energy_mJ"]
                period_ns = rows[i]["counter_t_after_ns"] - last_change_ns
                ratio = 1.0
                if delta_mj > 0 and period_ns > 0:
                    recorded_mw = delta_mj / (period_ns / 1e9)
                    ratio = self.row_point(i, settings, recorded_mw)[1] * 1000.0 / recorded_mw
                    last_change_ns = rows[i]["counter_t_after_ns"]
                values.append(values[-1] + delta_mj * ratio)
            self._cumulative[settings] = values
        return self._cumulative[settings]

    def energy_mj(self, rel_ns: int, settings: Settings) -> float:
        """Counter at trace-relative rel_ns if `settings` had applied all along (looping like Trace.energy_mj)."""
        if settings == self.recorded:
            return float(self.trace.energy_mj(rel_ns))
        cumulative = self.cumulative_mj(settings)
        _, loops = self.trace.row(self.trace.counter_t, rel_ns)
        within = max(rel_ns, 0) % self.trace.duration_ns
        index = max(bisect.bisect_right(self.trace.counter_t, self.trace.t_start_ns + within) - 1, 0)
        return cumulative[index] + loops * (cumulative[-1] - cumulative[0])

    def phase_rows(self, phase: str) -> list[int]:
        return [i for i, name in enumerate(self.row_phase) if name == phase]


def _phase_spans(marks: list[tuple[str, str, int]]) -> list[tuple[int, int, str]]:
    spans, open_at = [], {}
    for name, edge, rel in marks:
        if edge == "begin":
            open_at[name] = rel
        elif name in open_at:
            spans.append((open_at.pop(name), rel, name))
    return sorted(spans)


def _phase_at(spans: list[tuple[int, int, str]], rel_ns: int) -> str:
    for start, end, name in spans:
        if start <= rel_ns < end:
            return name
    return "unmarked"


def state_path_from(template: str) -> Path:
    node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    return Path(template.replace("{node}", node))


class StateStore:
    """The devices' settings, their change history and the call log: in memory or in a shared JSON file."""

    def __init__(self, path: Path | None, defaults: Mapping[str, int]) -> None:
        self.path = path
        self._defaults = dict(defaults)  # uuid -> default power limit (mW)
        self._memory: dict[str, Any] = self._fresh()
        self._cache: tuple[tuple[int, int, int], dict[str, Any]] | None = None
        if path is not None:
            with self._locked():
                if not path.exists():
                    self._write(self._fresh())

    def _fresh(self) -> dict[str, Any]:
        return {"kind": STATE_KIND, "devices": {}, "calls": []}

    def snapshot(self) -> dict[str, Any]:
        if self.path is None:
            return self._memory
        stat = self.path.stat()
        key = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
        if self._cache is None or self._cache[0] != key:
            self._cache = (key, json.loads(self.path.read_text()))
        return self._cache[1]

    def settings(self, uuid: str) -> Settings:
        return self.settings_in(self.snapshot(), uuid)

    def history(self, uuid: str) -> list[tuple[int, Settings]]:
        entry = self.snapshot()["devices"].get(uuid)
        if entry is None:
            return []
        return [(t, Settings(limit, None if lo is None else (lo, hi))) for t, limit, lo, hi in entry["history"]]

    def defaults(self, uuid: str) -> Settings:
        return Settings(self._defaults[uuid])

    def log_call(self, function: str, uuid: str, args: list[Any], result: str, t_ns: int) -> None:
        self._update(lambda data: data["calls"].append(
            {"function": function, "uuid": uuid, "args": args, "result": result, "t_ns": t_ns}))

    def change(self, uuid: str, t_ns: int, edit: Callable[[Settings], Settings]) -> None:
        def apply(data: dict[str, Any]) -> None:
            current = self.settings_in(data, uuid)
            new = edit(current)
            locked = None if new.locked_mhz is None else list(new.locked_mhz)
            entry = data["devices"].setdefault(uuid, {"history": []})
            entry.update(power_limit_mW=new.power_limit_mw, locked_clocks_MHz=locked)
            entry["history"].append([t_ns, new.power_limit_mw, *(locked or [None, None])])

        self._update(apply)

    def settings_in(self, data: dict[str, Any], uuid: str) -> Settings:
        entry = data["devices"].get(uuid)
        if entry is None or "power_limit_mW" not in entry:
            return Settings(self._defaults[uuid])
        locked = entry["locked_clocks_MHz"]
        return Settings(entry["power_limit_mW"], None if locked is None else (locked[0], locked[1]))

    def _update(self, edit: Callable[[dict[str, Any]], None]) -> None:
        if self.path is None:
            edit(self._memory)
            return
        with self._locked():
            data = json.loads(self.path.read_text())
            edit(data)
            self._write(data)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        assert self.path is not None
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(f"{self.path}.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _write(self, data: dict[str, Any]) -> None:
        assert self.path is not None
        fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", dir=self.path.parent)
        with os.fdopen(fd, "w") as handle:
            json.dump(data, handle, indent=1)
        os.replace(tmp, self.path)
