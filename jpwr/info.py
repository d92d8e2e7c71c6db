"""`jpwr info`: what this machine can measure, how much a read costs, how often values change, and the bound an
aliased window gets on each accelerator (its card's measured row in jpwr's aliasing table, or the conservative one)."""

from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Sequence

from jpwr.aliasing import card_bound
from jpwr.clock import SYSTEM_CLOCK
from jpwr.domains import Backend, Sensor
from jpwr.sampler import open_backends


def update_period(backend: Backend, sensor: Sensor, seconds: float) -> tuple[float | None, float | None]:
    """(median seconds between value changes, mean read cost) from polling one sensor for `seconds`; each None
    when it was not seen (no change, or no read at all: `seconds` 0 lists the sensors without reading them)."""
    changes: list[int] = []
    costs: list[float] = []
    last = None
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t0 = time.perf_counter()
        reading = backend.read([sensor])[0]
        costs.append(time.perf_counter() - t0)
        if reading.value is not None and reading.value != last:
            if last is not None:
                changes.append(reading.t_ns)
            last = reading.value
        time.sleep(0.002)
    gaps = [(b - a) / 1e9 for a, b in itertools.pairwise(changes)]
    return (statistics.median(gaps) if gaps else None), (statistics.fmean(costs) if costs else None)


def probe_line(sensor: Sensor, period: float | None, cost: float | None) -> str:
    """One sensor's line: its read cost and update period, n/a where they were not measured."""
    avg = f"  averaged over {sensor.avg_window_s:g} s" if sensor.avg_window_s else ""
    read = f"{'n/a':>12}" if cost is None else f"{cost * 1e6:9.1f} us"
    if cost is None:
        seen = "n/a (not probed: --probe-seconds 0)"
    else:
        seen = "n/a (no change seen)" if period is None else f"{period * 1e3:.1f} ms"
    return f"    {sensor.signal.value:<15} read cost {read}  update period {seen}{avg}"


def describe(methods: Sequence[str] | None, probe_seconds: float) -> str:
    backends, discoveries = open_backends(methods, SYSTEM_CLOCK, strict=False)
    lines = []
    for disc in discoveries:
        if not disc.available:
            lines += disc.unavailable or [f"{disc.backend}: unavailable"]  # each line already names its backend
    if not backends:
        lines.append("jpwr: no sensors found on this machine; energy will be reported as n/a with these reasons")
        return "\n".join(lines)
    for backend, disc in zip(backends, [d for d in discoveries if d.available], strict=True):
        info = ", ".join(f"{k}={v}" for k, v in disc.info.items())
        lines.append(f"{disc.backend}: {len(disc.domains)} domain(s){'; ' + info if info else ''}")
        for u in disc.unavailable:
            lines.append(f"  {u}")
        for domain in disc.domains:
            ident = domain.device_uuid or domain.pci_bus_id or domain.id
            lines.append(f"  {domain.id}  kind={domain.kind.value}  name={domain.name!r}  id={ident}"
                         + (f"  contains={list(domain.contains)}" if domain.contains else "")
                         + (f"  shared_with={list(domain.shared_with)}" if domain.shared_with else ""))
            for sensor in (s for s in disc.sensors if s.domain_id == domain.id):
                lines.append(probe_line(sensor, *update_period(backend, sensor, probe_seconds)))
            if domain.kind.is_accelerator:
                lines.append(f"    aliasing: {card_bound(domain.name, disc.info.get('driver')).describe()}")
        backend.close()
    return "\n".join(lines)
