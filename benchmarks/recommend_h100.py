#!/usr/bin/env python3
"""Issue 46's fronts on one GPU: per workload a sweep of one software knob, `joulebench recommend` over it
(PREDICTED), then the default and the recommended setting re-measured, and the predicted against the measured saving.

    python benchmarks/recommend_h100.py --out $OUT/rec                                   # every workload, in turn
    python benchmarks/recommend_h100.py --out $OUT/rec --workloads llama8b-bs1 --steady-seconds 15
    PYTHONPATH=tests/fakes JPWR_FAKE_NVML_TRACE=tests/data/h100_trace \
        python benchmarks/recommend_h100.py --out /tmp/rec --smoke          # CPU: tiny models, a replayed H100 trace

Each run is the driver's own command with `--energy-methods nvml` (in-process metering) and one knob value; the
first value of a workload is the driver's default (an empty value: the option left out). The static-batch workload
is re-measured by `joulebench recommend --remeasure` (the product's own re-runs); the others by this script, default
and recommendation alternating twice, read back with `recommend --remeasured`. A thread of this process reads the
GPU's NVML energy counter throughout (benchmarks.common.CounterPoller, no jpwr code): every record's steady window
is compared with that read. Writes results.md (one row per run) and results.json (the rows and each workload's
recommend JSON) after every workload; each workload's recommend lines are in <workload>.log and printed at the end.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # run as a script from a checkout

from benchmarks.common import (  # noqa: E402
    CounterPoller,
    first_gpu_uuid,
    markdown_table,
    steady_against_counter,
    write_results,
)
from joulebench.bounded_run import GRACE_S, NESTED_GRACE_S, run_bounded  # noqa: E402


@dataclass(frozen=True)
class Workload:
    command: tuple[str, ...]  # the driver's command, without the knob, the meter and the output folder
    knob: str  # the driver option swept
    values: tuple[str, ...]  # first: the driver's default ("": the option left out)
    target: tuple[str, ...]  # joulebench recommend's target options
    builtin_remeasure: bool  # recommend --remeasure re-runs it (static-batch llm_inference run)
    smoke: dict[str, str]  # word -> word for the CPU smoke run (tiny model, CPU device)


WORKLOADS = {
    # batch 1 chat: the decode variant (auto = the faster, by replayed step time) against the two pinned ones
    "llama8b-bs1": Workload(("-m", "llm_inference", "run", "--preset", "llama-8b", "--task", "chat", "--batch-size",
                             "1"), "--decode-tuning", ("auto", "default", "coordinate-descent"),
                            ("--max-slowdown", "10%"), True, {"llama-8b": "tiny", "chat": "tiny"}),
    # serving at the highest rate, p90 TPOT under the docs' 50 ms SLO: request slots (default 64)
    "llama8b-serving": Workload(("-m", "llm_inference", "load", "--preset", "llama-8b", "--task", "chat", "--rates",
                                 "max"), "--max-concurrency", ("64", "32", "128", "256"),
                                ("--max-p90-tpot-ms", "50"), False, {"llama-8b": "tiny", "chat": "tiny"}),
    # GPT-800M training: the micro-batch (default: chosen by device memory) within 5 % of the default's time
    # (the global batch held at the preset's 64, so a micro-batch changes only how the batch is computed)
    "gpt800m": Workload(("-m", "llm_training", "train", "--model", "800M", "--global-batch-size", "64"),
                        "--micro-batch-size", ("", "4", "8"),
                        ("--max-slowdown", "5%"), False, {"800M": "tiny"}),
}
SMOKE_EXTRA = {"llm_inference": ("--device", "cpu"), "llm_training": ()}


def argv_of(work: Workload, value: str, out_dir: Path, args: argparse.Namespace) -> list[str]:
    words = [work.smoke.get(w, w) for w in work.command] if args.smoke else list(work.command)
    if args.smoke:
        words += SMOKE_EXTRA[work.command[1]]
    knob = [work.knob, value] if value else []
    return [sys.executable, *words, *knob, "--energy-methods", "nvml", "--steady-seconds", str(args.steady_seconds),
            "--no-idle-baseline", "--out-dir", str(out_dir)]


def run(argv: list[str], log: Path, timeout_s: float, grace_s: float = GRACE_S) -> int | str:
    print("+", " ".join(argv), flush=True)
    with open(log, "a") as sink:
        sink.write("+ " + " ".join(argv) + "\n")
        sink.flush()
        return run_bounded(argv, timeout_s, grace_s, cwd=REPO, stdout=sink, stderr=subprocess.STDOUT)


def knob_key(work: Workload) -> str:
    return work.knob.removeprefix("--").replace("-", "_")


def default_named(work: Workload, default_dir: Path) -> list[str]:
    """`--default KNOB=VALUE` with the value the default run recorded (a knob such as the slots or a micro-batch
    chosen by memory has no default recommend knows)."""
    path = default_dir / "run_record.json"
    found = sorted(default_dir.rglob("run_record.json")) if not path.exists() else [path]
    value = json.loads(found[0].read_text()).get("config", {}).get(knob_key(work)) if found else None
    return [] if value is None else ["--default", f"{knob_key(work)}={value}"]


def recommend(records: list[Path], work: Workload, extra: list[str], json_out: Path, log: Path) -> dict[str, Any]:
    """joulebench recommend's result (its JSON), its printed lines kept in the log."""
    run([sys.executable, "-m", "joulebench", "recommend", *map(str, records), *work.target, *extra, "--json",
         str(json_out)], log, 3600, NESTED_GRACE_S)  # its re-runs are its own children: they stop first
    return json.loads(json_out.read_text()) if json_out.exists() else {}


def option_value(work: Workload, setting: dict[str, Any], default: str) -> str:
    """The knob's value as the driver option takes it ("" where the setting is the default's)."""
    value = setting.get(knob_key(work))
    return default if value is None else str(value)


def record_rows(root: Path, workload: str, poller: CounterPoller) -> list[dict[str, Any]]:
    """Every run record under `root`: its status and steady window beside the independent counter read."""
    rows = []
    for path in sorted(root.rglob("run_record.json")):
        record = json.loads(path.read_text())
        rows.append({"workload": workload, "run": str(path.parent.relative_to(root)), "status": record.get("status"),
                     **steady_against_counter(record, poller)})
    return rows


def one_workload(name: str, work: Workload, out: Path, args: argparse.Namespace) -> dict[str, Any]:
    base, log = out / name, out / f"{name}.log"
    base.mkdir(parents=True, exist_ok=True)
    labels = {v: (v or "driver-default") for v in work.values}
    started, failed_runs = time.time(), []
    for value in work.values:
        code = run(argv_of(work, value, base / "front" / labels[value], args), log, args.timeout_s)
        print(f"=== {name} front {labels[value]}: exit {code}", flush=True)
        failed_runs += [f"front {labels[value]}: exit {code}"] if code != 0 else []
    front = sorted((base / "front").rglob("run_record.json"))
    named = default_named(work, base / "front" / labels[work.values[0]])
    predicted = recommend(front, work, named, base / "predicted.json", log)
    chosen = predicted.get("recommended")
    result: dict[str, Any] = {"workload": name, "predicted": predicted, "front_s": time.time() - started,
                              "failed_runs": failed_runs}
    if not chosen or predicted.get("is_default"):
        result["remeasured"] = "nothing to re-measure: the default is recommended" if chosen else "no recommendation"
        return result
    default_value = work.values[0]
    chosen_value = option_value(work, chosen["setting"], default_value)
    if work.builtin_remeasure:
        final = recommend(front, work, [*named, "--remeasure", "--repeats", str(args.repeats), "--remeasure-dir",
                                        str(base / "remeasure")], base / "remeasured.json", log)
    else:
        for i in range(args.repeats):
            for role, value in (("default", default_value), ("recommended", chosen_value)):
                code = run(argv_of(work, value, base / "remeasure" / f"{i}-{role}", args), log, args.timeout_s)
                failed_runs += [f"re-run {i}-{role}: exit {code}"] if code != 0 else []
        again = sorted((base / "remeasure").rglob("run_record.json"))
        final = recommend(front, work, [*named, "--remeasured", *map(str, again)], base / "remeasured.json", log)
    result.update(remeasured=final, total_s=time.time() - started)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("recommend_out"))
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help=f"comma list of {', '.join(WORKLOADS)}")
    parser.add_argument("--steady-seconds", type=float, default=15.0, help="each run's steady window")
    parser.add_argument("--repeats", type=int, default=2, help="re-runs of the default and the recommendation each")
    parser.add_argument("--timeout-s", type=float, default=400.0, help="per run")
    parser.add_argument("--smoke", action="store_true", help="tiny models on the CPU (a fake NVML replays a trace)")
    args = parser.parse_args(argv)
    names = [w for w in args.workloads.split(",") if w]
    unknown = set(names) - set(WORKLOADS)
    if not names:
        parser.error(f"--workloads: name one or more of {', '.join(WORKLOADS)}")
    if unknown:
        parser.error(f"--workloads: unknown {', '.join(sorted(unknown))}; choose from {', '.join(WORKLOADS)}")
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    uuid = first_gpu_uuid()
    results, rows = [], []
    with CounterPoller([uuid]) as poller:
        for name in names:
            results.append(one_workload(name, WORKLOADS[name], out, args))
            rows += record_rows(out / name, name, poller)
            table = markdown_table(rows, ["workload", "run", "status", "steady s", "energy J", "bound %",
                                          "deviation %"], digits=4)
            write_results(out, table + "\n", {"runs": rows, "workloads": results})
    print(table)
    for name in names:
        print(f"\n--- {name}\n" + (out / f"{name}.log").read_text().split("joulebench recommend")[-1][-3000:])
    failed = [r["workload"] for r in results if r["failed_runs"] or not r["predicted"]]
    if failed:
        print(f"failed: {', '.join(failed)} (a run exited non-zero, or recommend wrote no result: see its log)")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
