"""jpwr: accelerator power and energy measurement, as a library and the `jpwr` command.

The meter alone: vendor backends, one sampler per node, window marks from the loop, the
counter-anchored estimator with its error bound, trace files and the node combination. It
imports nothing of the benchmarks built on it (joulebench, the drivers) and no framework at
module level. See docs/jpwr.md and docs/architecture.md ("The meter's API").

Code outside jpwr imports only the names below (`from jpwr import WindowMeter`); every module
of the package is private to it. The list is longer than a marking API alone because it is the
whole surface the product reads: what a loop marks, what a saved trace holds for analysis, the
errors and output conventions every command line shares, and the job's device selection that
GPU settings must agree with. Each name is defined once, in jpwr, because the meter needs it
itself; the groups below say who uses them. Names load on first use, so `import jpwr` (and every
`jpwr` command's start-up) stays free of numpy and h5py.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# Public name -> the private module that defines it.
_HOMES = {
    # --- Marking windows (drivers) --------------------------------------------------------------------
    "WindowMeter": "jpwr.meter",  # marks one rank's window edges, collects the node's window energies
    "Window": "jpwr.energy",  # a marked window with its work and, once attached, its energy
    "WindowEnergy": "jpwr.energy",  # a window's energy with method, coverage and error bound (or why n/a)
    "IdleBaseline": "jpwr.energy",  # idle power measured before the first window; splits every window
    "IdlePlan": "jpwr.idle",  # how WindowMeter.measure_idle settles and how long it meters idle
    "SettleRule": "jpwr.idle",  # the cool-down part of an IdlePlan
    "NodeLive": "jpwr.live",  # WindowMeter.live's answer: the node's recent power and sensor update period
    "PhaseRecorder": "jpwr.phases",  # WindowMeter.phases: named phase marks inside a window
    "DeviceEventStamps": "jpwr.phases",  # phase stamps as CUDA/ROCm events (the caller passes torch in)
    "HostStamps": "jpwr.phases",  # the same stamps on the host's monotonic clock (CPU runs)
    "ADDR_ENV": "jpwr.channel",  # the environment variable naming the node's sampler (set by job scripts)
    "INTERVAL_PREFIX": "jpwr.channel",  # how WindowMeter.mark_interval's names start (log intervals, no windows)
    # --- Planning a window from the estimator's own terms (the core's steady-window sizing) ----------
    "planned_bound_j": "jpwr.estimator",  # the bound the estimator will state for a window's two edges
    "aliasing_warning": "jpwr.estimator",  # whether a loop's period aliases with the sensor's
    # --- Combining nodes -------------------------------------------------------------------------------
    "combine_energies": "jpwr.energy",  # per-node window energies -> the run's, each device counted once
    "split_energy": "jpwr.energy",  # a window's energy -> idle and dynamic parts by the idle baseline
    "J_PER_WH": "jpwr.energy",  # the unit WindowEnergy.energy_wh converts with
    # --- Reading a saved trace (analysis, workflows) ---------------------------------------------------
    "load_trace": "jpwr.trace",  # a node's trace from its directory (HDF5 or segments) or a trace file
    "TraceData": "jpwr.trace",  # what load_trace returns: domains, sensors, readings, marks, phases
    "TRACE_FILE": "jpwr.trace",  # <node>/trace.h5: how a search recognises a node directory
    "SEGMENT_DIR": "jpwr.trace",  # <node>/segments/: the same, for a sampler that never assembled its file
    "SUMMARY_FILE": "jpwr.summary",  # <node>/summary.json: the sampler's own window energies
    "NodeSummary": "jpwr.summary",  # a node's summary.json, typed (its windows' WindowEnergy included)
    "Domain": "jpwr.domains",  # a metered device (GPU, CPU package, module) in a trace
    "Signal": "jpwr.domains",  # what a sensor reads: energy counter, instant or averaged power
    "WindowSpan": "jpwr.windows",  # a window's edges on one node, from its marks
    "spans_from_marks": "jpwr.windows",  # a trace's marks -> its windows
    "accelerator_domains": "jpwr.windows",  # the accelerators that sum into a headline (no double count)
    "headline_domains": "jpwr.windows",  # what a headline sums: the accelerators, else RAPL packages (+ DRAM)
    "ACCELERATORS": "jpwr.windows",  # WindowEnergy.domain of an accelerator headline ("cpu package + dram": RAPL)
    "REPLAYED": "jpwr.backends.replay",  # the label a replayed trace's domains and energy domain carry
    "window_energy": "jpwr.windows",  # one window's energy from a saved trace: the sampler's own estimator
    "counter_segments": "jpwr.estimator",  # an energy counter's update knots, which the attribution fit reads
    "Knots": "jpwr.estimator",  # one run of counter updates (counter_segments' result)
    "PhaseBatch": "jpwr.phases",  # one rank's phase intervals in one window, as stored in a trace
    # --- Errors and the one error boundary of every command line ---------------------------------------
    "JpwrError": "jpwr.errors",  # base of deliberate errors; each carries its exit code
    "ValidationError": "jpwr.errors",  # a value that cannot work: "<problem>. Fix: <fix>" (exit 64)
    "FormatError": "jpwr.errors",  # an input file that is not what it claims (exit 65)
    "MethodUnavailableError": "jpwr.errors",  # a requested method or device call is unavailable (exit 69)
    "OutputDirError": "jpwr.errors",  # an output directory that cannot be written (exit 73)
    "ExitCode": "jpwr.errors",  # the sysexits codes above
    "exit_code_of": "jpwr.errors",  # runs a command behind the boundary; joulebench.boundary builds on it
    "take_debug_flag": "jpwr.errors",  # strips --debug (traceback on error) before parsing
    # --- Writing results -------------------------------------------------------------------------------
    "fmt": "jpwr.output",  # numbers for tables: None prints "n/a", never 0
    "atomic_path": "jpwr.output",  # the one atomic writer: a temporary file beside a final one, renamed at the end
    "atomic_paths": "jpwr.output",  # several files together: all flushed, then renamed in order
    "write_atomic": "jpwr.output",  # text or bytes through it
    "write_json_atomic": "jpwr.output",  # JSON through it (no reader ever sees a half-written file)
    "json_text": "jpwr.output",  # the JSON text those files hold (NaN as null), for a copy that goes elsewhere
    "utc_now": "jpwr.output",  # the timestamp format of every record
    # --- The node and the job's devices (device settings must touch exactly the metered GPUs) --------
    "node_name": "jpwr.node",  # this node's name as the sampler records it
    "host_id": "jpwr.node",  # this host (hostname and boot id), which several node names may share
    "job_devices": "jpwr.devices",  # the job's accelerators on this node, as selectors
    "selector_kind": "jpwr.devices",  # index, UUID, MIG or PCI: how a selector names a device
    "selector_matches": "jpwr.devices",  # whether a device is the one a selector names
    "resolve_gpus": "jpwr.backends.nvml",  # selectors -> NVML handles, resolved as the meter resolves them
    # --- What else runs on the job's GPUs (joulebench.disturbed judges whether it disturbed a run) ------
    "DeviceStateProbe": "jpwr.device_state",  # the job's GPUs' processes and clock event reasons, read-only
    "DeviceState": "jpwr.device_state",  # one GPU's processes and clock event reason mask at one moment
    "ProcessFacts": "jpwr.device_state",  # a PID's name and parents as /proc shows them
    "process_facts": "jpwr.device_state",  # reads them
    "reason_names": "jpwr.device_state",  # a clock event reason mask -> NVML's names of its bits
    # --- Command-line types (joulebench.arguments adds the drivers' ranges) -------------------------
    "Number": "jpwr.arguments",  # an argparse type: a finite number within a stated range
    "state_ranges": "jpwr.arguments",  # appends each numeric option's range to its help
    "COUNT": "jpwr.arguments",  # a whole number in [1, 10**7]
    "COUNT_OR_ZERO": "jpwr.arguments",  # a whole number in [0, 10**7]
    "NODES": "jpwr.arguments",  # nodes, devices, ranks: a whole number in [1, 65536]
    "SECONDS": "jpwr.arguments",  # a duration in (0, 7 days]
    "SECONDS_OR_ZERO": "jpwr.arguments",  # a duration in [0, 7 days]
    "FRACTION": "jpwr.arguments",  # a number in [0, 1]
    "PORT": "jpwr.arguments",  # a TCP port in [1, 65535]
    "method_names": "jpwr.arguments",  # an argparse type for a list of measurement methods jpwr knows
    "parse_methods": "jpwr.backends",  # a --methods text -> its backends; an unknown name is a ValidationError
    # --- A known GPU load (the selftest's), for scripts that check the meter against it ---------------
    "MATMUL_N": "jpwr.selftest",  # the matrix size of the load (2·N³ FLOP per product)
    "matmul_operands": "jpwr.selftest",  # the load's two bf16 matrices on the current GPU
    "matmuls_until": "jpwr.selftest",  # back-to-back products until a deadline
}

__all__ = ["__version__", *_HOMES]


def __getattr__(name: str) -> Any:
    """Load a public name from its module on first use (PEP 562)."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'jpwr' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value
