"""How the node's GPUs talk to each other, as NVML reports it: NVLink where any GPU has an active link, else PCIe
("none" on a node of one GPU: seen on a one-GPU H200 VM, whose SXM card reports no active link).

The run record's hardware block names it because data-parallel and tensor-parallel throughput (and with it the
energy per token) depend on it. Read-only, from the same library the meter reads; where NVML cannot answer (no
NVIDIA driver, an AMD or CPU node) the answer is "unknown" with the reason, never a guess.
"""

from __future__ import annotations

import dataclasses
from typing import Any

NVLINK_MAX_LINKS = 18  # NVML_NVLINK_MAX_LINKS of nvidia-ml-py 12.x (H100: 18 links)
FEATURE_ENABLED = 1  # NVML_FEATURE_ENABLED


@dataclasses.dataclass(frozen=True)
class Interconnect:
    """The node's GPU interconnect: "NVLink", "PCIe", "none" (one GPU) or "unknown", and what it was read from."""

    name: str
    detail: str

    def to_dict(self) -> dict[str, str]:
        return {"gpu_interconnect": self.name, "gpu_interconnect_detail": self.detail}


def _active_links(nv: Any, handle: Any) -> int:
    """Active NVLink links of one GPU; 0 where NVML says the GPU has none (a PCIe card: NOT_SUPPORTED)."""
    active = 0
    for link in range(NVLINK_MAX_LINKS):
        try:
            active += int(nv.nvmlDeviceGetNvLinkState(handle, link)) == FEATURE_ENABLED
        except nv.NVMLError:
            continue  # a link this GPU does not have (NOT_SUPPORTED, INVALID_ARGUMENT past its count)
    return active


def gpu_interconnect() -> Interconnect:
    """The interconnect of every GPU on this node (not only the job's: it is a fact of the node)."""
    try:
        import pynvml
    except ImportError:
        return Interconnect("unknown", "NVML not installed (nvidia-ml-py)")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return Interconnect("unknown", f"NVML not available: {exc}")
    try:
        count = int(pynvml.nvmlDeviceGetCount())
        links = [_active_links(pynvml, pynvml.nvmlDeviceGetHandleByIndex(i)) for i in range(count)]
    except (pynvml.NVMLError, AttributeError) as exc:  # AttributeError: an nvidia-ml-py without the NVLink calls
        return Interconnect("unknown", f"NVML could not list the NVLink state: {exc!r}")
    finally:
        pynvml.nvmlShutdown()
    if not links:
        return Interconnect("unknown", "NVML lists no GPU on this node")
    linked = [n for n in links if n]
    if linked:
        return Interconnect("NVLink", f"NVML: {len(linked)} of {count} GPU(s) with active NVLink links "
                                      f"({min(linked)}-{max(linked)} each)")
    if count == 1:  # an SXM card alone in a VM shows no active link either: nothing links it to a second GPU
        return Interconnect("none", "NVML: one GPU on this node, no active NVLink link (nothing to link to)")
    return Interconnect("PCIe", f"NVML: no active NVLink link on any of {count} GPU(s)")
