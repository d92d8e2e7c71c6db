"""One device's share of a window's energy, and the faults found in its data.

These are the entries of a window's `per_device`, `other_domains` and `faults` lists (jpwr.energy). They are
dicts only in files and on the socket (to_dict / from_dict); from_dict reads entries written by earlier
versions, which lack the fields added since (node, trust, covered time, faults, partial figures).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from jpwr.output import known_fields


@dataclasses.dataclass(kw_only=True)
class Fault:
    """A stretch of a device's window data that cannot be taken at its word; times in s from the window's start.

    kind: gap (no data), counter_fault (a step no permitted power can make), counter_power_disagree,
    counter_backward (reset, unknown wrap or backward jump), out_of_order (readings re-ordered by time).
    The estimator finds faults per sensor pair; the device and node are set once the device is known.
    """

    device: str | None = None  # the domain id
    node: str | None = None
    kind: str
    from_s: float
    to_s: float
    error: str | None = None  # the vendor's name of the read error, where reads failed
    detail: str

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Fault:
        return cls(**known_fields(cls, data))


@dataclasses.dataclass(kw_only=True)
class DeviceEnergy:
    """One domain's figures for a window. Below the coverage threshold its energy, power and bound are withheld
    (None, `trusted` False) and the covered part is given in the partial_* fields; its partial mean power is over
    the seconds it was measured, never over the window."""

    domain: str
    node: str | None = None  # None in summaries written before nodes were named per device
    kind: str
    name: str
    uuid: str | None = None
    pci_bus_id: str | None = None
    index: int | None = None
    energy_j: float | None
    mean_power_w: float | None
    method: str | None
    coverage: float
    error_bound_j: float | None
    warnings: list[str] = dataclasses.field(default_factory=list)
    unavailable_reason: str | None = None
    shared_with: list[str] = dataclasses.field(default_factory=list)
    trusted: bool = True
    covered_s: float | None = None  # None in summaries written before it was recorded
    faults: list[Fault] = dataclasses.field(default_factory=list)
    partial_energy_j: float | None = None
    partial_error_bound_j: float | None = None
    partial_mean_power_w: float | None = None
    # Mean of the device's utilisation samples (fraction of time a kernel ran, 0-1) over the window; None where the
    # device reported none: with energy and mean power it shows a straggling rank
    utilization_gpu: float | None = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DeviceEnergy:
        fields = known_fields(cls, data)
        fields["faults"] = [Fault.from_dict(f) for f in data.get("faults", ())]
        return cls(**fields)
