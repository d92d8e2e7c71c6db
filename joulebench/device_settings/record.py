"""The device-settings block of a run record, `config.device_settings` (docs/run-record.md).

`apply --record` writes one node's block: {"requested", "route", "node", "state_file", "devices": [...]}; a run over
several nodes holds {"requested", "route", "nodes": [node blocks]}. No block, or nothing requested, is the device's
own settings: a sweep's default row. The analysis (report --pareto, plan) reads it through `recorded_settings`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from joulebench.device_settings import Request
from jpwr.output import fmt

RECORD_KEY = "device_settings"


def node_block(request: Request, route: str | None, node: str, state_file: str | None,
               devices: list[dict[str, Any]]) -> dict[str, Any]:
    return {"requested": request.to_dict(), "route": route, "node": node, "state_file": state_file,
            "devices": devices}


@dataclasses.dataclass(frozen=True)
class RecordedSettings:
    """What a run asked for and what its devices read back after the apply step."""

    requested: Request
    power_limit_w_read_back: tuple[float, ...] = ()  # every device of every node
    locked_sm_clock_mhz: tuple[int, ...] = ()

    @property
    def is_default(self) -> bool:
        return self.requested.is_empty

    @property
    def label(self) -> str:
        parts = [f"{fmt(self.requested.power_limit_w)} W"] if self.requested.power_limit_w is not None else []
        parts += [f"{self.requested.sm_clock_mhz} MHz"] if self.requested.sm_clock_mhz is not None else []
        return ", ".join(parts) or "default"

    @property
    def applied_label(self) -> str:
        """The read-back values, one per distinct value (devices that disagree show all)."""
        parts = [f"{fmt(v)} W" for v in sorted(set(self.power_limit_w_read_back))]
        parts += [f"{v} MHz" for v in sorted(set(self.locked_sm_clock_mhz))]
        return ", ".join(parts) or ("default" if self.is_default else "n/a")


def recorded_settings(config: Mapping[str, Any]) -> RecordedSettings:
    block = config.get(RECORD_KEY)
    if not block:
        return RecordedSettings(Request())
    devices = [d for node in (block.get("nodes") or [block]) for d in node.get("devices", [])]
    return RecordedSettings(
        Request.from_dict(block.get("requested") or {}),
        tuple(float(d["power_limit_w"]) for d in devices if d.get("power_limit_w") is not None),
        tuple(int(d["locked_sm_clock_mhz"]) for d in devices if d.get("locked_sm_clock_mhz") is not None),
    )
