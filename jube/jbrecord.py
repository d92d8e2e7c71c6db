#!/usr/bin/env python3
"""Job side of the JUBE workflows: make sure a run record exists, then flatten it for JUBE's patterns.

    jbrecord.py finalize --settings job.env --status STATUS [--reason TEXT] [--elapsed-s S] [--ranks-exit-code N]
    jbrecord.py finalize-job --settings job.env --job-id ID   # the finalizer job: the outcome from Slurm
    jbrecord.py fields RUN_RECORD [--settings job.env]          # print the JB lines only
    jbrecord.py compare --rundir RUNDIR                         # slowdown and saving against the default rows

Runs with the profile's Python (joulebench installed): at the very end of jube/job.sh (also after a failure,
at the stop budget, on scancel), in the finalizer job Slurm starts once the benchmark job ended however it
ended, and on the login node for points that never became a job (INVALID, refused by sbatch). The job's
own outcome decides the status unless the job ended normally, then the driver's record does (OK, PARTIAL,
or TIMEOUT from its own clock, also when its ranks exited 124), except that a rank that failed first makes
the row FAILED in its own words (jblog.py) unless the record says the run was measured to its end; a missing
record becomes a record of the job's status so that every sweep point gets its row. For a serving point, finalize
first has the driver's own command fit its per-request energy on the node's trace, which the samplers wrote when they
stopped (fit_after_job: `python -m llm_inference request-energy`, the job's Python). `result.txt`
holds one `JB key=value` line per table column: JUBE's patterns read that file, never the drivers' logs, so
the table shows the same numbers as run_record.json (n/a with the reason where there are none). The exit
code follows the final status (EXIT_CODES), which job.sh passes on, so Slurm's job state, the job log, the
record and the table agree.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import jbfootprint
import jblog  # same directory: on sys.path when run as a script
import jbscaling
import jbslurm
from jbsettings import JOB_ID_FILE, RESULT_FILE, SETTINGS_FILE, read_settings
from jbsystems import ConfigError
from jbtable import read_lines
from jbworkloads import BY_DRIVER, WORKLOADS, Workload

from joulebench.device_settings import Request
from joulebench.device_settings.record import RECORD_KEY, recorded_settings
from joulebench.disturbed import summary as disturbed_summary
from joulebench.figures import REJECTED, is_number, rejection
from joulebench.latents import steady_latents
from joulebench.lifecycle import fallback_paths, write_elsewhere
from joulebench.reasons import clip, short_note
from joulebench.record import (
    EXIT_CODES,
    RECORD_FILE,
    RECORD_NOT_WRITTEN,
    STATUSES,
    RunRecord,
    driver_metrics,
    headline_domain,
    read_run_record,
    write_run_record,
)
from joulebench.record_shape import checked_block
from joulebench.record_types import FootprintBlock, JobBlock, JobNode, LoadMetrics, RequestEnergyBlock, ResNetMetrics
from jpwr import JpwrError
from jpwr.energy import ACCELERATORS
from jpwr.output import fmt, write_atomic
from jpwr.trace import SUMMARY_FILE, NodeSummary, load_trace

EX_USAGE = 64  # `fields` of a record no workflow's driver wrote, without its job.env
SETTING_COORDINATES = ("power_limit", "sm_clock")  # the sweep dimensions a comparison row varies
# The table's columns that show a measured figure (beside the work-unit ones): `rejected` when the record's
# figures cannot be true (joulebench.figures).
FIGURE_KEYS = ("iterations", "time_per_iteration_s", "model_tflops_per_device", "mfu", "energy_wh",
               "mean_power_w_per_device", "energy_coverage", "energy_error_bound_j", "per_gpu", "outside_job")
# The footprint block's estimates in the full table (jbfootprint.py): rejected with the figures they derive from
FOOTPRINT_KEYS = ("g_co2e", "g_co2e_error_bound", "g_co2e_per_unit", "cost", "cost_error_bound", "cost_per_unit")
SHORT_NOTE_CHARS = 36  # the default table's Reason: the heads of the note's reasons; the full table has it in full
POINT_CHARS = 24  # the default table's Point, unless cutting there would make two rows read the same
# The default tables' Point and Reason together: their other columns (job id, system, model, the figures, status and
# the separators) take about 100 of the 160 columns; the Point grows into what the widest Reason leaves
POINT_AND_REASON_CHARS = 60
POINT_MAX_CHARS = 48  # the most it grows: the scaling table's Point beside its eleven figures' columns
REASON_TITLE = "Reason"
POINT_NAMES = {  # short names in the Point column; the other coordinates go by their own name
    "global_batch_size": "gbs", "micro_batch_size": "mbs", "tensor_parallel": "tp", "pipeline_parallel": "pp",
    "seq_length": "seq", "iterations": "iters", "warmup_iterations": "warmup", "steady_seconds": "steady_s",
    "power_limit": "pl", "sm_clock": "clock", "image_size": "px", "batch_size": "bs", "max_concurrency": "slots",
    "slo_ttft_ms": "ttft_slo", "slo_tpot_ms": "tpot_slo", "min_window_s": "window_s", "devices_per_node": "dev",
}
# A serving record (`llm_inference load`) names its latency medians p50, and its time per output token tpot; they fill
# the same columns as a static record's
SERVING_ALIASES = {"ttft_median_s": "ttft_p50_s", "per_token_latency_median_s": "tpot_p50_s",
                   "per_token_latency_p90_s": "tpot_p90_s"}
SHARES = ("prefill", "decode", "idle")  # a serving record's energy shares (record.requests["energy"]["shares"])
SHARE_KEYS = tuple(f"{part}_share" for part in SHARES)
# A serving point's per-request fit after the job (fit_after_job): the seconds before the job's time limit kept for
# the record after it, the least worth starting it with, and its time where the job names no limit
AFTER_JOB_RESERVE_S = 15
AFTER_JOB_MIN_S = 5
AFTER_JOB_UNLIMITED_S = 600


def job_id(settings: dict[str, str]) -> str | None:
    """The benchmark's Slurm job id: the job.id file submit wrote (in the finalizer job SLURM_JOB_ID is the
    finalizer's own), else the job's environment."""
    path = Path(settings.get("JB_WORKDIR", ".")) / JOB_ID_FILE
    if path.is_file():
        return path.read_text().strip()
    return os.environ.get("SLURM_JOB_ID") if settings.get("JB_LAUNCHER") == "slurm" else None


def _int_or_none(text: str | None) -> int | None:
    return int(text) if text and text.isdigit() else None


def job_facts(settings: dict[str, str], status: str, elapsed_s: float | None) -> JobBlock:
    """The record's `job`: where it ran, its time limit and stop budget, how long it took, its exit code."""
    return {
        "scheduler": settings.get("JB_LAUNCHER"), "job_id": job_id(settings),
        "time_limit_s": _int_or_none(settings.get("JB_TIME_LIMIT_S")),
        "stop_margin_s": _int_or_none(settings.get("JB_STOP_MARGIN_S")),
        "stop_budget_s": _int_or_none(settings.get("JB_STOP_BUDGET_S")),
        "elapsed_s": elapsed_s, "exit_code": EXIT_CODES[status],
        "tags": settings.get("JB_TAGS", "").split(),  # the `jube run` tags: recommend's apply line repeats them
    }


def job_devices(settings: dict[str, str]) -> list[JobNode]:
    """Per node, the accelerators its sampler metered as the job's, by UUID, and the binding that named them (Slurm's
    CUDA_VISIBLE_DEVICES, the local launcher's): on a node whose other GPUs the job can see (ConstrainDevices=no), the
    record says which were its own."""
    nodes = []
    for path in sorted((Path(settings["JB_OUT_DIR"]) / "energy").glob(f"*/{SUMMARY_FILE}")):
        try:
            summary = NodeSummary.from_dict(json.loads(path.read_text()))
        except (OSError, ValueError, KeyError, TypeError):  # a damaged summary: combine's warning says so
            continue
        nodes.append(checked_block(JobNode, {"node": summary.node, "binding": "; ".join(summary.selections()) or None,
                                             "devices": summary.job_accelerators()}, "job.devices"))
    return nodes


def allocation_warnings(settings: dict[str, str], nodes: list[JobNode]) -> list[str]:
    """A node whose sampler metered another number of accelerators than Slurm allocated to the job there."""
    if settings.get("JB_LAUNCHER") != "slurm" or settings.get("JB_GRES") != "yes":
        return []
    allocated = _int_or_none(settings.get("JB_TASKS_PER_NODE"))
    return [f"node {n['node']}: its sampler metered {len(n['devices'])} accelerator(s) but Slurm allocated {allocated} "
            f"to the job ({n['binding'] or 'no binding seen'}): the headline is not the job's devices alone"
            for n in nodes if allocated is not None and n["devices"] and len(n["devices"]) != allocated]


def ranks_outcome(settings: dict[str, str], code: int, record: RunRecord | None) -> tuple[str, str]:
    """The job's status and reason when its ranks ended on their own with exit code `code` (not 0).

    Where no rank failed (their own clean stop exits 124; rank 0 exits 74 when its record went to another file
    system, which finalize found), the driver's record decides. A rank that failed first (any other code, or a
    signal) makes the row FAILED in its own words: srun's --kill-on-bad-exit then ends the others, whose code the
    step's often is, and whose stop on that SIGTERM rank 0 may have recorded as TIMEOUT. Only a run recorded as
    measured to its end (OK, PARTIAL) keeps its status, with the failure as one of its warnings."""
    log = Path(settings["JB_WORKDIR"]) / jblog.JOB_LOG
    end = jblog.first_rank_end(log)
    if end is None or end.code == EXIT_CODES["TIMEOUT"] or (end.code == RECORD_NOT_WRITTEN and record is not None):
        if record is not None:
            return "OK", ""
        line = jblog.last_error_line(log)
        return "FAILED", (f"the ranks exited with code {code} without writing the run record"
                          + (f": {line}" if line else " (see job.err)"))
    if record is not None and record.status in ("OK", "PARTIAL"):
        record.warn(end.describe())
        return "OK", ""
    # Rank 0 writes the record: its own FAILED reason is that failure in the driver's words, with the fix where it
    # knows one (out of GPU memory), which the traceback's last line lacks
    own_words = record is not None and record.status == "FAILED" and bool(record.status_reason) and end.rank == 0
    quoted = own_words or (record is not None and end.line is not None and end.line in (record.status_reason or ""))
    return "FAILED", end.describe(with_line=not quoted)


def fit_after_job(settings: dict[str, str], status: str, elapsed_s: float | None) -> str | None:
    """A serving point's per-request energy, which needs the node's trace (its sampler writes it when it stops, after
    the driver): the driver's own command fits it on the run's files with the job's Python, within the time the job
    has left, and amends the record. Returns why it did not run or failed (for the record's warnings), else None (it
    ran, or the point has nothing to fit)."""
    workload = WORKLOADS.get(settings.get("JB_BENCHMARK", ""))
    out = Path(settings["JB_OUT_DIR"])
    if workload is None or not workload.serving_after_job or not (out / RECORD_FILE).is_file() or \
            settings.get("JB_DRIVER_COMMAND") != workload.serving_command:
        return None
    not_fitted = "per-request energy not fitted after the job"
    if status == "CANCELLED":
        return f"{not_fitted}: the job was cancelled (the time it has left is not known)"
    limit = _int_or_none(settings.get("JB_TIME_LIMIT_S"))
    seconds = AFTER_JOB_UNLIMITED_S if limit is None or elapsed_s is None else limit - elapsed_s - AFTER_JOB_RESERVE_S
    if seconds < AFTER_JOB_MIN_S:
        return f"{not_fitted}: {max(seconds, 0):.0f} s left before the job's time limit"
    command = [sys.executable, "-m", settings["JB_DRIVER"], workload.serving_after_job, "--run", str(out), "--trace",
               str(out / "energy")]
    shown = f"python -m {settings['JB_DRIVER']} {workload.serving_after_job}"
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=seconds, check=False)
    except subprocess.TimeoutExpired:
        return f"{not_fitted}: `{shown}` did not end within {seconds:.0f} s"
    except OSError as exc:
        return f"{not_fitted}: `{shown}` could not start ({exc.strerror or exc})"
    sys.stdout.write(done.stdout)  # finalize.log
    sys.stderr.write(done.stderr)
    if done.returncode:
        last = next((line for line in reversed(done.stderr.splitlines()) if line.strip()), "no output")
        return f"{not_fitted}: `{shown}` failed (exit {done.returncode}): {clip(last.strip(), 120)}"
    return None


def finalize(settings: dict[str, str], status: str, reason: str, elapsed_s: float | None = None,
             ranks_exit_code: int = 0, after_job: bool = False) -> RunRecord:
    """Merge the job's outcome into the driver's record, or write one when the driver left none. `after_job`: in
    the job, once its samplers stopped: a serving point's per-request fit runs first (fit_after_job)."""
    not_fitted = fit_after_job(settings, status, elapsed_s) if after_job else None
    path = Path(settings["JB_OUT_DIR"]) / RECORD_FILE
    fallback, record = (None, read_run_record(path)) if path.exists() else drivers_copy(settings)
    if not_fitted and record is not None:
        record.warn(not_fitted)
    if status == "OK" and ranks_exit_code:
        status, reason = ranks_outcome(settings, ranks_exit_code, record)
    if record is not None:
        if status != "OK" and record.status != status:  # the job knows what happened to it as a whole
            driver = f"{record.status}: {record.status_reason}" if record.status_reason else record.status
            record.status_reason = f"{reason} (the driver had reported {driver})"
            record.status = status
        elif status != "OK" and reason and reason not in (record.status_reason or ""):
            record.status_reason = f"{reason}; the driver: {record.status_reason}" if record.status_reason else reason
    else:
        if status == "OK":
            status, reason = "FAILED", "the driver exited without writing its run record (see job.err)"
        record = RunRecord(
            benchmark=settings["JB_DRIVER"], run_id=settings["JB_RUN_ID"], status=status, status_reason=reason,
            config={"system": settings["JB_SYSTEM"], "model": settings.get("JB_MODEL"),
                    "nodes": _int_or_none(settings.get("JB_NODES")),
                    "devices": _int_or_none(settings.get("JB_WORLD_SIZE")),
                    "train_args": settings.get("JB_TRAIN_ARGS")},
        )
    record.job = job_facts(settings, record.status, elapsed_s)
    record.job["devices"] = job_devices(settings)
    for warning in allocation_warnings(settings, record.job["devices"]):
        record.warn(warning)
    if settings.get("JB_SCALING"):  # the rule of the point's batch over its devices (docs/jube.md, "Scaling")
        record.config.update(scaling=settings["JB_SCALING"], devices=_int_or_none(settings.get("JB_WORLD_SIZE")))
    record.config[RECORD_KEY] = settings_block(settings, record)
    record.footprint = footprint(settings, record)
    try:
        write_run_record(path, record)
    except OSError as exc:  # the record goes where the driver's went; the row has it only if result.txt can be written
        copy = fallback_paths(record.run_id, path.parent)[0].name
        record.warn(f"the run record could not be written to {path} ({exc.strerror or exc}): it is {copy} in "
                    "$TMPDIR or /dev/shm, else only on jbrecord.py's stderr (finalize.log)")
        write_elsewhere(record, path, exc)
        return record
    if fallback is not None:
        try:
            fallback.unlink()  # the record is where it belongs now
        except OSError as exc:  # not ours to remove after all (a sticky /dev/shm): it is only a copy
            print(f"jbrecord.py: warning: cannot remove the driver's copy {fallback} ({exc.strerror or exc})",
                  file=sys.stderr)
    return record


def footprint(settings: dict[str, str], record: RunRecord) -> FootprintBlock:
    """Carbon and cost from the site profile the job carries; a file changed since validate costs only the block."""
    try:
        return jbfootprint.footprint_block(record, jbfootprint.from_settings(settings))
    except ConfigError as exc:
        return {"estimate": None, "unavailable_reason": f"the site profile's footprint settings: {exc}"}


def drivers_copy(settings: dict[str, str]) -> tuple[Path | None, RunRecord | None]:
    """The record a driver left on another file system when its output directory could not take it (a full disk),
    and where: only a copy of this run (the same run id, named after the same output directory) that started no
    earlier than the job was submitted (job.env written, to the second), so that a copy an earlier run of the same
    directory left behind is never taken for this one's."""
    try:
        submitted = int((Path(settings["JB_WORKDIR"]) / SETTINGS_FILE).stat().st_mtime)
    except OSError:
        submitted = None
    for path in fallback_paths(settings["JB_RUN_ID"], settings["JB_OUT_DIR"]):
        try:
            record = read_run_record(path)
            started = dt.datetime.fromisoformat(record.started_at).timestamp()
        except (OSError, JpwrError, ValueError, TypeError):  # absent, or no record of ours
            continue
        if record.run_id == settings["JB_RUN_ID"] and (submitted is None or started >= submitted):
            return path, record
    return None, None


def settings_block(settings: dict[str, str], record: RunRecord) -> dict[str, Any]:
    """The point's GPU settings: requested, what each node's guard read back and whether it restored them, and what
    the devices did in the steady window (mean SM clock from the samplers' traces, mean power from the record)."""
    text = {key: settings.get(f"JB_{key.upper()}", "") for key in ("power_limit", "sm_clock")}
    requested = Request(float(text["power_limit"]) if text["power_limit"] else None,
                        int(text["sm_clock"]) if text["sm_clock"] else None)
    out = Path(settings["JB_OUT_DIR"])
    nodes = [json.loads(p.read_text()) for p in sorted((out / "device_settings").glob("*.json"))
             if not p.name.startswith(".")]  # a hidden file is no node's (an atomic writer's temporary one)
    observed: dict[str, Any] = {"power_w_per_device": record.metrics.get("mean_power_w_per_device")}
    try:
        traces = [load_trace(d) for d in sorted((out / "energy").iterdir()) if d.is_dir()]
        clock = steady_latents(traces).get("sm_clock_hz")
        observed["sm_clock_mhz"] = None if clock is None else clock / 1e6
    except (OSError, JpwrError, ValueError, KeyError) as exc:  # a damaged trace must not cost the row
        observed.update(sm_clock_mhz=None, sm_clock_unavailable_reason=f"no trace to read it from: {exc!r}")
    return {"requested": requested.to_dict(), "route": nodes[0].get("route") if nodes else None, "nodes": nodes,
            "observed": observed}


def settings_problem(block: dict[str, Any]) -> str:
    """Requested settings that a node did not apply, or did not restore: the note must say so (the epilog's job)."""
    if not block or Request.from_dict(block.get("requested") or {}).is_empty:
        return ""
    if not block.get("nodes"):
        return "device settings were not applied"
    unrestored = [f"{n['node']}: {n.get('restore', {}).get('detail', 'no restore recorded')}" for n in block["nodes"]
                  if n.get("restore", {}).get("status") != "restored"]
    return ("device settings NOT restored on " + "; ".join(unrestored) + " (the epilog or `python -m "
            "joulebench.device_settings restore` must put them back, docs/sweeps.md)") if unrestored else ""


def finalize_job(settings: dict[str, str], slurm_job: str) -> RunRecord | None:
    """The finalizer: when the job ended without touching its done file, record what Slurm says happened."""
    if Path(settings["JB_DONE_FILE"]).exists():
        print(f"job {slurm_job} recorded its own outcome; nothing to do")
        return None
    state = jbslurm.job_state(slurm_job)
    if state is None:
        status = "FAILED"
        reason = f"Slurm no longer knows job {slurm_job}, which left no record (node lost or controller state reset)"
    else:
        status = jbslurm.STATUS_OF_STATE.get(state[0], "FAILED")
        because = f" ({state[1]})" if state[1] not in ("None", "") else ""
        reason = (f"Slurm ended job {slurm_job} as {state[0]}{because} before it could record its outcome; "
                  "recorded by its finalizer job")
    return finalize(settings, status, reason)


def _num(value: Any, digits: int = 4) -> str:
    """fmt(), but without scientific notation: large values as whole numbers (33650, not 3.365e+04), small ones as
    decimals (a carbon figure per token 0.00001234, not 1.234e-05): the tables are read by people."""
    if not is_number(value):  # None, or a value that is no number: the record's check names it in the note
        return fmt(None)
    if abs(value) >= 10**digits and math.isfinite(value):
        return f"{value:.0f}"
    if 0 < abs(value) < 1e-4:  # where %g turns to an exponent: as many decimals as `digits` significant digits need
        return f"{value:.{digits - 1 - math.floor(math.log10(abs(value)))}f}".rstrip("0")
    return fmt(value, digits)


def _first(*values: Any) -> Any:
    return next((v for v in values if v is not None and v != ""), None)


def coordinates(record: RunRecord, settings: dict[str, str]) -> dict[str, str]:
    """The sweep point of every row, whatever its status: the value asked for, else the one the driver used,
    else `default` (the driver's default; a run that never started cannot say which)."""
    names = [n for n in settings.get("JB_SWEEP", "").split(",") if n]
    return {f"coord_{name}": str(_first(settings.get(f"JB_COORD_{name.upper()}"), record.config.get(name),
                                        "default")) for name in names}


def _outcome(record: RunRecord) -> list[str]:
    """The row's own reasons: why the run is not OK or why energy or its split is missing, a headline that is not
    the accelerators' (its energy domain), a settings problem."""
    m = record.metrics
    rejected = rejection(record)
    if record.status != "OK":
        outcome = "; ".join(part for part in (record.status_reason or record.status, rejected) if part)
    elif rejected:
        outcome = rejected
    elif m.get("energy_wh") is None:
        reason = m.get("energy_unavailable_reason")
        outcome = f"energy n/a: {reason}" if reason else "energy n/a"
    else:
        outcome = ""
    settings_note = "" if record.status == "INVALID" else settings_problem(record.config.get(RECORD_KEY) or {})
    domain = headline_domain(record)
    domain_note = f"energy domain: {domain}" if domain and domain != ACCELERATORS else ""
    per_request = "" if outcome else request_energy_note(_request_energy(record))
    served = "" if record.status != "OK" or rejected else served_rate_note(record)
    return [part for part in (outcome, domain_note, settings_note, served, per_request) if part]


def served_rate_note(record: RunRecord) -> str:
    """Why a serving row's requests/s is n/a where its window was measured (a server's load included): it counts
    the counted requests that finished inside the steady window, from the load's request table."""
    m = driver_metrics(record, LoadMetrics)
    if m is None or not record.requests or m.get("requests_per_s") is not None or m.get("duration_s") is None:
        return ""
    inside, counted = m.get("requests_served_in_window"), m.get("requests_counted")
    if inside is None:
        return "requests/s n/a: the load kept no request table (arrival and finish times) to count it from"
    return (f"requests/s n/a: none of the {counted if counted is not None else 'n/a'} counted requests finished "
            f"inside the {_num(m.get('duration_s'))} s steady window")


def _request_energy(record: RunRecord) -> RequestEnergyBlock:
    """A serving record's per-request energy block ({} for any other record)."""
    return (record.requests or {}).get("energy") or RequestEnergyBlock()


def request_energy_note(energy: RequestEnergyBlock) -> str:
    """Why a serving row's J/request or shares are n/a, and the per-request model's checks that failed."""
    if energy.get("unavailable_reason"):
        return f"J/request and shares n/a: {energy['unavailable_reason']}"
    parts = [f"prefill/decode shares n/a: {energy['split_unavailable_reason']}"
             if energy.get("split_unavailable_reason") else "",
             f"J/request model checks failed: {energy['checks_failed']}"
             if energy.get("checks_failed") not in (None, "none") else ""]
    return "; ".join(part for part in parts if part)


def _note(record: RunRecord, settings: dict[str, str]) -> tuple[str, str]:
    """What a reader needs beside the numbers: the profile's note on the settings chosen, the row's own reasons,
    what disturbed the run, then every warning of the run (record.warnings: the meter's, the driver's, the job's). In
    full for the full table, and as the reasons' heads, the row's own first, for the default table."""
    own = _outcome(record)
    disturbed = [text for text in [disturbed_summary(record.disturbed)] if text]  # the status stays: said early
    warnings = [w for w in record.warnings
                if w not in disturbed and not any(w in part for part in own)]  # a PARTIAL reason may quote one
    profile = [settings["JB_NOTE"]] if settings.get("JB_NOTE") else []
    passed = ["J/request model checks: none failed"] if _request_energy(record).get("checks_failed") == "none" else []
    full = " ".join("; ".join([*profile, *own, *passed, *disturbed, *warnings]).split()) or "-"
    return full, short_note([*own, *disturbed, *profile, *warnings], SHORT_NOTE_CHARS)


def _headline(record: RunRecord, settings: dict[str, str], key: str) -> str:
    """A headline figure; for a PARTIAL run n/a, or with the profile's allow_partial = yes the figure of the time
    its energy covered, labelled (partial)."""
    if record.status != "PARTIAL":
        return _num(record.metrics.get(key))
    value = record.metrics.get(f"partial_{key}") if settings.get("JB_ALLOW_PARTIAL") == "yes" else None
    return "n/a" if value is None else f"{_num(value)} (partial)"


def table_fields(record: RunRecord, settings: dict[str, str]) -> dict[str, str]:
    """One text value per result-table column; missing numbers are n/a, never 0."""
    m, c = record.metrics, record.config
    workload = workload_of(record, settings)
    unit = m.get("work_unit") or workload.work_unit
    tp, pp, dp = c.get("tensor_parallel"), c.get("pipeline_parallel"), c.get("data_parallel")
    devices = _int_or_none(str(_first(m.get("devices"), c.get("devices"), c.get("world_size"),
                                      settings.get("JB_WORLD_SIZE"), "")))
    launcher = settings.get("JB_LAUNCHER")
    fields = {
        "job_id": _first(record.job.get("job_id"), job_id(settings), "local" if launcher == "local" else None),
        "system": settings.get("JB_SYSTEM", "n/a"),
        "devices": fmt(devices),
        "model": settings.get("JB_MODEL", "n/a"),
        **coordinates(record, settings),
        "batch_per_device": _num(_first(c.get("per_device_batch_size"),
                                        (driver_metrics(record, ResNetMetrics) or {}).get("per_device_batch_size"))),
        "tp_pp_dp": "/".join(_num(v) for v in (tp, pp, dp)) if dp is not None else f"1/1/{fmt(devices)}",
        "iterations": _num(m.get("iterations")),
        "time_per_iteration_s": _num(m.get("time_per_iteration_s")),
        f"{unit}_per_s": _num(m.get(f"{unit}_per_s")),
        f"{unit}_per_s_per_device": _num(m.get(f"{unit}_per_s_per_device")),
        "model_tflops_per_device": _num(m.get("model_tflops_per_device")),
        "mfu": _num(m.get("mfu"), 3),
        "energy_wh": _num(m.get("energy_wh")),
        "mean_power_w_per_device": _headline(record, settings, "mean_power_w_per_device"),
        f"{unit}_per_wh": _headline(record, settings, f"{unit}_per_wh"),
        "energy_method": m.get("energy_method") or "n/a",
        "energy_coverage": _num(100 * cover if is_number(cover := m.get("energy_coverage")) else cover, 4),
        "energy_error_bound_j": _num(m.get("energy_error_bound_j"), 3),
        **device_fields(record),
        **settings_fields(record),
        **footprint_fields(record),
        "status": record.status,
    }
    fields["note"], fields["short_note"] = _note(record, settings)
    own = (*workload.table_columns, *(SHARE_KEYS if workload.request_shares else ()))
    fields.update({key: _num(_first(m.get(key), m.get(SERVING_ALIASES.get(key, key))))
                   for key in workload.table_columns})
    if workload.request_shares:
        fields.update(energy_shares(record))
    if rejection(record):  # figures that cannot be true are flagged, never shown as numbers; the note says why
        fields.update(dict.fromkeys([*FIGURE_KEYS, *FOOTPRINT_KEYS, f"{unit}_per_s", f"{unit}_per_s_per_device",
                                     f"{unit}_per_wh", *own], REJECTED))
    return {key: (str(value) if value not in (None, "") else "n/a") for key, value in fields.items()}


def workload_of(record: RunRecord, settings: dict[str, str]) -> Workload:
    """The workflow a row belongs to: the job's (job.env), else the one whose driver wrote the record."""
    name = settings.get("JB_BENCHMARK")
    if name in WORKLOADS:
        return WORKLOADS[name]
    if record.benchmark in BY_DRIVER:
        return BY_DRIVER[record.benchmark]
    raise ConfigError(f"the run record's benchmark {record.benchmark!r} is none of the workflows' drivers "
                      f"({', '.join(BY_DRIVER)})", "pass the point's job.env with --settings")


def energy_shares(record: RunRecord) -> dict[str, str]:
    """A serving record's prefill/decode/idle shares of its requests' energy; n/a (never 0) where the record has none:
    static records, and per-request energy that could not be fitted (its block then holds only `unavailable_reason`),
    and the prefill and decode parts where the fit cannot split them."""
    shares = _request_energy(record).get("shares")
    shares = shares if isinstance(shares, dict) else {}
    return {f"{part}_share": _num(shares.get(part), 3) for part in SHARES}


def device_fields(record: RunRecord) -> dict[str, str]:
    """Each GPU's steady energy, mean power and utilisation ("0: 34512 J/690.2 W/98 %; 1: ..."; the node before the
    index where the devices span nodes), so that a straggling rank shows; and the whole-node line of the devices the
    job was not bound to ("2 devices 7600 J"). n/a where the record has none (no whole-node request, older records)."""
    rows = record.metrics.get("per_device") or []
    several_nodes = len({row.get("node") for row in rows}) > 1

    def gpu(row: Any) -> str:
        where = f"{row.get('node')} {fmt(row.get('index'))}" if several_nodes else fmt(row.get("index"))
        util = row.get("utilization_gpu")
        shown = f"{_num(100 * util, 3)} %" if is_number(util) else "n/a"  # no sample in the window: n/a, not "n/a %"
        return f"{where}: {_num(row.get('energy_j'))} J/{_num(row.get('mean_power_w'))} W/{shown}"

    count, outside_j = record.metrics.get("outside_job_devices"), record.metrics.get("outside_job_energy_j")
    return {"per_gpu": "; ".join(gpu(row) for row in rows) or "n/a",
            "outside_job": f"{count} devices {_num(outside_j)} J" if count else "n/a"}


def footprint_fields(record: RunRecord) -> dict[str, str]:
    """The footprint block's estimates (the full table only); n/a where the profile gave no value, or no block."""
    block = record.footprint if isinstance(record.footprint, dict) else {}
    return {**{key: _num(block.get(key)) for key in FOOTPRINT_KEYS}, "currency": block.get("currency") or "n/a"}


def settings_fields(record: RunRecord) -> dict[str, str]:
    """Read-back power limit and locked clock (every distinct value over the devices, `default` for the device's
    own settings) and the observed mean SM clock of the steady window."""
    recorded = recorded_settings(record.config)
    block = record.config.get(RECORD_KEY) or {}

    def read_back(values: tuple[float, ...], asked: float | None) -> str:
        if asked is None:
            return "default"
        return "/".join(fmt(v) for v in sorted(set(values))) or "n/a"

    return {
        "power_limit_read_back_w": read_back(recorded.power_limit_w_read_back, recorded.requested.power_limit_w),
        "locked_sm_clock_mhz": read_back(recorded.locked_sm_clock_mhz, recorded.requested.sm_clock_mhz),
        "sm_clock_mean_mhz": _num((block.get("observed") or {}).get("sm_clock_mhz")),
    }


def render(fields: dict[str, str]) -> str:
    """The JB lines: one line per value, and no commas (they become `;`: `column -s, -t` reads the full table)."""
    return "".join(f"JB {key}={' '.join(value.split()).replace(',', ';')}\n" for key, value in fields.items())


def write_result(settings: dict[str, str], record: RunRecord) -> str:
    """result.txt (atomically: JUBE may analyse at any time), then the done file JUBE waits for. Beside the columns it
    holds the status's reason, for job.sh's last line."""
    text = render({**table_fields(record, settings), "status_reason": record.status_reason or ""})
    target = Path(settings["JB_WORKDIR"]) / RESULT_FILE
    try:
        write_atomic(target, text)
    except OSError as exc:  # a full disk: JUBE must not wait for this job forever, and the job log gets the lines
        print(f"jbrecord.py: error: cannot write {target} ({exc.strerror or exc}); its lines follow on stdout",
              file=sys.stderr)
    Path(settings["JB_DONE_FILE"]).touch()
    return text


def sweep_group(settings: dict[str, str]) -> tuple[str, ...]:
    """Points that differ only in their GPU settings share a group: the system, the model, every other coordinate."""
    names = [n for n in settings.get("JB_SWEEP", "").split(",") if n and n not in SETTING_COORDINATES]
    return (settings.get("JB_SYSTEM", ""), settings.get("JB_MODEL", ""),
            *(f"{n}={settings.get('JB_COORD_' + n.upper(), '')}" for n in names))


def _percent(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:+.2f}%"


def compare(rundir: Path) -> dict[str, dict[str, str]]:
    """Per run id: slowdown and energy saving against its group's default-setting rows (power_limit and sm_clock
    empty, energy trusted), computed as `joulebench report --pareto` does; `-` where the group sweeps no setting."""
    from joulebench.analysis.tables import compare_settings

    groups: dict[tuple[str, ...], list[tuple[str, Path]]] = {}
    for env_path in sorted(rundir.glob("*_submit/work/job.env")):
        settings = read_settings(env_path)
        record_path = Path(settings["JB_OUT_DIR"]) / RECORD_FILE
        if record_path.exists():
            groups.setdefault(sweep_group(settings), []).append((settings["JB_RUN_ID"], record_path))
    rows: dict[str, dict[str, str]] = {}
    for members in groups.values():
        # from the records alone: a group that sweeps no setting needs no traces (load_runs reads every *.h5 beside a
        # record as a trace, which a serving run's requests.h5 is not)
        if all(recorded_settings(read_run_record(path).config).is_default for _, path in members):
            rows.update({run_id: {"slowdown": "-", "energy_saving": "-"} for run_id, _ in members})
            continue
        try:
            compared = compare_settings([path for _, path in members])
        except JpwrError as exc:
            rows.update({run_id: {"slowdown": "n/a", "energy_saving": "n/a", "compare_note": str(exc)}
                         for run_id, _ in members})
            continue
        for run_id, _ in members:
            point = compared.get(run_id)  # None: never measured (INVALID & co.)
            rows[run_id] = {"slowdown": _percent(point.slowdown if point else None),
                            "energy_saving": _percent(point.energy_saving if point else None)}
    return rows


def point_labels(rundir: Path) -> dict[str, str]:
    """Per run id, the swept coordinates, those in which the rundir's rows differ (`gbs=16 pl=400`), `-` where they
    all agree: the default table's Point names each row without a column per sweep dimension (the full table has
    those). By the values asked, so a point refused before it ran (INVALID) names its swept coordinates too; a
    coordinate it was not asked for it cannot resolve (its JB_COORD is empty), so that one neither makes a static
    coordinate look swept nor reads `default` beside the others' values. The coordinates with the most values lead.
    Cut at POINT_CHARS, or, where that would make rows of different points read alike, at what the widest Reason
    leaves of POINT_AND_REASON_CHARS, at most POINT_MAX_CHARS (every table stays within 160 columns)."""
    coords: dict[str, dict[str, str | None]] = {}
    reasons = [REASON_TITLE]
    for env_path in sorted(rundir.glob("*_submit/work/job.env")):
        if (env_path.parent / RESULT_FILE).is_file():
            settings = read_settings(env_path)
            refused = settings.get("JB_STATUS") == "INVALID"
            names = [n for n in settings.get("JB_SWEEP", "").split(",") if n]
            coords[settings["JB_RUN_ID"]] = {
                n: settings.get(f"JB_COORD_{n.upper()}") or (None if refused else "default") for n in names}
            reasons.append(read_lines(env_path.parent / RESULT_FILE).get("short_note", ""))
    names = list(dict.fromkeys(name for point in coords.values() for name in point))
    values = {name: {v for point in coords.values() if (v := point.get(name)) is not None} for name in names}
    swept = sorted((name for name in names if len(values[name]) > 1), key=lambda name: -len(values[name]))
    labels = {run_id: " ".join(f"{POINT_NAMES.get(name, name)}={point.get(name) or 'default'}" for name in swept)
              or "-" for run_id, point in coords.items()}
    apart = len({clip(label, POINT_CHARS) for label in labels.values()}) == len(set(labels.values()))
    room = min(POINT_MAX_CHARS, max(POINT_CHARS, POINT_AND_REASON_CHARS - max(map(len, reasons))))
    return {run_id: clip(label, POINT_CHARS if apart else room) for run_id, label in labels.items()}


def write_comparison(rundir: Path) -> Path:
    """<rundir>/compare/<run id>.txt, one `JB key=value` file per point (the compare step copies its own): the
    comparison, the point's label and its scaling efficiency (jbscaling.py)."""
    target = rundir / "compare"
    target.mkdir(exist_ok=True)
    rows = compare(rundir)
    for run_id, label in point_labels(rundir).items():
        rows.setdefault(run_id, {"slowdown": "n/a", "energy_saving": "n/a"})["point"] = label
    for run_id, scaling in jbscaling.scaling_rows(rundir).items():
        rows.setdefault(run_id, {"slowdown": "n/a", "energy_saving": "n/a", "point": "n/a"}).update(scaling)
    for run_id, fields in rows.items():
        write_atomic(target / f"{run_id}.txt", render(fields))
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="jbrecord.py", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    fin = sub.add_parser("finalize", help="finish the run record, write result.txt, touch the done file")
    fin.add_argument("--settings", required=True, type=Path)
    fin.add_argument("--status", choices=STATUSES, required=True)
    fin.add_argument("--reason", default="")
    fin.add_argument("--elapsed-s", type=float, help="seconds since the job started")
    fin.add_argument("--ranks-exit-code", type=int, default=0,
                     help="the ranks' exit code when the job did not stop them: the record decides, else job.err")
    fin.add_argument("--finished-by", help="write the job log's last line in place of a job script that could not")
    job = sub.add_parser("finalize-job", help="record a job that ended without recording itself (Slurm's view)")
    job.add_argument("--settings", required=True, type=Path)
    job.add_argument("--job-id", required=True)
    fields = sub.add_parser("fields", help="print the JB lines of a run record")
    fields.add_argument("record", type=Path)
    fields.add_argument("--settings", type=Path)
    comparison = sub.add_parser("compare", help="slowdown and energy saving of every point against its default row")
    comparison.add_argument("--rundir", required=True, type=Path)
    args = parser.parse_args(argv)
    if args.command == "compare":
        print(f"wrote {write_comparison(args.rundir)}")
        return 0
    if args.command == "fields":
        settings = read_settings(args.settings) if args.settings else {}
        try:
            sys.stdout.write(render(table_fields(read_run_record(args.record), settings)))
        except ConfigError as exc:
            print(f"jbrecord.py: error: {exc}", file=sys.stderr)
            return EX_USAGE
        return 0
    settings = read_settings(args.settings)
    if args.command == "finalize":
        record = finalize(settings, args.status, args.reason, args.elapsed_s, args.ranks_exit_code, after_job=True)
        sys.stdout.write(write_result(settings, record))
        if args.finished_by:
            say_finished(settings, record, args.finished_by)
        return EXIT_CODES[record.status]
    finished = finalize_job(settings, args.job_id)  # None: the job recorded its own outcome
    if finished is not None:
        sys.stdout.write(write_result(settings, finished))
    say_finished(settings, finished, f"jbrecord.py finalize-job after job {args.job_id} ended")
    return 0  # the finalizer job itself succeeded, whatever the benchmark job's status


def say_finished(settings: dict[str, str], record: RunRecord | None, writer: str) -> None:
    """The job log's last line, "finished: status X", where the job script could not write it (Slurm's SIGKILL
    after KillWait, a job that never started); `record`: None for the record the job wrote itself."""
    if record is None:
        path = Path(settings["JB_OUT_DIR"]) / RECORD_FILE
        if not path.exists():
            return
        record = read_run_record(path)
    jblog.write_finished_line(Path(settings["JB_WORKDIR"]) / jblog.JOB_LOG, record.status, record.status_reason,
                              writer)


if __name__ == "__main__":
    sys.exit(main())
