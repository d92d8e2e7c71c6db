"""Fake `gcipuinfo` (Graphcore Poplar SDK) at the vendor boundary.

The "hardware" is a list of attribute dicts (strings, as gc-info prints them) that tests change with
`set_attribute`. A `gcipuinfo` object snapshots them at construction and again only on `updateData()`, or
on every query after `setUpdateMode(True)`: the stale-unless-updated behaviour of the real library.
Unconfigured, there are no IPUs.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

# attribute labels (the real module exports these names)
DeviceId = "id"
IpuPower = "ipu power"
TotalBoardPower = "total board power"
BoardSerialNumber = "board serial number"
BoardIpuIndex = "board ipu index"
BoardType = "board type"
IpuUtilisation = "ipu utilisation"
ClockFrequency = "clock"
AverageDieTemp = "average die temp"
PciId = "pci id"

_live: list[dict[str, str]] = []
_update_fails = False


def configure(devices: Sequence[dict[str, str]], update_fails: bool = False) -> None:
    global _live, _update_fails
    _live = [dict(d) for d in devices]
    _update_fails = update_fails


def reset() -> None:
    configure([])


def set_attribute(device_id: str, attribute: str, value: str) -> None:
    """Change the live value of one IPU (found by its id, like the hardware changing underneath)."""
    next(d for d in _live if d[DeviceId] == device_id)[attribute] = value


def ipu(device_id: int, serial: str, board_index: int, power: str = "100.00W", **extra: str) -> dict[str, str]:
    """One IPU's attributes in gc-info's string form."""
    return {DeviceId: str(device_id), BoardSerialNumber: serial, BoardIpuIndex: str(board_index),
            BoardType: "C600", IpuPower: power, IpuUtilisation: "50.00%", ClockFrequency: "1850MHz",
            AverageDieTemp: "40.1 C", PciId: f"0000:{0x35 + device_id:02x}:00.0", **extra}


class gcipuinfo:  # the real class name
    def __init__(self, discoveryMode: Any = None) -> None:
        self._auto = False
        self._snapshot = copy.deepcopy(_live)

    def updateData(self) -> bool:
        if _update_fails:
            return False
        self._snapshot = copy.deepcopy(_live)
        return True

    def setUpdateMode(self, autoUpdate: bool) -> None:
        self._auto = autoUpdate

    def getDevices(self) -> list[dict[str, str]]:
        if self._auto:
            self.updateData()
        return copy.deepcopy(self._snapshot)

    def getNamedAttributeForAll(self, attribute: str) -> list[str]:
        return [d.get(attribute, "N/A") for d in self.getDevices()]
