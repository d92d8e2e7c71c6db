#!/usr/bin/env python3
"""Every line marked `# GPU only` in README.md and docs/, run literally from the clone's root on a GPU machine.

    python3 benchmarks/gpu_doc_lines.py --list                          # which lines run, which not and why
    python3 benchmarks/gpu_doc_lines.py --out $OUT/lines                # all that run here, in the docs' order
    python3 benchmarks/gpu_doc_lines.py --out $OUT/lines --only README.md:58,README.md:114

Each line runs as the doc shows it, from the repository root, with this interpreter for `python`, `jpwr`,
`joulebench` and `torchrun`; placeholders the doc asks the reader to fill in get this script's directories (RUN,
PROF, $OUT) or the carried megatron-core wheel (PATH). A line passes when it exits 0 and every run record it wrote
says OK with energy (a line that writes no record, such as `joulebench report`, passes on its exit code). A thread
reads every GPU's NVML energy counter throughout (benchmarks.common.CounterPoller, no jpwr code): each record's
steady window is compared with that read. Lines that depend on an earlier one (a report of a sweep) run after it.
A command that several docs show word for word (the README's quick start, again in docs/llm_training.md) runs once:
its later lines get that run's row, marked with the line that ran it.
Results are written after every line (results.json, results.md), so a run stopped midway keeps what it measured;
benchmarks/gpu_pool.py runs several of these on a multi-GPU host, a GPU and a copy of the clone each.
The CPU suite checks the selection and the exclusions (tests/benchmarks/test_gpu_doc_lines.py).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.common import CounterPoller, markdown_table, steady_against_counter, write_results  # noqa: E402
from benchmarks.doc_lines import GPU_ONLY, documented_commands, with_this_python  # noqa: E402
from joulebench.bounded_run import run_bounded  # noqa: E402

# Why a GPU line is not run by this script, by a part of the command or its comment (first match wins).
EXCLUDED: tuple[tuple[str, str], ...] = (
    ("joulebench.device_settings", "changes power limits or clocks: never on the lent GPUs (wave2 safety rules)"),
    ("--framework tensorflow", "TensorFlow's GPU wheel is too large to travel to the device: untested there"),
    ("csv:", "needs a site's file (a PDU/BMC export)"),
    ("$IMAGENET", "needs a site's file (ImageNet TFRecords)"),
    ("--nproc-per-node 4", "several GPUs: run in the whole-node issue's calls on a multi-GPU host"),
    ("--nproc 2", "several GPUs: run in the whole-node issue's calls on a multi-GPU host"),
    ("jube run", "submits to a cluster system's Slurm partition (--tag H100); the local system's JUBE line runs in "
                 "tests/jube and the whole-node calls"),
    ("the full table", "a benchmark script's full table (8-30 min): its run is the one docs/BENCHMARKS.md records "
                       "(the CPU suite runs its CPU smoke line where the doc shows one, else checks its options)"),
    ("--url http://", "needs the OpenAI-compatible server the doc starts first; benchmarks/endpoint_h100.py measures "
                      "that pair"),
)
# What a doc's placeholder stands for here: {out} is this script's --out.
PLACEHOLDERS = {"$OUT": "{out}", "RUN": "{out}/RUN", "PROF": "{out}/PROF", "PATH/": ".whl/"}
RESULT_FILES = ("run_record.json",)
RECORD_COLUMNS = ("status", "energy_wh", "steady s", "bound %", "deviation %")  # a record's row (record_row)


@dataclass(frozen=True)
class DocLine:
    where: str  # file:line
    command: str
    comment: str

    @property
    def excluded(self) -> str | None:
        """Why this script does not run the line (None: it runs)."""
        text = f"{self.command} # {self.comment}"
        return next((why for part, why in EXCLUDED if part in text), None)

    def argv(self, out: Path) -> list[str]:
        """The command as this machine runs it: placeholders filled, this interpreter for Python programs."""
        def fill(word: str) -> str:
            for placeholder, value in PLACEHOLDERS.items():
                if word.startswith(placeholder) or word == placeholder.rstrip("/"):
                    return value.format(out=out) + word[len(placeholder):]
            return word

        return with_this_python(shlex.split(self.command), fill)


def gpu_lines() -> list[DocLine]:
    return [DocLine(*c) for c in documented_commands() if GPU_ONLY in c[2]]


def _records_since(started: float, roots: list[Path]) -> list[Path]:
    """Run records written since `started` under the roots (the clone, the script's output)."""
    found = []
    for root in roots:
        for name in RESULT_FILES:
            found += [p for p in root.rglob(name) if ".git" not in p.parts and p.stat().st_mtime >= started]
    return sorted(set(found))


def record_row(path: Path, poller: CounterPoller | None) -> dict[str, Any]:
    """A record's status and headline energy, its steady window beside the independent counter read."""
    record = json.loads(path.read_text())
    metrics = record.get("metrics") or {}
    row: dict[str, Any] = {"record": str(path), "status": record.get("status"), "energy_wh": metrics.get("energy_wh"),
                           "method": metrics.get("energy_method"), **steady_against_counter(record, poller)}
    row["ok"] = row["status"] == "OK" and row["energy_wh"] is not None
    return row


def run_line(line: DocLine, out: Path, timeout_s: float, poller: CounterPoller | None) -> dict[str, Any]:
    argv = line.argv(out)
    log = out / (line.where.replace("/", "_").replace(":", "_") + ".log")
    print(f"=== {line.where}: {shlex.join(argv)}", flush=True)
    started = time.time()
    with open(log, "w") as sink:
        code = run_bounded(argv, timeout_s, cwd=REPO, stdout=sink, stderr=subprocess.STDOUT)
    wall = time.time() - started
    records = [record_row(p, poller) for p in _records_since(started, [REPO, out])]
    ok = code == 0 and all(r["ok"] for r in records)
    gpu = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    row = {"line": line.where, "exit": code, "wall s": wall, "records": len(records), "gpu": gpu,
           "result": "pass" if ok else "FAIL", "detail": records}
    print(f"=== {line.where}: exit {code} after {wall:.0f} s, {len(records)} record(s): {row['result']}", flush=True)
    print("GPULINE " + json.dumps(row, default=str), flush=True)
    return row


def same_run(line: DocLine, first: dict[str, Any]) -> dict[str, Any]:
    """The row of a line whose command ran already, word for word, under another doc line: that run's result."""
    print(f"=== {line.where}: the same command as {first['line']}: its run counts", flush=True)
    return {**first, "line": line.where, "wall s": 0.0, "same as": first["line"]}


def write_tables(rows: list[dict[str, Any]], out: Path) -> str:
    """results.json and results.md (one row per record), written whole each time (benchmarks.common.write_results):
    a stopped run keeps its lines. Returns the table."""
    flat = [{"line": r["line"], "same run as": r.get("same as", ""), "gpu": r["gpu"][:12], "result": r["result"],
             "exit": str(r["exit"]), "wall s": r["wall s"], **{k: d.get(k) for k in RECORD_COLUMNS}}
            for r in rows for d in (r["detail"] or [{}])]
    table = markdown_table(flat, ["line", "same run as", "gpu", "result", "exit", "wall s", *RECORD_COLUMNS], digits=4)
    table += f"\n\nlines: {len(rows)}, passed: {sum(r['result'] == 'pass' for r in rows)}; wall s summed (one GPU " \
             f"running them in turn): {sum(r['wall s'] for r in rows):.0f}\n"
    write_results(out, table, rows)
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("gpu_lines_out"))
    parser.add_argument("--only", default="", help="comma list of file:line (as --list prints) to run, in this order")
    parser.add_argument("--list", action="store_true", help="print each GPU line and whether it runs, then exit")
    parser.add_argument("--timeout-s", type=float, default=540.0, help="per line")
    args = parser.parse_args(argv)
    lines = gpu_lines()
    if args.list:
        first_of: dict[str, str] = {}
        for line in lines:
            state = "not run: " + line.excluded if line.excluded else "runs"
            if not line.excluded and first_of.setdefault(line.command, line.where) != line.where:
                state = f"runs once: the same command as {first_of[line.command]}"
            print(f"{line.where}: {state}\n    {line.command}")
        return 0
    wanted = [w for w in args.only.split(",") if w]
    unknown = set(wanted) - {line.where for line in lines}
    if unknown:
        parser.error(f"--only names no GPU line: {', '.join(sorted(unknown))} (see --list)")
    runnable = {line.where: line for line in lines if not line.excluded}
    chosen = [runnable[w] for w in wanted if w in runnable] if wanted else list(runnable.values())
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    ran: dict[str, dict[str, Any]] = {}  # command -> the row of the line that ran it
    with CounterPoller() as poller:
        for line in chosen:
            first = ran.get(line.command)
            rows.append(same_run(line, first) if first else run_line(line, out, args.timeout_s, poller))
            ran.setdefault(line.command, rows[-1])
            write_tables(rows, out)
    print(write_tables(rows, out))
    return 0 if all(r["result"] == "pass" for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
