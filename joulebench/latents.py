"""Latent metrics of a window: mean utilisation, clocks, memory, temperature, throttling, per run.

Drivers put them into their run record (the inference driver does today) and analysis reads
them from there, to say in words what moved with the energy of a run (joulebench.analysis.diagnose).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np

from jpwr.trace import TraceData, WindowSpan, accelerator_domains, spans_from_marks

STEADY = "steady"


def steady_latents(traces: Iterable[TraceData], span_name: str = STEADY) -> dict[str, float]:
    """Means of the latent metrics over each node's own steady span (marks), across all accelerators.

    Each node's span comes from its own marks, on its own monotonic clock, so nodes are never
    compared across clocks. Throttle reasons become the fraction of samples with any reason set.
    """
    values: dict[str, list[float]] = {}
    for trace in traces:
        span: WindowSpan | None = spans_from_marks(trace.marks).get(span_name)
        if span is None:
            continue
        accel = {d.id for d in accelerator_domains(trace.domains)}
        for m in trace.metrics:
            if m.domain_id in accel and span.t0_ns <= m.t_ns <= span.t1_ns and math.isfinite(m.value):
                name = "throttled_fraction" if m.name == "throttle_reasons" else m.name
                values.setdefault(name, []).append(float(m.value != 0) if name == "throttled_fraction" else m.value)
    return {name: float(np.mean(v)) for name, v in values.items() if v}
