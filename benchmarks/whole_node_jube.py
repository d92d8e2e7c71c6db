#!/usr/bin/env python3
"""A JUBE workflow on a whole node, checked against an independent read of every GPU's counter (issue 43).

    python benchmarks/whole_node_jube.py --out $OUT/wn -- jube/llm_benchmark.xml
    JOULEBENCH_SWEEP_DEVICES_PER_NODE=1,4 python benchmarks/whole_node_jube.py --out $OUT/dp -- jube/llm_benchmark.xml
    CUDA_VISIBLE_DEVICES=0,1 JOULEBENCH_METER_WHOLE_NODE=yes python benchmarks/whole_node_jube.py --out ... -- XML

Runs `jube run XML -o OUT/jube -e -a -r --hide-animation [the rest after --]` while a thread of this process reads
every GPU's energy counter on its own (benchmarks.common.CounterPoller: NVML, no jpwr code). For each point with a
run record: the headline steady energy against the independent read of the job's GPUs (the record's per_device;
diff_pct in % of the read; within: inside the record's error bound plus the read's own uncertainty), and the
whole-node line (outside_job, where meter_whole_node = yes) beside the read of the host's other GPUs. Writes
whole_node.md (one table) and whole_node.json beside JUBE's run directory; exit 1 when a measured point's headline
is outside its bound.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # run as a script from a checkout

from benchmarks.common import CounterPoller, markdown_table, split_at_double_dash  # noqa: E402 (REPO on sys.path)

HEADER = ("point", "status", "devices", "steady_s", "job_j", "independent_j", "diff_pct", "bound_j", "within",
          "outside_j", "independent_others_j", "units_per_s", "units_per_wh")


def point_row(poller: CounterPoller, workdir: Path) -> dict[str, Any]:
    """One point: the record's steady energy of the job's GPUs and of the others, and the independent reads."""
    record = json.loads((workdir / "run" / "run_record.json").read_text())
    window = next((w for w in record.get("windows") or [] if w["name"] == "steady"), None)
    if window is None or not window.get("energy"):  # a point refused or failed before its steady window
        return {"point": record["run_id"], "status": record["status"], "within": "n/a: no steady window"}
    energy, metrics = window["energy"], record["metrics"]
    unit = metrics.get("work_unit", "tokens")
    ours = [d["uuid"] for d in energy["per_device"]]
    others = [u for u in poller.handles if u not in ours]
    row: dict[str, Any] = {
        "point": record["run_id"], "status": record["status"], "devices": len(ours), "steady_s": window["duration_s"],
        "job_j": energy["energy_j"], "outside_j": sum(d["energy_j"] for d in energy.get("outside_job") or []) or None,
        "units_per_s": metrics.get(f"{unit}_per_s"), "units_per_wh": metrics.get(f"{unit}_per_wh")}
    try:
        independent, uncertainty = poller.energy_j(window["t_start_ns"], window["t_end_ns"], ours)
        row["independent_others_j"] = poller.energy_j(window["t_start_ns"], window["t_end_ns"], others)[0] if (
            others) else None
    except ValueError as exc:  # the reads do not span the window (a point that failed early)
        row.update(independent_j=None, bound_j=None, within=f"n/a: {exc}")
        return row
    row.update(independent_j=independent, bound_j=(energy["error_bound_j"] or 0.0) + uncertainty,
               diff_pct=None if energy["energy_j"] is None else 100 * (energy["energy_j"] - independent) / independent)
    measured = energy["energy_j"] is not None and abs(energy["energy_j"] - independent) <= row["bound_j"]
    row["within"] = "yes" if measured else "no"
    return row


def main(argv: list[str] | None = None) -> int:
    own, rest = split_at_double_dash(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="JUBE's run directory and the table go here")
    args = parser.parse_args(own)
    if not rest:
        parser.error("give the workflow after --, e.g. -- jube/llm_benchmark.xml")
    runs = args.out / "jube"
    with CounterPoller() as poller:
        code = subprocess.call(["jube", "run", rest[0], "-o", str(runs), "-e", "-a", "-r", "--hide-animation",
                                *rest[1:]], cwd=REPO)
    rows = [point_row(poller, work) for work in sorted(runs.glob("000000/*_submit/work"))
            if (work / "run" / "run_record.json").is_file()]
    table = markdown_table(rows, HEADER)
    (args.out / "whole_node.md").write_text(f"jube run exit code {code}\n\n{table}\n")
    (args.out / "whole_node.json").write_text(json.dumps(rows, indent=1))
    print(table)
    return 0 if rows and all(r["within"] == "yes" for r in rows if r["status"] == "OK") else 1


if __name__ == "__main__":
    sys.exit(main())
