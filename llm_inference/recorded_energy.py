"""`python -m llm_inference request-energy --run DIR [--trace DIR]`: a load run's per-request energy, fitted after
the run from what it saved, where the run itself had no trace to fit it on.

Under an external sampler (`jpwr serve`: the node sampler of a JUBE job) the trace is written when the sampler stops,
after the driver ended, so the driver records `requests.energy` as waiting for it (serving_energy.NO_TRACE). Once
the trace is there, this command fits the rate by the driver's own code (serving_energy, the same functions and
seeds: a run fitted here gets what the driver would have recorded with that trace) from the rate's record (the
measured window's edges, the idle baseline's power), its `requests.h5` (arrivals, the engine's step log or a
server's chunk times, and the controlled-split window's step log) and the trace, and amends the record atomically
(joulebench.lifecycle) with the block, its J/request figures and its table's energy columns. A load under an external
sampler runs one rate (validation refuses more: their windows would merge), so it has no earlier rate to check
against and no joint block, as a single rate in process. A record whose block is anything else (fitted already, or
n/a for another reason) is left as it is. A JUBE job runs this after its samplers stopped (jube/jbrecord.py
finalize).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path

from joulebench.lifecycle import amend_written_record
from joulebench.record import RECORD_FILE, RunRecord, driver_metrics, read_run_record
from joulebench.record_types import LoadMetrics, RequestEnergyBlock, RequestsBlock
from joulebench.requests_table import FILE_NAME, RequestsTable, read_requests, save_requests
from jpwr import ValidationError
from llm_inference.serving_energy import (
    NO_TRACE,
    STEADY,
    RecordedRate,
    Sweep,
    attach_energy,
    client_energy,
    serving_energy,
    trace_knots,
)

JOB_TRACE = "energy"  # a JUBE job's node samplers write <run>/energy/<node>/trace.h5 (jube/job.sh)


def waits_for_trace(record: RunRecord) -> bool:
    """The driver could not fit the rate for want of a trace (and only for that: the window's energy was there)."""
    energy = (record.requests or {}).get("energy") if isinstance(record.requests, dict) else None
    return isinstance(energy, dict) and energy.get("unavailable_reason") == NO_TRACE and \
        record.window(STEADY) is not None


def _table(record: RunRecord, directory: Path) -> RequestsTable | str:
    """The rate's request table, or why there is none to fit."""
    block = record.requests or {}
    if not block.get("file"):
        return f"the per-request table was not written ({block.get('file_unavailable_reason') or 'no file named'})"
    try:
        return read_requests(directory / FILE_NAME)
    except (OSError, ValueError, KeyError) as exc:
        return f"the per-request table {directory / FILE_NAME} cannot be read: {exc}"


def _amend(table: RequestsTable | None, energy: RequestEnergyBlock, directory: Path, record: RunRecord) -> bool:
    """The block and its figures into the record, the energy columns into its table (written beside it)."""
    if table is None:
        record.requests = {**(record.requests or RequestsBlock()), "energy": energy}
        return True
    figures = attach_energy(record, table, energy)  # its two J/request keys, into a load's figures
    metrics = driver_metrics(record, LoadMetrics)
    if metrics is not None:
        metrics.update(figures)
    save_requests(directory, table, record)
    return True


def fit_rate(directory: Path, record: RunRecord, trace: Path) -> RequestEnergyBlock:
    """A waiting rate's block, fitted on the trace under `trace` and amended into its record."""
    table = _table(record, directory)
    if isinstance(table, str):
        energy: RequestEnergyBlock = {"unavailable_reason": table}
        amend_written_record(directory, partial(_amend, None, energy, directory))
        return energy
    rate = RecordedRate.of(record, table, directory)
    counter = trace_knots(trace, rate.outside_job, f"no trace under {trace} (its sampler wrote none: see its log)")
    fit = serving_energy if "kind" in table.steps else client_energy  # an engine's step log, or a client's chunks
    energy = fit(rate, counter, Sweep())
    amend_written_record(directory, partial(_amend, table, energy, directory))
    return energy


def describe(label: str, energy: RequestEnergyBlock) -> str:
    """One line per rate: its J/request quantiles, shares and failed checks, or why it has none."""
    quantiles = energy.get("energy_per_request_j")
    if energy.get("unavailable_reason") or not isinstance(quantiles, dict):
        return f"rate {label}: per-request energy n/a: {energy.get('unavailable_reason')}"

    def shown(value: float | None) -> str:
        return "n/a" if value is None else f"{value:.4g}"

    shares = "/".join(shown(v) for v in (energy.get("shares") or {}).values())
    return (f"rate {label}: J/request p50 {shown(quantiles.get('p50'))}, p90 {shown(quantiles.get('p90'))}; "
            f"prefill/decode/idle shares {shares}; checks failed: {energy.get('checks_failed')}")


def fit_run(run: Path, trace: Path | None, say: Callable[[str], None]) -> None:
    """Fit the rate recorded in `run` if it waits for its trace, on the trace under `trace` (default <run>/energy),
    saying what it got."""
    if not (run / RECORD_FILE).is_file():
        raise ValidationError(f"--run {run} holds no run record ({RECORD_FILE})",
                              "pass the --out-dir of a load metered by an external sampler (one rate)")
    record = read_run_record(run / RECORD_FILE)
    label = str(record.config.get("rate"))
    if not waits_for_trace(record):
        say(f"rate {label}: per-request energy left as the run recorded it (it waits for no trace)")
        return
    say(describe(label, fit_rate(run, record, run / JOB_TRACE if trace is None else trace)))
