"""A recorded NVML trace played back as if it were a GPU of this machine: `--methods replay:TRACE_DIR`.

For the demo (`joulebench demo`) and a first look without an accelerator: the pipeline sees one GPU whose
energy counter and power are those a real H100 reported (tests/data/h100_trace: trace.csv.gz + meta.json,
written by benchmarks/record_nvml_trace.py). Never chosen by `--methods auto`.

What plays follows the run: a trace whose meta.json marks an `idle` and a `steady` segment plays its idle segment
until a window other than `idle` begins, then its steady segment (warm-up, steady, the phase replays: the GPU
busy), and the idle segment again while an `idle` window is open; so the idle baseline draws idle power and the
work windows a loaded GPU's. A segment loops past its end; at every switch the counter goes on from where it was
(it only climbs). A trace without those marks plays whole, looping, from the backend's discovery.

Every domain name and the window's energy domain say "replayed trace, not this machine", so each output
made from it (record, table, plot, report, attribution) carries the label and no ranking mixes it with
measured runs.
"""

from __future__ import annotations

import bisect
import csv
import dataclasses
import gzip
import json
from collections.abc import Sequence
from pathlib import Path

from jpwr.backends._base import unavailable
from jpwr.clock import Clock
from jpwr.domains import Discovery, Domain, Kind, MetricReading, Reading, Sensor, Signal

NAME = "replay"
REPLAYED = "replayed trace, not this machine"


IDLE, STEADY = "idle", "steady"  # the recording's segments (meta.json marks) and the run's windows they stand for
NOT_FOLLOWED = ("command",)  # jpwr's whole-command window: open all along, it says nothing of the load


class _Series:
    """One recorded column, keyed by each read's 'after' stamp (trace-relative ns)."""

    def __init__(self, times_ns: list[int], values: list[float] | list[int]) -> None:
        self.times, self.values = times_ns, values

    def at(self, rel_ns: int) -> float:
        index = max(bisect.bisect_right(self.times, rel_ns) - 1, 0)
        return self.values[index]


@dataclasses.dataclass(frozen=True)
class _Cursor:
    """Where the playback is: segment [start_ns, end_ns) of the recording, entered at `since_ns` (this machine's
    clock) with the counter then at `counter_base_mj` (whole millijoules, as recorded: the counter is summed in
    integers, so it never steps back by a rounding error where a loop or a switch joins two pieces of the recording)."""

    start_ns: int
    end_ns: int
    since_ns: int
    counter_base_mj: int

    def position(self, now_ns: int) -> tuple[int, int]:
        """(loops completed, trace-relative position) at `now_ns`."""
        loops, within = divmod(max(now_ns - self.since_ns, 0), self.end_ns - self.start_ns)
        return loops, self.start_ns + within


class ReplayBackend:
    name = NAME

    def __init__(self, clock: Clock, trace_dir: Path) -> None:
        self._clock = clock
        self._dir = Path(trace_dir)
        self._series: dict[str, _Series] = {}  # sensor id or metric name -> its column
        self._counter_id = ""
        self._domain_id = ""
        self._segments: dict[str, tuple[int, int]] = {}  # idle/steady -> [start, end) trace-relative ns
        self._cursor = _Cursor(0, 1, 0, 0)

    def discover(self) -> Discovery:
        disc = Discovery(NAME)
        try:
            meta = json.loads((self._dir / "meta.json").read_text())
            with gzip.open(self._dir / "trace.csv.gz", "rt", newline="") as fh:
                rows = [{key: int(value) for key, value in row.items()} for row in csv.DictReader(fh)]
            start = int(meta["t_start_ns"])
        except (OSError, ValueError, KeyError, json.JSONDecodeError) as exc:
            disc.unavailable.append(unavailable(NAME, f"no recorded trace in {self._dir} ({exc})"))
            return disc
        if not rows:
            disc.unavailable.append(unavailable(NAME, f"{self._dir / 'trace.csv.gz'} has no rows"))
            return disc
        length = max(rows[-1]["counter_t_after_ns"], rows[-1]["fields_t_after_ns"]) - start

        def column(stamp: str, value: str, scale: float) -> _Series:
            return _Series([r[stamp] - start for r in rows], [r[value] * scale for r in rows])

        self._domain_id = f"{NAME}:{meta.get('uuid', 'gpu')}"
        counter = Sensor(f"{self._domain_id}/energy_counter", self._domain_id, Signal.ENERGY_COUNTER,
                         est_update_s=0.1, resolution=1e-3)
        power = Sensor(f"{self._domain_id}/power_instant", self._domain_id, Signal.POWER_INSTANT, resolution=1e-3)
        self._counter_id = counter.id
        self._series = {counter.id: _Series([r["counter_t_after_ns"] - start for r in rows],
                                            [r["energy_mJ"] for r in rows]),
                        power.id: column("fields_t_after_ns", "power_instant_mW", 1e-3),
                        "sm_clock_hz": column("usage_t_after_ns", "sm_clock_MHz", 1e6),
                        "utilization_gpu": column("usage_t_after_ns", "util_gpu_pct", 0.01)}
        limit = meta.get("power_limit_mW")
        disc.domains.append(Domain(
            self._domain_id, NAME, Kind.GPU, f"{meta.get('name', 'GPU')} ({REPLAYED})", index=0,
            attrs=(("power_limit_w", str(limit / 1000)),) if limit else ()))
        disc.sensors += [counter, power]
        disc.info["replay"] = str(self._dir)
        self._segments = _segments(meta.get("marks") or [], start)
        first = self._segments.get(IDLE, (0, length))
        self._cursor = _Cursor(*first, self._clock.monotonic_ns(), int(self._series[counter.id].at(first[0])))
        return disc

    def follow_window(self, name: str, edge: str) -> None:
        """A window began: play the recording's segment for it (idle for `idle`, steady for the run's work)."""
        if edge != "begin" or name in NOT_FOLLOWED or not self._segments:
            return
        segment = self._segments[IDLE if name == IDLE else STEADY]
        if segment != (self._cursor.start_ns, self._cursor.end_ns):
            now = self._clock.monotonic_ns()
            self._cursor = _Cursor(*segment, now, self._counter_mj(now))

    def _counter_mj(self, now_ns: int) -> int:
        """The energy counter (mJ): the cursor's base plus what the segment's counter climbed since it was entered."""
        cursor, series = self._cursor, self._series[self._counter_id]
        loops, position = cursor.position(now_ns)
        per_loop = int(series.at(cursor.end_ns) - series.at(cursor.start_ns))
        return cursor.counter_base_mj + loops * per_loop + int(series.at(position) - series.at(cursor.start_ns))

    def _value(self, name: str, now_ns: int) -> float:
        if name == self._counter_id:
            return self._counter_mj(now_ns) * 1e-3
        return self._series[name].at(self._cursor.position(now_ns)[1])

    def read(self, sensors: Sequence[Sensor]) -> list[Reading]:
        readings = []
        for sensor in sensors:
            t0 = self._clock.monotonic_ns()
            readings.append(Reading(sensor.id, t0, self._clock.monotonic_ns(), self._value(sensor.id, t0)))
        return readings

    def read_metrics(self) -> list[MetricReading]:
        now = self._clock.monotonic_ns()
        return [MetricReading(self._domain_id, name, now, self._value(name, now))
                for name in ("sm_clock_hz", "utilization_gpu")]

    def close(self) -> None:
        self._series = {}


def _segments(marks: Sequence[Sequence[object]], start_ns: int) -> dict[str, tuple[int, int]]:
    """The first idle and steady segment of the recording (trace-relative ns), from meta.json's [name, edge, t_ns]
    marks; empty unless both are there (then the trace plays whole)."""
    begins: dict[str, int] = {}
    found: dict[str, tuple[int, int]] = {}
    for name, edge, t_ns in marks:
        if name in (IDLE, STEADY) and name not in found:
            if edge == "begin":
                begins[str(name)] = int(str(t_ns)) - start_ns
            elif edge == "end" and name in begins:
                found[str(name)] = (begins[str(name)], int(str(t_ns)) - start_ns)
    return found if set(found) == {IDLE, STEADY} else {}
