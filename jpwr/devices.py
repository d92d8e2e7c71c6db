"""public: for code that acts on the job's GPUs and must touch exactly the ones the meter meters (device settings,
the disturbance check), and for the node's GPU facts the run record states (the interconnect).

This node's name and host as the sampler records them, the job's accelerators as selectors, and the same
resolution of selectors to NVML handles that the nvml backend uses. How the selectors are read from the
environment is private (jpwr.selectors).
"""

from __future__ import annotations

from jpwr.backends.nvml import resolve_gpus
from jpwr.interconnect import Interconnect, gpu_interconnect
from jpwr.node import host_id, node_name
from jpwr.selectors import job_devices, selector_kind, selector_matches

__all__ = [
    "Interconnect",  # gpu_interconnect's answer: NVLink, PCIe or unknown, and what it was read from
    "gpu_interconnect",  # the node's GPU interconnect as NVML reports it (the run record's hardware block)
    "host_id",  # this host (hostname and boot id), which several node names may share
    "job_devices",  # the job's accelerators on this node, as selectors
    "node_name",  # this node's name as the sampler records it
    "resolve_gpus",  # selectors -> NVML handles, resolved as the meter resolves them
    "selector_kind",  # index, UUID, MIG or PCI: how a selector names a device
    "selector_matches",  # whether a device is the one a selector names
]
