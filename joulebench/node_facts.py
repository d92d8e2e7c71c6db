"""Facts of the node a run ran on that no framework reports: the GPUs' interconnect (NVLink or PCIe).

Every driver's hardware block gets them through `gpu_node_facts`, whatever framework built the rest of the block,
so that runs on NVLink and PCIe nodes are never compared as if they were the same hardware.
"""

from __future__ import annotations

from joulebench.record_shape import checked_block
from joulebench.record_types import HardwareBlock
from jpwr.devices import gpu_interconnect


def gpu_node_facts(device_kind: str) -> HardwareBlock:
    """`gpu_interconnect` ("NVLink", "PCIe" or "unknown") and where it was read, for a run on GPUs ("cuda"); none
    for a CPU run, which has no GPU interconnect to name."""
    return checked_block(HardwareBlock, gpu_interconnect().to_dict() if device_kind == "cuda" else {}, "hardware")
