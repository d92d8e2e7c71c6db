"""Record a raw NVML trace on one GPU for jpwr's replay tests (tests/data/).

Polls, as fast as the driver allows (~5-10 ms a round, the energy counter read dominating),
the energy counter, the POWER_INSTANT and POWER_AVERAGE fields, nvmlDeviceGetPowerUsage,
clocks and utilisation, while a separate process runs: idle -> steady bf16 matmul -> idle ->
a bursty load with a 100 ms period (30 ms on) -> idle -> a 37 ms-period burst -> idle.
Phase edges are stamped on the same monotonic clock. Nothing on the GPU is changed.

    python benchmarks/record_nvml_trace.py --out tests/data/h100_trace
"""

from __future__ import annotations

import argparse
import csv
import gzip
import json
import multiprocessing as mp
import time
from multiprocessing.synchronize import Event
from pathlib import Path

# The columns of trace.csv.gz, what the fake pynvml (tests/fakes/pynvml) replays; synthetic traces use them too.
TRACE_COLUMNS = ("counter_t_before_ns", "counter_t_after_ns", "energy_mJ", "fields_t_before_ns", "fields_t_after_ns",
                 "power_instant_mW", "power_instant_hw_us", "power_average_mW", "usage_t_before_ns",
                 "usage_t_after_ns", "power_usage_mW", "sm_clock_MHz", "util_gpu_pct")
PHASES = [  # (name, seconds, period_s or None for steady, on-fraction)
    ("idle", 3.0, None, 0.0),
    ("steady", 8.0, None, 1.0),
    ("idle", 3.0, None, 0.0),
    ("burst100", 6.0, 0.100, 0.3),
    ("idle", 2.0, None, 0.0),
    ("burst37", 4.0, 0.037, 0.3),
    ("idle", 3.0, None, 0.0),
]


def load_process(ready: Event, go: Event, marks: mp.Queue) -> None:
    import torch

    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    ready.set()
    go.wait()
    for name, seconds, period, on_frac in PHASES:
        t0 = time.monotonic_ns()
        marks.put((name, "begin", t0))
        end = t0 + int(seconds * 1e9)
        if on_frac == 0.0:
            time.sleep(seconds)
        elif period is None:
            while time.monotonic_ns() < end:
                for _ in range(4):
                    a @ b
                torch.cuda.synchronize()
        else:
            nxt = t0
            while nxt < end:
                busy_until = nxt + int(period * on_frac * 1e9)
                while time.monotonic_ns() < busy_until:
                    a @ b
                    torch.cuda.synchronize()
                nxt += int(period * 1e9)
                time.sleep(max(0.0, (nxt - time.monotonic_ns()) / 1e9))
        marks.put((name, "end", time.monotonic_ns()))
    marks.put(None)


def main() -> None:
    import pynvml as nv

    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--index", type=int, default=0)
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    nv.nvmlInit()
    h = nv.nvmlDeviceGetHandleByIndex(args.index)
    fields = [(nv.NVML_FI_DEV_POWER_INSTANT, 0), (nv.NVML_FI_DEV_POWER_AVERAGE, 0)]

    def field_values():
        reqs = []
        for fid, scope in fields:
            reqs.append((fid, scope))
        return nv.nvmlDeviceGetFieldValues(h, reqs)

    meta = {
        "name": nv.nvmlDeviceGetName(h), "uuid": nv.nvmlDeviceGetUUID(h),
        "pci_bus_id": nv.nvmlDeviceGetPciInfo(h).busId, "driver": nv.nvmlSystemGetDriverVersion(),
        "nvml": nv.nvmlSystemGetNVMLVersion(), "power_limit_mW": nv.nvmlDeviceGetEnforcedPowerLimit(h),
        "memory_total_bytes": nv.nvmlDeviceGetMemoryInfo(h).total, "phases": PHASES,
    }
    # Per-call costs, measured before the load starts.
    costs = {}
    for label, fn in [("counter", lambda: nv.nvmlDeviceGetTotalEnergyConsumption(h)),
                      ("power_usage", lambda: nv.nvmlDeviceGetPowerUsage(h)),
                      ("fields", field_values),
                      ("clock", lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)),
                      ("utilization", lambda: nv.nvmlDeviceGetUtilizationRates(h))]:
        t = time.perf_counter()
        for _ in range(20):
            fn()
        costs[label] = (time.perf_counter() - t) / 20
    meta["call_cost_s"] = costs

    ctx = mp.get_context("spawn")
    ready, go, marks = ctx.Event(), ctx.Event(), ctx.Queue()
    proc = ctx.Process(target=load_process, args=(ready, go, marks))
    proc.start()
    ready.wait()
    rows = []
    phase_marks = []
    t_start = time.monotonic_ns()
    go.set()
    done = False
    while not done:
        t0 = time.monotonic_ns()
        energy = nv.nvmlDeviceGetTotalEnergyConsumption(h)
        t1 = time.monotonic_ns()
        fv = field_values()
        t2 = time.monotonic_ns()
        usage = nv.nvmlDeviceGetPowerUsage(h)
        sm = nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)
        util = nv.nvmlDeviceGetUtilizationRates(h).gpu
        t3 = time.monotonic_ns()
        inst, avg = fv[0], fv[1]
        rows.append([t0, t1, energy, t1, t2, inst.value.uiVal if inst.nvmlReturn == 0 else "",
                     inst.timestamp, avg.value.uiVal if avg.nvmlReturn == 0 else "", t2, t3, usage, sm, util])
        while not marks.empty():
            item = marks.get()
            if item is None:
                done = True
            else:
                phase_marks.append(item)
        time.sleep(0.004)
    proc.join()
    meta["marks"] = phase_marks
    meta["t_start_ns"] = t_start
    with gzip.open(out / "trace.csv.gz", "wt", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(TRACE_COLUMNS)
        w.writerows(rows)
    (out / "meta.json").write_text(json.dumps(meta, indent=2, default=str))
    dt = [(rows[i + 1][0] - rows[i][0]) / 1e6 for i in range(len(rows) - 1)]
    dt.sort()
    print(json.dumps({"rows": len(rows), "round_ms_median": dt[len(dt) // 2], "costs": costs,
                      "name": meta["name"], "marks": len(phase_marks)}, default=str))


if __name__ == "__main__":
    main()
