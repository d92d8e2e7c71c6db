"""Check jpwr's nvml backend against the real nvidia-ml-py on a GPU machine (the CI fake cannot prove this).

Discovers the job's GPUs (jpwr.devices: CUDA_VISIBLE_DEVICES / Slurm / all), then for --rounds rounds reads
every sensor through the backend and, right after, the energy counter straight through pynvml. Prints
domains, sensors, unavailable reasons, per-sensor status counts, read latency and value range, the latent
metrics, and the largest backend-vs-direct counter difference (should be at most one ~100 ms counter step).
Exit status 1 if a GPU lacks an OK energy counter or power sensor.

    python benchmarks/check_nvml_backend.py --rounds 100
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict

from jpwr.backends import create_backend
from jpwr.clock import SYSTEM_CLOCK
from jpwr.devices import job_devices
from jpwr.domains import Signal, Status


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--gap-ms", type=float, default=20.0)
    args = parser.parse_args()

    import pynvml

    selection = job_devices("nvidia")
    print(f"selection: {selection.selectors} from {selection.source} {list(selection.warnings)}")
    backend = create_backend("nvml", SYSTEM_CLOCK, selectors=selection.selector_list)
    disc = backend.discover()
    print(f"info: {disc.info}")
    for domain in disc.domains:
        print(f"domain {domain.id} kind={domain.kind.value} index={domain.index} pci={domain.pci_bus_id} "
              f"name={domain.name!r} shared_with={domain.shared_with} contains={domain.contains} "
              f"attrs={dict(domain.attrs)}")  # fmt: skip
    for line in disc.unavailable:
        print(line)

    statuses: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    latency: dict[str, list[float]] = defaultdict(list)
    values: dict[str, list[float]] = defaultdict(list)
    counter_gap_j: dict[str, float] = defaultdict(float)
    handles = {d.id: pynvml.nvmlDeviceGetHandleByUUID(d.device_uuid) for d in disc.domains if d.device_uuid}
    for _ in range(args.rounds):
        for reading in backend.read(disc.sensors):
            statuses[reading.sensor_id][reading.status.value] += 1
            latency[reading.sensor_id].append((reading.t_after_ns - reading.t_before_ns) / 1e6)
            if reading.status is Status.OK and reading.value is not None:
                values[reading.sensor_id].append(reading.value)
                sensor = next(s for s in disc.sensors if s.id == reading.sensor_id)
                if sensor.signal is Signal.ENERGY_COUNTER and sensor.domain_id in handles:
                    direct = pynvml.nvmlDeviceGetTotalEnergyConsumption(handles[sensor.domain_id]) / 1000.0
                    gap = abs(direct - reading.value)
                    counter_gap_j[sensor.id] = max(counter_gap_j[sensor.id], gap)
        time.sleep(args.gap_ms / 1000.0)

    print(f"\n{'sensor':<70} {'statuses':<22} {'read ms (median)':>16} {'min':>10} {'max':>10}")
    for sensor in disc.sensors:
        vals = values[sensor.id] or [float("nan")]
        print(f"{sensor.id:<70} {dict(statuses[sensor.id])!s:<22} {statistics.median(latency[sensor.id]):>16.3f} "
              f"{min(vals):>10.3f} {max(vals):>10.3f}")  # fmt: skip
    for sensor_id, gap in counter_gap_j.items():
        print(f"largest |backend - direct pynvml| counter difference for {sensor_id}: {gap:.3f} J")
    for metric in backend.read_metrics():
        print(f"metric {metric.domain_id} {metric.name} = {metric.value:g}")
    backend.close()

    ok = True
    for domain in disc.domains:
        signals = {s.signal for s in disc.sensors if s.domain_id == domain.id and statuses[s.id].get("ok")}
        if domain.kind.value == "gpu" and not signals:
            print(f"FAIL: {domain.id} has no working sensor")
            ok = False
    if not disc.domains:
        print("FAIL: no GPU discovered")
        ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
