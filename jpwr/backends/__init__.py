"""Registry of jpwr's vendor backends and the `--methods` parser.

Each backend lives in its own module and imports its vendor library only inside `discover()`,
so a missing library is reported as "unavailable: <lib> not installed" rather than failing
`import jpwr`. CARAML users know jpwr 0.0.10's method names (`pynvml`, `rocm`, `gh`, `gc`);
they are accepted as aliases of ours. `replay:TRACE_DIR` plays a recorded trace back (jpwr.backends.replay);
`auto` never picks it. JPWR_SYSFS_ROOT moves the sysfs root of rapl and hwmon_gh (a container's bind mount,
the tests' fake trees).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Sequence
from pathlib import Path

from jpwr.clock import Clock
from jpwr.domains import Backend, Domain
from jpwr.errors import ValidationError

BACKEND_NAMES = ("nvml", "amdsmi", "rapl", "hwmon_gh", "gcipuinfo")
ALIASES = {"pynvml": "nvml", "rocm": "amdsmi", "gh": "hwmon_gh", "gc": "gcipuinfo"}
REPLAY_PREFIX = "replay:"
SYSFS_ROOT_ENV = "JPWR_SYSFS_ROOT"

# module name, class name (modules are imported on demand, see the module docstring)
_IMPLEMENTATIONS = {
    "nvml": ("jpwr.backends.nvml", "NvmlBackend"),
    "amdsmi": ("jpwr.backends.amdsmi", "AmdSmiBackend"),
    "rapl": ("jpwr.backends.rapl", "RaplBackend"),
    "hwmon_gh": ("jpwr.backends.hwmon_gh", "HwmonGhBackend"),
    "gcipuinfo": ("jpwr.backends.gcipuinfo", "GcIpuInfoBackend"),
    "replay": ("jpwr.backends.replay", "ReplayBackend"),
}


def canonical_name(name: str) -> str:
    """Map a method name or jpwr-0.0.10 alias to our backend name (`replay:DIR` kept whole, its path as given);
    unknown names are a ValidationError."""
    if name.strip().lower().startswith(REPLAY_PREFIX):
        if not name.strip()[len(REPLAY_PREFIX):]:
            raise ValidationError(f"method {name!r} names no trace", "write replay:TRACE_DIR")
        return REPLAY_PREFIX + name.strip()[len(REPLAY_PREFIX):]
    key = name.strip().lower()
    key = ALIASES.get(key, key)
    if key not in BACKEND_NAMES:
        valid = (", ".join(BACKEND_NAMES) + " (aliases: " + ", ".join(f"{a}={c}" for a, c in ALIASES.items())
                 + "), or replay:TRACE_DIR")
        raise ValidationError(f"unknown measurement method {name!r}", f"use 'auto' or a comma list of {valid}")
    return key


def parse_methods(spec: str | None) -> list[str] | None:
    """Parse `--methods`: None means auto (meter whatever exists); otherwise canonical names, de-duplicated. A
    replayed trace stands alone: it is no measurement of this machine, so nothing is added to it."""
    if spec is None or spec.strip().lower() in ("", "auto"):
        return None
    names: list[str] = []
    for part in spec.split(","):
        if not part.strip():
            raise ValidationError(f"empty entry in --methods {spec!r}", "separate method names by single commas")
        name = canonical_name(part)
        if name not in names:
            names.append(name)
    if len(names) > 1 and any(name.startswith(REPLAY_PREFIX) for name in names):
        raise ValidationError(f"--methods {spec!r} combines a replayed trace with another method: their devices "
                              "would be summed under the replayed label", "pass replay:TRACE_DIR alone")
    return names


def create_backend(
    name: str,
    clock: Clock,
    selectors: Sequence[str] | None = None,
    sysfs_root: str | Path | None = None,
    gpu_domains: Sequence[Domain] = (),
) -> Backend:
    """Build one backend by (alias or canonical) name.

    selectors: the job's accelerators on this node (see jpwr.devices), used by nvml and amdsmi; None = all.
    sysfs_root: root of the sysfs tree for rapl and hwmon_gh (default $JPWR_SYSFS_ROOT, else /sys).
    gpu_domains: NVML GPU domains already discovered, so hwmon_gh's Module domain can declare it contains them.
    """
    key, _, trace_dir = canonical_name(name).partition(":")
    module_name, class_name = _IMPLEMENTATIONS[key]
    cls = getattr(importlib.import_module(module_name), class_name)
    root = Path(sysfs_root if sysfs_root is not None else os.environ.get(SYSFS_ROOT_ENV) or "/sys")
    if key == "replay":
        return cls(clock, trace_dir=Path(trace_dir))
    if key in ("nvml", "amdsmi"):
        return cls(clock, selectors=selectors)
    if key == "rapl":
        return cls(clock, sysfs_root=root)
    if key == "hwmon_gh":
        return cls(clock, sysfs_root=root, gpu_domains=gpu_domains)
    return cls(clock)
