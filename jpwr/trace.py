"""public: for analysis and workflows that read a saved trace (joulebench.analysis, jube, benchmarks scripts).

A node's trace as the sampler left it (trace.h5, or its segments when it never assembled the file), the
sampler's own summary beside it, and what a reader derives from them with the meter's own code: the windows
from the marks, the devices a headline sums, a window's energy by the sampler's estimator, and an energy
counter's update knots for fits of their own. The file formats themselves are private (jpwr.trace_io).
"""

from __future__ import annotations

from jpwr.backends.replay import REPLAYED
from jpwr.domains import Domain, Signal
from jpwr.estimator import Knots, counter_segments
from jpwr.phases import PhaseBatch
from jpwr.summary import SUMMARY_FILE, NodeSummary
from jpwr.trace_io import SEGMENT_DIR, TRACE_FILE, TraceData, load_trace
from jpwr.windows import WindowSpan, accelerator_domains, headline_domains, spans_from_marks, window_energy

__all__ = [
    "REPLAYED",  # the label a replayed trace's domains and energy domain carry
    "SEGMENT_DIR",  # <node>/segments/: the same, for a sampler that never assembled its file
    "SUMMARY_FILE",  # <node>/summary.json: the sampler's own window energies
    "TRACE_FILE",  # <node>/trace.h5: how a search recognises a node directory
    "Domain",  # a metered device (GPU, CPU package, module) in a trace
    "Knots",  # one run of counter updates (counter_segments' result)
    "NodeSummary",  # a node's summary.json, typed (its windows' WindowEnergy included)
    "PhaseBatch",  # one rank's phase intervals in one window, as stored in a trace
    "Signal",  # what a sensor reads: energy counter, instant or averaged power
    "TraceData",  # what load_trace returns: domains, sensors, readings, marks, phases
    "WindowSpan",  # a window's edges on one node, from its marks
    "accelerator_domains",  # the accelerators that sum into a headline (no double count)
    "counter_segments",  # an energy counter's update knots, which an attribution fit reads
    "headline_domains",  # what a headline sums: the accelerators, else RAPL packages (+ DRAM)
    "load_trace",  # a node's trace from its directory (HDF5 or segments) or a trace file
    "spans_from_marks",  # a trace's marks -> its windows
    "window_energy",  # one window's energy from a saved trace: the sampler's own estimator
]
