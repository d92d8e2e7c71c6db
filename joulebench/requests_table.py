"""The per-request table of a load run: one HDF5 file beside the run record, like the meter's trace.

Why a file and not the record: a sweep point at a few requests per second over minutes holds thousands of
requests (and a serving engine's step log tens of thousands of steps); the record (JSON) keeps the summary and
refers to the file through its `requests` block (docs/run-record.md). Two groups:

* `requests`: one row per request (columns in REQUEST_COLUMNS; times in seconds from the load's start, energies
  in J with their 95 % interval, NaN where a value does not exist: never 0);
  Where the energy columns are NaN for every row, the attribute `energy_unavailable_reason` says why (no measured
  window, no trace, a fit refused); where only prefill_j and decode_j are, `energy_split_unavailable_reason`;
* `steps` (optional): the engine's step log (start/end on the node's monotonic clock in ns, kind, work and the
  members of each step as CSR), what the per-request energy fit reads again (`joulebench.request_energy`);
* `controlled_steps` (optional): the same for the controlled-split window a load runs once before its first rate
  (in that rate's table only), what the fit's controlled-split check reads.

Written to a temporary name and renamed, so a reader never sees half a table.
"""

from __future__ import annotations

import dataclasses
import enum
import json
from pathlib import Path
from typing import Any

import numpy as np

from joulebench.record import RunRecord
from jpwr.output import atomic_path

SCHEMA = "joulebench.requests/1"
FILE_NAME = "requests.h5"


class RequestStatus(enum.IntEnum):
    """A request's end, as the table's `status` column stores it (FAILED and TIMED_OUT: HTTP targets)."""

    DONE = 0
    UNFINISHED = 1
    NOT_ADMITTED = 2
    FAILED = 3
    TIMED_OUT = 4


class StepKind(enum.IntEnum):
    """An engine step's kind, as the step log's `kind` column stores it."""

    PREFILL = 0
    DECODE = 1


STATUSES = tuple(status.name.lower() for status in RequestStatus)  # the file's `statuses` attribute
STEP_KINDS = tuple(kind.name.lower() for kind in StepKind)
REQUEST_COLUMNS = {
    "id": "request id (arrival order)",
    "arrival_s": "arrival, seconds from the load's start",
    "admitted_s": "prefill started (NaN: never admitted)",
    "first_token_s": "first output token ready",
    "finish_s": "last output token ready (NaN: unfinished)",
    "input_tokens": "prompt tokens",
    "output_tokens": "output tokens produced",
    "tokens_from_usage": "a server's request: 1 when output_tokens is the server's `usage` count, 0 when counted from "
                         "the stream (none reported, or rejected as implausible: the record's "
                         "requests.output_token_counts says why); NaN: unfinished, or the in-process engine",
    "warmup": "1: a warm-up request (excluded from every figure)",
    "counted": "1: counted in the window's latency figures (MLPerf's rule)",
    "status": f"index into {list(STATUSES)}",
    "prefill_j": "fitted prefill energy", "prefill_j_low": "95 % interval", "prefill_j_high": "95 % interval",
    "decode_j": "fitted decode energy", "decode_j_low": "95 % interval", "decode_j_high": "95 % interval",
    "idle_j": "share of idle power over its lifetime", "idle_j_low": "95 % interval", "idle_j_high": "95 % interval",
    "work_j": "fitted energy of its work (prefill + decode; there also where the two cannot be split)",
    "work_j_low": "95 % interval", "work_j_high": "95 % interval",
    "energy_j": "its whole energy, work_j + idle_j (the record's J/request quantiles: this column's counted rows "
                "that are done)",
}


@dataclasses.dataclass(frozen=True)
class RequestsTable:
    requests: dict[str, np.ndarray]
    steps: dict[str, np.ndarray]
    attrs: dict[str, Any]
    controlled_steps: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)  # empty: none ran

    def __len__(self) -> int:
        return len(self.requests.get("id", ()))


def write_requests(path: Path, table: RequestsTable) -> Path:
    """Write atomically; every request column of REQUEST_COLUMNS must be present and of one length."""
    import h5py

    lengths = {name: len(values) for name, values in table.requests.items()}
    missing = sorted(set(REQUEST_COLUMNS) - set(table.requests))
    if missing or len(set(lengths.values())) > 1:
        raise ValueError(f"requests table: missing columns {missing} or unequal lengths {lengths}")
    with atomic_path(path) as tmp, h5py.File(tmp, "w") as h5:
        h5.attrs["schema"] = SCHEMA
        h5.attrs["statuses"] = json.dumps(list(STATUSES))
        h5.attrs["attrs"] = json.dumps(table.attrs)
        groups = {"requests": table.requests, "steps": table.steps, "controlled_steps": table.controlled_steps}
        for group_name, columns in groups.items():
            if group_name == "controlled_steps" and not columns:
                continue
            group = h5.create_group(group_name)
            for name, values in columns.items():
                compress = {"compression": "gzip", "shuffle": True} if len(values) else {}
                group.create_dataset(name, data=np.asarray(values), **compress)
    return path


def save_requests(out_dir: Path, table: RequestsTable, record: RunRecord) -> None:
    """Write the table beside the record as `FILE_NAME` and say in `record.requests["file"]` whether it is there: a
    file system that refuses it (a full disk) costs the run a warning and the table, never its figures or its
    status, as the record may still find a place (joulebench.lifecycle)."""
    path = out_dir / FILE_NAME
    block = record.requests if isinstance(record.requests, dict) else {}
    try:
        write_requests(path, table)
    except OSError as exc:
        why = f"not written: {exc.strerror or exc}"
        record.warn(f"the per-request table {path} was {why}")
        record.requests = {**block, "file": None, "file_unavailable_reason": why}
        return
    block.pop("file_unavailable_reason", None)
    record.requests = {**block, "file": FILE_NAME}


def read_requests(path: Path) -> RequestsTable:
    import h5py

    with h5py.File(path, "r") as h5:
        if h5.attrs.get("schema") != SCHEMA:
            raise ValueError(f"{path} is not a per-request table ({SCHEMA})")
        groups = {name: {column: h5[name][column][()] for column in h5[name]}
                  for name in ("requests", "steps", "controlled_steps") if name in h5}
        return RequestsTable(groups["requests"], groups["steps"], json.loads(h5.attrs["attrs"]),
                             groups.get("controlled_steps", {}))


def columns_doc() -> str:
    """The table's columns as a Markdown list (docs/run-record.md quotes it; a test keeps the two equal)."""
    return "\n".join(f"- `{name}`: {meaning}" for name, meaning in REQUEST_COLUMNS.items())
