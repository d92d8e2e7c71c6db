#!/usr/bin/env python3
"""Job side of the JUBE workflows: make sure a run record exists, then flatten it for JUBE's patterns.

    jbrecord.py finalize --settings job.env --status OK|FAILED|TIMEOUT [--reason TEXT]
    jbrecord.py fields RUN_RECORD [--settings job.env]     # print the JB lines only

Runs with the profile's Python (joulebench installed), at the very end of jube/job.sh, also after a
failure or at the time limit. The driver's own run record is kept; the job's status can only make
it worse (a job killed after the driver wrote "OK" is not OK), and a missing record becomes a
FAILED/TIMEOUT record so that the configuration still gets its row. `result.txt` holds one
`JB key=value` line per table column: JUBE's patterns read that file, never the drivers' logs, so
the table shows the same numbers as run_record.json (n/a with the reason where there are none).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from jbprofile import read_settings  # same directory: on sys.path when run as a script

from joulebench.record import STATUSES, RunRecord, read_run_record, write_run_record
from jpwr.output import fmt

RECORD_FILE = "run_record.json"
RESULT_FILE = "result.txt"
SEVERITY = {"OK": 0, "TIMEOUT": 1, "FAILED": 2}
SHORT_NOTE_CHARS = 90  # the pretty table's note; the CSV table has it in full
# llm_inference's own columns (docs/llm_inference.md), after the shared ones
INFERENCE_KEYS = ("requests_per_s", "energy_per_output_token_j", "energy_per_output_token_error_bound_j",
                  "energy_per_request_j", "decode_energy_per_token_j", "decode_energy_per_token_error_bound_j",
                  "ttft_median_s", "ttft_p90_s", "per_token_latency_median_s", "per_token_latency_p90_s")


def finalize(settings: dict[str, str], status: str, reason: str) -> RunRecord:
    """Merge the job's outcome into the driver's record, or write one when the driver left none."""
    path = Path(settings["JB_OUT_DIR"]) / RECORD_FILE
    if path.exists():
        record = read_run_record(path)
        if SEVERITY[status] > SEVERITY[record.status]:
            record.status_reason = f"{reason} (the driver had reported {record.status})"
            record.status = status
            write_run_record(path, record)
        return record
    if status == "OK":
        status, reason = "FAILED", "the driver exited without writing its run record (see job.err)"
    record = RunRecord(
        benchmark=settings["JB_DRIVER"], run_id=settings["JB_RUN_ID"], status=status, status_reason=reason,
        config={"system": settings["JB_SYSTEM"], "nodes": int(settings["JB_NODES"]),
                "devices": int(settings["JB_WORLD_SIZE"]), "train_args": settings["JB_TRAIN_ARGS"]},
    )
    write_run_record(path, record)
    return record


def _num(value: Any, digits: int = 4) -> str:
    """fmt(), but large values as whole numbers (33650, not 3.365e+04): the tables are read by people."""
    if isinstance(value, int | float) and abs(value) >= 10**digits:
        return f"{value:.0f}"
    return fmt(value, digits)


def _first(*values: Any) -> Any:
    return next((v for v in values if v is not None and v != ""), None)


def table_fields(record: RunRecord, settings: dict[str, str]) -> dict[str, str]:
    """One text value per result-table column; missing numbers are n/a, never 0."""
    m, c = record.metrics, record.config
    unit = m.get("work_unit") or ("images" if settings.get("JB_BENCHMARK") == "resnet50" else "tokens")
    tp, pp, dp = c.get("tensor_parallel"), c.get("pipeline_parallel"), c.get("data_parallel")
    devices = _first(m.get("devices"), c.get("devices"), c.get("world_size"), settings.get("JB_WORLD_SIZE"))
    energy_reason = m.get("energy_unavailable_reason")
    if record.status != "OK":
        note = record.status_reason or record.status
    else:
        note = f"energy n/a: {energy_reason}" if m.get("energy_wh") is None else "-"
    fields = {
        "job_id": os.environ.get("SLURM_JOB_ID") or ("local" if settings.get("JB_LAUNCHER") == "local" else "n/a"),
        "system": settings.get("JB_SYSTEM", "n/a"),
        "nodes": settings.get("JB_NODES", "n/a"),
        "devices": fmt(devices if devices is None else int(devices)),
        "model": settings.get("JB_MODEL", "n/a"),
        "gbs": fmt(_first(c.get("global_batch_size"), m.get("global_batch_size"))),
        "mbs": fmt(_first(c.get("micro_batch_size"), c.get("per_device_batch_size"), m.get("per_device_batch_size"))),
        "tp_pp_dp": "/".join(fmt(v) for v in (tp, pp, dp)) if dp is not None else f"1/1/{fmt(devices)}",
        "iterations": _num(m.get("iterations")),
        "time_per_iteration_s": _num(m.get("time_per_iteration_s")),
        f"{unit}_per_s": _num(m.get(f"{unit}_per_s")),
        f"{unit}_per_s_per_device": _num(m.get(f"{unit}_per_s_per_device")),
        "model_tflops_per_device": _num(m.get("model_tflops_per_device")),
        "mfu": _num(m.get("mfu"), 3),
        "energy_wh": _num(m.get("energy_wh")),
        "mean_power_w_per_device": _num(m.get("mean_power_w_per_device")),
        f"{unit}_per_wh": _num(m.get(f"{unit}_per_wh")),
        "energy_method": m.get("energy_method") or "n/a",
        "energy_coverage": _num(m.get("energy_coverage"), 3),
        "energy_error_bound_j": _num(m.get("energy_error_bound_j"), 3),
        "status": record.status,
        "note": " ".join(str(note).split()),
    }
    if record.benchmark == "llm_inference":
        fields["task"] = str(c.get("task") or "n/a")
        fields.update({key: _num(m.get(key)) for key in INFERENCE_KEYS})
    fields["short_note"] = _shorten(fields["note"], SHORT_NOTE_CHARS)
    return {key: (value if value else "n/a") for key, value in fields.items()}


def _shorten(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3].rstrip() + "..."


def render(fields: dict[str, str]) -> str:
    return "".join(f"JB {key}={value}\n" for key, value in fields.items())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="jbrecord.py", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    fin = sub.add_parser("finalize", help="finish the run record, write result.txt, touch the done file")
    fin.add_argument("--settings", required=True, type=Path)
    fin.add_argument("--status", choices=STATUSES, required=True)
    fin.add_argument("--reason", default="")
    fields = sub.add_parser("fields", help="print the JB lines of a run record")
    fields.add_argument("record", type=Path)
    fields.add_argument("--settings", type=Path)
    args = parser.parse_args(argv)
    if args.command == "finalize":
        settings = read_settings(args.settings)
        record = finalize(settings, args.status, args.reason or "")
        text = render(table_fields(record, settings))
        (Path(settings["JB_WORKDIR"]) / RESULT_FILE).write_text(text)
        Path(settings["JB_DONE_FILE"]).touch()  # JUBE's done_file: the row can be analysed now
        sys.stdout.write(text)
        return 0
    settings = read_settings(args.settings) if args.settings else {}
    sys.stdout.write(render(table_fields(read_run_record(args.record), settings)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
