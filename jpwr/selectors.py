"""Which accelerators this job owns on this node, as selectors the vendor backends resolve to UUIDs.

The node's sampler must meter exactly the job's devices: not all GPUs of a shared node, and not
just local rank 0's view. Sources, first match wins:

* NVIDIA: ``CUDA_VISIBLE_DEVICES`` (indices, ``GPU-…`` UUIDs or unique UUID prefixes, ``MIG-…`` ids).
* AMD: ``ROCR_VISIBLE_DEVICES`` (indices or ``GPU-…`` UUIDs), then ``HIP_VISIBLE_DEVICES`` applied on top
  of it (HIP indices count within ROCr's list), or ``CUDA_VISIBLE_DEVICES`` which HIP also honours.
* Both: ``SLURM_STEP_GPUS`` then ``SLURM_JOB_GPUS`` (physical indices of the node's GPUs).
* Nothing set: ``None``, meaning every device on the node.

Caveats:

* **CUDA order vs NVML order.** Index selectors are resolved in the vendor library's order (NVML: PCI bus
  order). CUDA numbers devices fastest-first unless ``CUDA_DEVICE_ORDER=PCI_BUS_ID``; on a node with
  mixed GPU models the two orders differ and an index names a different GPU. UUID selectors are immune;
  `DeviceSelection.warnings` says when indices came from CUDA without ``CUDA_DEVICE_ORDER=PCI_BUS_ID``.
* **Slurm physical indices** are only valid where the sampler sees all of the node's GPUs (no device
  cgroup). Under ``ConstrainDevices=yes`` the library renumbers from 0; ``CUDA_VISIBLE_DEVICES`` (which
  Slurm sets consistently with the cgroup) is then the right source, and it takes precedence here.
* CUDA stops reading ``CUDA_VISIBLE_DEVICES`` at the first invalid (e.g. negative) entry; so do we.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping

from jpwr.errors import ValidationError

_INDEX = re.compile(r"^\d+$")
_PCI = re.compile(r"^([0-9a-fA-F]{4,8}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$")
_NO_DEVICES = ("", "NoDevFiles")  # Slurm writes NoDevFiles when the step has no GPUs


@dataclasses.dataclass(frozen=True)
class DeviceSelection:
    """The job's devices on this node: selectors (None = all devices) and where they came from."""

    selectors: tuple[str, ...] | None
    source: str  # environment variable name(s), or "all"
    warnings: tuple[str, ...] = ()

    @property
    def selector_list(self) -> list[str] | None:
        return None if self.selectors is None else list(self.selectors)

    @property
    def described(self) -> str:
        """Where the selection came from, as a summary and a run record name it: `CUDA_VISIBLE_DEVICES=1`, or
        `all devices of the node` when nothing selected them."""
        if self.selectors is None:
            return "all devices of the node (no visible-devices variable, no Slurm GPU binding)"
        return f"{self.source}={','.join(self.selectors)}"


def selector_kind(selector: str) -> str:
    """Classify one selector: 'index', 'mig', 'uuid' (GPU-… or a prefix of it) or 'pci'."""
    if _INDEX.match(selector):
        return "index"
    if selector.startswith("MIG-"):
        return "mig"
    if selector.startswith("GPU-"):
        return "uuid"
    if _PCI.match(selector):
        return "pci"
    raise ValidationError(
        f"device selector {selector!r} is neither an index, a GPU-/MIG- UUID nor a PCI bus id",
        "use e.g. 0, GPU-3f1c0a2b, MIG-5c6e..., or 0000:41:00.0",
    )


def pci_key(bus_id: str) -> str:
    """Normalise a PCI bus id ('00000000:C1:00.0', '0000:c1:00.0', 'c1:00.0') to 'dddd:bb:dd.f' for comparison."""
    domain, _, rest = bus_id.strip().lower().rpartition(":")
    domain, _, bus = domain.rpartition(":") if domain.count(":") else ("0", "", domain)
    return f"{int(domain or '0', 16):04x}:{bus}:{rest}"


def selector_matches(selector: str, kind: str, index: int, uuid: str, bus_id: str) -> bool:
    """Whether a device matches `selector` of `kind` (selector_kind): its index, a prefix of its UUID, its bus id."""
    return ((kind == "index" and int(selector) == index)
            or (kind == "uuid" and uuid.lower().startswith(selector.lower()))
            or (kind == "pci" and pci_key(bus_id) == pci_key(selector)))


def _parse_list(var: str, value: str) -> tuple[str, ...]:
    """Split a visible-devices list the way CUDA/HIP do: stop at the first negative index."""
    if value.strip() in _NO_DEVICES:
        return ()
    selectors: list[str] = []
    for raw in value.split(","):
        item = raw.strip()
        if item.startswith("-") and _INDEX.match(item[1:]):
            break
        try:
            selector_kind(item)
        except ValidationError as exc:
            raise ValidationError(f"{var}={value!r}: {exc.problem}", exc.fix) from None
        selectors.append(item)
    return tuple(selectors)


def _parse_slurm(var: str, value: str) -> tuple[str, ...]:
    """Slurm GPU lists are physical indices, possibly as ranges ('0-3,6')."""
    if value.strip() in _NO_DEVICES:
        return ()
    indices: list[str] = []
    for raw in value.split(","):
        item = raw.strip()
        match = re.match(r"^(\d+)(?:-(\d+))?$", item)
        if not match:
            raise ValidationError(f"{var}={value!r}: {item!r} is not a GPU index", f"unset {var} or fix the job")
        first, last = int(match.group(1)), int(match.group(2) or match.group(1))
        indices.extend(str(i) for i in range(first, last + 1))
    return tuple(indices)


def job_devices(vendor: str = "nvidia", env: Mapping[str, str] | None = None) -> DeviceSelection:
    """The accelerators this job owns on this node, for `vendor` 'nvidia' or 'amd'."""
    env = os.environ if env is None else env
    if vendor not in ("nvidia", "amd"):
        raise ValidationError(f"unknown accelerator vendor {vendor!r}", "use 'nvidia' or 'amd'")
    if vendor == "amd" and "ROCR_VISIBLE_DEVICES" in env:
        rocr = _parse_list("ROCR_VISIBLE_DEVICES", env["ROCR_VISIBLE_DEVICES"])
        if "HIP_VISIBLE_DEVICES" not in env:
            return DeviceSelection(rocr, "ROCR_VISIBLE_DEVICES")
        hip = _parse_list("HIP_VISIBLE_DEVICES", env["HIP_VISIBLE_DEVICES"])
        if any(selector_kind(s) != "index" or int(s) >= len(rocr) for s in hip):
            raise ValidationError(
                f"HIP_VISIBLE_DEVICES={env['HIP_VISIBLE_DEVICES']!r} does not index into "
                f"ROCR_VISIBLE_DEVICES={env['ROCR_VISIBLE_DEVICES']!r}",
                "HIP indices count within ROCr's list; use indices below its length",
            )
        return DeviceSelection(tuple(rocr[int(s)] for s in hip), "ROCR_VISIBLE_DEVICES+HIP_VISIBLE_DEVICES")
    visible_vars = ("HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES") if vendor == "amd" else ("CUDA_VISIBLE_DEVICES",)
    for var in visible_vars:
        if var in env:
            selectors = _parse_list(var, env[var])
            warnings: tuple[str, ...] = ()
            uses_index = any(selector_kind(s) == "index" for s in selectors)
            if var == "CUDA_VISIBLE_DEVICES" and uses_index and env.get("CUDA_DEVICE_ORDER") != "PCI_BUS_ID":
                warnings = (
                    "CUDA_VISIBLE_DEVICES holds indices and CUDA_DEVICE_ORDER is not PCI_BUS_ID: CUDA numbers "
                    "devices fastest-first, the vendor library in PCI order; on mixed-model nodes they differ",
                )
            return DeviceSelection(selectors, var, warnings)
    for var in ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS"):
        if var in env:
            return DeviceSelection(_parse_slurm(var, env[var]), var)
    return DeviceSelection(None, "all")


def empty_selection(env: Mapping[str, str] | None = None) -> str | None:
    """Why this node meters no accelerators on purpose, or None: the job's device selection is empty for
    every vendor (e.g. CUDA_VISIBLE_DEVICES="" or Slurm's NoDevFiles). That is a node that meters
    nothing, not a sensor that failed."""
    env = os.environ if env is None else env
    selections = [job_devices(vendor, env) for vendor in ("nvidia", "amd")]
    if any(s.selectors is None or s.selectors for s in selections):
        return None
    sources = sorted({s.source for s in selections})
    return "its device selection is empty (" + ", ".join(f"{v}={env.get(v, '')!r}" for v in sources) + ")"
