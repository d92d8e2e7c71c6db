"""The full table of a workflow run: every column of every sweep point, one CSV file beside JUBE's tables.

Why not a JUBE table: `jube result` prints every table it writes (2.5.1 and 2.7.x alike; no attribute hides one),
and a row of every column is 500 characters and more. JUBE prints the default tables (at most 160 columns); this
file is written by the compare step, once every point has its row, from the same `JB key=value` lines JUBE's
patterns read (each point's result.txt, its compare/<run id>.txt): `<rundir>/result/<workflow>.csv`, rows in the
sweep's order (by run id); n/a for a value no file holds (JUBE printed an empty cell). A value holding a comma or a
double quote is CSV-quoted (jbrecord.render writes none with a comma).
Standard library and jpwr's atomic writer: runs in `jbprofile.py compare`, with the login node's python3.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

from jbcolumns import coordinate_columns
from jbsettings import RESULT_FILE, read_settings
from jbworkloads import WORKLOADS, Workload

from jpwr.output import write_atomic

Column = tuple[str, str]  # (title, the key of its `JB key=value` line)

HEAD: tuple[Column, ...] = (("JobID", "job_id"), ("System", "system"), ("Model", "model"), ("Point", "point"))


def training(unit: str, title: str, layout: Column) -> tuple[Column, ...]:
    """The figures of a training workflow (LLM, ResNet-50): `unit` is the record's work unit (tokens, images)."""
    return (("Devices", "devices"), ("Scaling", "scaling"), ("Efficiency vs 1 device", "scaling_efficiency"), layout,
            ("Measured iterations", "iterations"), ("Time/iteration(s)", "time_per_iteration_s"),
            (f"{title}/s", f"{unit}_per_s"), (f"{title}/s/device", f"{unit}_per_s_per_device"),
            ("Model TFLOP/s/device", "model_tflops_per_device"), ("MFU", "mfu"), ("Energy(Wh)", "energy_wh"),
            ("Power/device(W)", "mean_power_w_per_device"), (f"{title}/Wh", f"{unit}_per_wh"),
            ("Compile(s)", "compile_s"))


INFERENCE: tuple[Column, ...] = (
    ("Output tokens/s", "output_tokens_per_s"), ("Requests/s", "requests_per_s"),
    ("TTFT median(s)", "ttft_median_s"), ("TTFT p90(s)", "ttft_p90_s"),
    ("Per-token latency median(s)", "per_token_latency_median_s"),
    ("Per-token latency p90(s)", "per_token_latency_p90_s"), ("Energy(Wh)", "energy_wh"),
    ("Power/device(W)", "mean_power_w_per_device"), ("J/output token", "energy_per_output_token_j"),
    ("J/output token bound", "energy_per_output_token_error_bound_j"), ("J/request", "energy_per_request_j"),
    ("Goodput req/s", "goodput_requests_per_s"), ("J/request p50", "energy_per_request_p50_j"),
    ("J/request p90", "energy_per_request_p90_j"), ("Prefill share", "prefill_share"),
    ("Decode share", "decode_share"), ("Idle share", "idle_share"), ("Decode J/token", "decode_energy_per_token_j"),
    ("Decode J/token bound", "decode_energy_per_token_error_bound_j"), ("Output tokens/Wh", "output_tokens_per_wh"))
# Each workflow's own figures, between the sweep's coordinates and the shared tail; and the name of one work unit
FIGURES: dict[str, tuple[tuple[Column, ...], str]] = {
    "llm": (training("tokens", "Tokens", ("TP/PP/DP", "tp_pp_dp")), "token"),
    "resnet50": (training("images", "Images", ("Batch/device", "batch_per_device")), "image"),
    "inference": (INFERENCE, "output token"),
}


def tail(unit: str) -> tuple[Column, ...]:
    """How the energy was measured and what it came to: the same in every workflow, per `unit` (token, image)."""
    return (("Energy method", "energy_method"), ("Coverage %", "energy_coverage"),
            ("Error bound(J)", "energy_error_bound_j"), ("Per GPU (J/W/util)", "per_gpu"),
            ("Not in job", "outside_job"), ("gCO2e (estimate)", "g_co2e"), ("gCO2e bound", "g_co2e_error_bound"),
            (f"gCO2e/{unit}", "g_co2e_per_unit"), ("Cost (estimate)", "cost"), ("Cost bound", "cost_error_bound"),
            (f"Cost/{unit}", "cost_per_unit"), ("Currency", "currency"), ("Status", "status"), ("Note", "note"))


def columns(workload: Workload) -> list[Column]:
    """The full table's columns: the row's names, one per sweep parameter (and what a GPU setting brings), the
    workflow's figures, the energy's method and footprint, status and note."""
    figures, unit = FIGURES[workload.name]
    return [*HEAD, *coordinate_columns(list(workload.sweep_keys)), *figures, *tail(unit)]


def read_lines(path: Path) -> dict[str, str]:
    """The `JB key=value` lines of a file (the first of a key, as JUBE's patterns take it); {} where there is none."""
    fields: dict[str, str] = {}
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return fields
    for line in text.splitlines():
        key, sep, value = line.removeprefix("JB ").partition("=")
        if line.startswith("JB ") and sep:
            fields.setdefault(key, value)
    return fields


def rows(rundir: Path, keys: list[str]) -> list[list[str]]:
    """One row per sweep point (a submit work directory), sorted by run id: the values of `keys`, n/a for a value no
    file holds."""
    points: list[tuple[str, list[str]]] = []
    for env_path in rundir.glob("*_submit/work/job.env"):
        run_id = read_settings(env_path)["JB_RUN_ID"]
        fields = {**read_lines(env_path.parent / RESULT_FILE), **read_lines(rundir / "compare" / f"{run_id}.txt")}
        points.append((run_id, [fields.get(key) or "n/a" for key in keys]))
    return [row for _, row in sorted(points)]


def write_full_table(rundir: Path, benchmark: str) -> Path:
    """<rundir>/result/<benchmark>.csv, atomically (a reader never sees half a table)."""
    titles, keys = zip(*columns(WORKLOADS[benchmark]), strict=True)
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(titles)
    writer.writerows(rows(rundir, list(keys)))
    target = rundir / "result" / f"{benchmark}.csv"
    target.parent.mkdir(exist_ok=True)
    write_atomic(target, buffer.getvalue())
    return target
