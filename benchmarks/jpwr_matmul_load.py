"""A steady bf16 matmul load that marks its windows and reads the NVML counter independently.

Run under jpwr to check its accuracy against the raw counter at the same boundaries:

    jpwr --methods nvml --out OUT -- python benchmarks/jpwr_matmul_load.py --seconds 30

Prints one JSON line: the independent counter delta over the steady window, jpwr's window
energy for the same window, their relative difference, jpwr's stated bound, and the matmul rate.
"""

from __future__ import annotations

import argparse
import json
import time

import pynvml
import torch

from joulebench.launch import LaunchEnv
from jpwr import WindowMeter
from jpwr.selftest_load import MATMUL_N, matmul_operands, matmuls_until


def run(seconds: float, warmup_s: float) -> dict[str, float | None]:
    pynvml.nvmlInit()
    uuid = str(torch.cuda.get_device_properties(0).uuid)
    handle = pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else f"GPU-{uuid}")
    a, b = matmul_operands(torch)
    meter = WindowMeter.open(LaunchEnv.from_env(), sync=torch.cuda.synchronize)
    meter.begin("warmup", 0)
    matmuls_until(torch, a, b, time.monotonic() + warmup_s)
    meter.end("warmup", 1)
    meter.begin("steady", 1)
    e0 = pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
    t0 = time.monotonic()
    done = matmuls_until(torch, a, b, t0 + seconds)
    torch.cuda.synchronize()
    t1 = time.monotonic()
    e1 = pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
    meter.end("steady", 2, work={"matmuls": done})
    energy = meter.node_energy(["steady"])["steady"]
    meter.close()
    independent = (e1 - e0) / 1000.0
    return {
        "seconds": t1 - t0, "matmuls": done, "tflops": done * 2 * MATMUL_N**3 / (t1 - t0) / 1e12,
        "independent_counter_j": independent, "jpwr_j": energy.energy_j, "jpwr_method": energy.method,
        "jpwr_bound_j": energy.error_bound_j, "jpwr_coverage": energy.coverage,
        "rel_diff": None if energy.energy_j is None else energy.energy_j / independent - 1.0,
        "unavailable_reason": energy.unavailable_reason,
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--warmup", type=float, default=3.0)
    args = parser.parse_args()
    print("JPWR_ACCURACY " + json.dumps(run(args.seconds, args.warmup)), flush=True)
