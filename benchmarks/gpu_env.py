"""Environment for a benchmark run on the first N GPUs of a machine that may have more.

jpwr meters every device the job may use; without a restriction a 1-GPU run on a 2-GPU machine
would count the idle second GPU in its energy (seen on nvidia-h200-x2, 2026-11-22: +80 W).
"""

from __future__ import annotations

import os
from collections.abc import Mapping


def first_gpus_env(processes: int, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """A copy of `base` (default os.environ) with CUDA_VISIBLE_DEVICES limited to `processes` devices.

    A restriction the caller already set is kept, so sites and schedulers stay in control.
    """
    env = dict(os.environ if base is None else base)
    env.setdefault("CUDA_VISIBLE_DEVICES", ",".join(str(i) for i in range(processes)))
    env.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")  # CUDA's index order = NVML's, so jpwr meters the same GPUs
    return env
