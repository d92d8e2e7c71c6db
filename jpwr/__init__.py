"""jpwr: accelerator power and energy measurement, as a library and the `jpwr` command.

The meter alone: vendor backends, one sampler per node, window marks from the loop, the
counter-anchored estimator with its error bound, trace files and the node combination. It
imports nothing of the benchmarks built on it (joulebench, the drivers) and no framework at
module level. See docs/jpwr.md and docs/architecture.md ("The meter's API").

The API comes in tiers. `jpwr.__all__` (below) is what a user of the meter needs: open a meter,
mark windows, read a window's energy and its bound, the errors; each name with the reason it is
here, and tests/test_architecture.py fails when the list changes without one (at most 15). Public
submodules serve one kind of user each and say so in their first line ("public: for ..."), with
their own `__all__`: jpwr.phases (drivers timing phases), jpwr.trace (reading saved traces),
jpwr.energy (building results from window energies), jpwr.estimator (sizing a window),
jpwr.output (writing results), jpwr.arguments (command-line types), jpwr.errors (the error
boundary of a command line), jpwr.devices and jpwr.device_state (acting on the job's GPUs).
Every other module, and every name outside those lists, is private to the meter. Names load on
first use, so `import jpwr` (and every `jpwr` command's start-up) stays free of numpy and h5py.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# Public name -> (the private module that defines it, why a user of the meter needs it).
_API = {
    "__version__": ("jpwr", "the version every record and trace states"),
    "WindowMeter": ("jpwr.meter", "opens the node's meter for one rank, marks window edges, reads window energies"),
    "Window": ("jpwr.energy", "a marked window with its work and, once attached, its energy"),
    "WindowEnergy": ("jpwr.energy", "a window's energy with method, coverage and error bound (or why n/a)"),
    "IdleBaseline": ("jpwr.energy", "idle power measured before the first window; splits every window"),
    "IdlePlan": ("jpwr.idle", "how WindowMeter.measure_idle settles and how long it meters idle"),
    "SettleRule": ("jpwr.idle", "the cool-down part of an IdlePlan"),
    "NodeLive": ("jpwr.live", "WindowMeter.live's answer: the node's recent power and sensor update period"),
    "ADDR_ENV": ("jpwr.channel", "the environment variable naming the node's sampler that WindowMeter.open reaches"),
    "JpwrError": ("jpwr.errors", "base of the meter's deliberate errors; each carries its exit code"),
    "ValidationError": ("jpwr.errors", "a value that cannot work: '<problem>. Fix: <fix>' (exit 64)"),
    "FormatError": ("jpwr.errors", "an input file that is not what it claims (exit 65)"),
    "MethodUnavailableError": ("jpwr.errors", "a requested method or device call is unavailable here (exit 69)"),
    "OutputDirError": ("jpwr.errors", "an output directory that cannot be written (exit 73)"),
    "ExitCode": ("jpwr.errors", "the sysexits codes these errors end a command with"),
}

__all__ = list(_API)


def __getattr__(name: str) -> Any:
    """Load a public name from its module on first use (PEP 562)."""
    if name not in _API:
        raise AttributeError(f"module 'jpwr' has no attribute {name!r}")
    value = getattr(importlib.import_module(_API[name][0]), name)
    globals()[name] = value
    return value
