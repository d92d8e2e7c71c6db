"""A recorded NVML trace played back as if it were a GPU of this machine: `--methods replay:TRACE_DIR`.

For the demo (`joulebench demo`) and a first look without an accelerator: the pipeline sees one GPU whose
energy counter and power are those a real H100 reported (tests/data/h100_trace: trace.csv.gz + meta.json,
written by benchmarks/record_nvml_trace.py). Time is trace-relative from the backend's discovery; past the
recording's end it loops, the counter continuing upward. Never chosen by `--methods auto`.

Every domain name and the window's energy domain say "replayed trace, not this machine", so each output
made from it (record, table, plot, report, attribution) carries the label and no ranking mixes it with
measured runs.
"""

from __future__ import annotations

import bisect
import csv
import gzip
import json
from collections.abc import Sequence
from pathlib import Path

from jpwr.backends._base import unavailable
from jpwr.clock import Clock
from jpwr.domains import Discovery, Domain, Kind, MetricReading, Reading, Sensor, Signal

NAME = "replay"
REPLAYED = "replayed trace, not this machine"


class _Series:
    """One recorded column, keyed by each read's 'after' stamp (trace-relative ns), looping past its end."""

    def __init__(self, times_ns: list[int], values: list[float], length_ns: int, climbs: bool) -> None:
        self.times, self.values, self.length = times_ns, values, length_ns
        self.per_loop = values[-1] - values[0] if climbs else 0.0  # a counter keeps counting across loops

    def at(self, rel_ns: int) -> float:
        loops, within = divmod(max(rel_ns, 0), self.length)
        index = max(bisect.bisect_right(self.times, within) - 1, 0)
        return self.values[index] + loops * self.per_loop


class ReplayBackend:
    name = NAME

    def __init__(self, clock: Clock, trace_dir: Path) -> None:
        self._clock = clock
        self._dir = Path(trace_dir)
        self._origin_ns = 0
        self._series: dict[str, _Series] = {}  # sensor id or metric name -> its column
        self._domain_id = ""

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

        def column(stamp: str, value: str, scale: float, climbs: bool = False) -> _Series:
            return _Series([r[stamp] - start for r in rows], [r[value] * scale for r in rows], length, climbs)

        self._domain_id = f"{NAME}:{meta.get('uuid', 'gpu')}"
        counter = Sensor(f"{self._domain_id}/energy_counter", self._domain_id, Signal.ENERGY_COUNTER,
                         est_update_s=0.1, resolution=1e-3)
        power = Sensor(f"{self._domain_id}/power_instant", self._domain_id, Signal.POWER_INSTANT, resolution=1e-3)
        self._series = {counter.id: column("counter_t_after_ns", "energy_mJ", 1e-3, climbs=True),
                        power.id: column("fields_t_after_ns", "power_instant_mW", 1e-3),
                        "sm_clock_hz": column("usage_t_after_ns", "sm_clock_MHz", 1e6),
                        "utilization_gpu": column("usage_t_after_ns", "util_gpu_pct", 0.01)}
        limit = meta.get("power_limit_mW")
        disc.domains.append(Domain(
            self._domain_id, NAME, Kind.GPU, f"{meta.get('name', 'GPU')} ({REPLAYED})", index=0,
            attrs=(("power_limit_w", str(limit / 1000)),) if limit else ()))
        disc.sensors += [counter, power]
        disc.info["replay"] = str(self._dir)
        self._origin_ns = self._clock.monotonic_ns()
        return disc

    def _rel_ns(self) -> int:
        return self._clock.monotonic_ns() - self._origin_ns

    def read(self, sensors: Sequence[Sensor]) -> list[Reading]:
        readings = []
        for sensor in sensors:
            t0 = self._clock.monotonic_ns()
            value = self._series[sensor.id].at(t0 - self._origin_ns)
            readings.append(Reading(sensor.id, t0, self._clock.monotonic_ns(), value))
        return readings

    def read_metrics(self) -> list[MetricReading]:
        rel, now = self._rel_ns(), self._clock.monotonic_ns()
        return [MetricReading(self._domain_id, name, now, self._series[name].at(rel))
                for name in ("sm_clock_hz", "utilization_gpu")]

    def close(self) -> None:
        self._series = {}
