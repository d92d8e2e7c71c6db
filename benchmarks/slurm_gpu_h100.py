#!/usr/bin/env python3
"""The JUBE workflows through real Slurm on one GPU machine, Slurm's states on the GPU, each steady window against an
independent read of the counter (issue 56).

    python3 benchmarks/slurm_gpu_h100.py --out $OUT/slurm --debs .carry/slurm-debs --parts pair,timeout,oom
    python3 benchmarks/slurm_gpu_h100.py --out $OUT/slurm --debs .carry/slurm-debs --parts resnet
    python3 benchmarks/slurm_gpu_h100.py --out $OUT/slurm --debs .carry/slurm-debs --parts inference

Starts `jube/slurm-local.sh start --shape gpu` (Debian 12's Slurm unpacked from --debs where this machine has no
Slurm: JOULEBENCH_SLURM_PREFIX), runs each part's `jube run ... --tag SLURMGPU` with driver defaults, stops the
cluster, and writes results.md and results.json after every part (a run stopped midway keeps what it measured). A
thread of this process reads every GPU's NVML energy counter and running processes throughout (no jpwr code): each
record's steady window against that read (benchmarks.common.CounterPoller), and which processes held the GPU when.

Parts (each a few minutes on an H100; a call of the device tool runs at most 10):
- pair: two GPT-800M jobs asking for the one GPU; the first (endless iterations) is cancelled with `scancel` once its
  steady window runs: CANCELLED row; the second waited (PENDING, reason Resources) and starts within seconds, its
  windows holding none of the first's processes; its row is the GPT-800M defaults' OK row;
- timeout: GPT-800M with endless iterations under a 3-minute limit: the stop budget ends it inside its steady window
  (TIMEOUT row, the steady window of the iterations completed and the trace kept);
- oom: a co-tenant process (not Slurm's) holds all but 3 GiB of the GPU; GPT-800M, which validate passed, runs out of
  memory: FAILED row naming it and the fix, the record kept;
- resnet: ResNet-50 (torchvision, compiled: its cold compile counts in the warm-up window);
- inference: llama-8b static batch 8 and serving at rate max (JOULEBENCH_SWEEP_RATE=,max), then the same serving point
  in-process (`llm_inference load ... --energy-methods nvml`): the JUBE row's per-request figures beside it.
Exit status 1 when a part's rows are not what it expects or a steady window misses the independent read by more than
0.5 %.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import shlex
import subprocess
import sys
import tarfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # run as a script from a checkout
sys.path.insert(0, str(REPO / "jube"))  # the job settings' reader

from jbsettings import read_settings  # noqa: E402

from benchmarks.common import (  # noqa: E402
    CounterPoller,
    Poller,
    exit_status,
    markdown_table,
    steady_against_counter,
    write_results,
)

TAG = "SLURMGPU"
XML = {"llm": REPO / "jube" / "llm_benchmark.xml", "resnet50": REPO / "jube" / "resnet50_benchmark.xml",
       "inference": REPO / "jube" / "inference_benchmark.xml"}
ENDLESS = {"JOULEBENCH_SWEEP_ITERATIONS": "1000000"}  # the steady window never ends on its own
# Seconds each part takes on an H100 at most (a part that would end past --deadline-s is skipped, saying so)
PART_SECONDS = {"pair": 330, "timeout": 210, "oom": 100, "resnet": 480, "inference": 480}
TARGET_PCT = 0.5  # the Done-when's bound on a steady window against the independent read
HEADER = ("part", "point", "job", "status", "units/s", "units/Wh", "steady s", "energy J", "bound %", "deviation %",
          "check", "note")


# ---- Slurm on this machine ----------------------------------------------------------------------------------------
def unpack_debs(debs: Path, root: Path) -> None:
    """Each .deb's data.tar under `root` (an `ar` archive: 8-byte magic, then 60-byte member headers), no dpkg."""
    for deb in sorted(debs.glob("*.deb")):
        with deb.open("rb") as handle:
            if handle.read(8) != b"!<arch>\n":
                raise SystemExit(f"{deb} is not a Debian package (no ar magic)")
            while header := handle.read(60):
                name, size = header[:16].decode().strip().rstrip("/"), int(header[48:58])
                member = handle.read(size)
                handle.read(size % 2)  # members are 2-byte aligned
                if name.startswith("data.tar"):
                    with tarfile.open(fileobj=io.BytesIO(member), mode="r:*") as tar:
                        tar.extractall(root, filter="fully_trusted")  # Debian's own packages, links included


def exported(lines: str, env: dict[str, str]) -> dict[str, str]:
    """The `export NAME=value` lines slurm-local.sh prints, applied to `env` ($NAME inside expanded from it)."""
    result = dict(env)
    for line in lines.splitlines():
        if line.startswith("export ") and "=" in line:
            name, value = line[len("export "):].split("=", 1)
            result[name] = value.replace(f"${name}", env.get(name, ""))
    return result


def cluster(action: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["sh", str(REPO / "jube" / "slurm-local.sh"), action, "--shape", "gpu"], env=env,
                          capture_output=True, text=True, timeout=180)


# ---- independent reads: the counter, and who holds the GPU --------------------------------------------------------
class ProcessPoller(Poller):
    """NVML's compute processes of every GPU every 0.2 s, stamped with CLOCK_MONOTONIC: which run held the GPU when."""

    def __init__(self) -> None:
        import pynvml

        super().__init__("gpu-processes", 0.2)
        self._nv = pynvml
        pynvml.nvmlInit()
        self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        self.samples: list[tuple[int, frozenset[int]]] = []

    def read_once(self) -> None:
        try:
            pids = {p.pid for h in self._handles for p in self._nv.nvmlDeviceGetComputeRunningProcesses(h)}
        except self._nv.NVMLError:  # a read that fails leaves a gap, not a sample of no process
            return
        self.samples.append((time.monotonic_ns(), frozenset(pids)))

    def pids_between(self, t0_ns: float, t1_ns: float) -> set[int]:
        return {pid for t, pids in self.samples if t0_ns <= t <= t1_ns for pid in pids}


# ---- JUBE ---------------------------------------------------------------------------------------------------------
def jube(args: list[str], outpath: Path, env: dict[str, str], timeout_s: float) -> subprocess.CompletedProcess[str]:
    """One JUBE command; its output appended to <outpath>.jube.log beside the run directory."""
    done = subprocess.run(["jube", *args], env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout_s)
    with outpath.with_suffix(".jube.log").open("a") as log:
        log.write(f"$ jube {shlex.join(args)}\n{done.stdout}{done.stderr}exit code {done.returncode}\n")
    return done


def jube_run(workflow: str, tags: list[str], outpath: Path, env: dict[str, str], timeout_s: float = 560
             ) -> subprocess.CompletedProcess[str]:
    return jube(["run", str(XML[workflow]), "-o", str(outpath), "--hide-animation", "-a", "-r", "--tag", TAG, *tags],
                outpath, env, timeout_s)


def workdirs(outpath: Path) -> list[Path]:
    return sorted(outpath.glob("000000/*_submit/work"))


def wait_for(check: Callable[[], bool], timeout_s: float, what: str) -> float:
    """Poll `check` every 0.1 s; the seconds it took. TimeoutError naming `what` after `timeout_s`."""
    start = time.monotonic()
    while not check():
        if time.monotonic() - start > timeout_s:
            raise TimeoutError(f"{what} did not happen within {timeout_s} s")
        time.sleep(0.1)
    return time.monotonic() - start


def table_rows(outpath: Path, workflow: str) -> list[dict[str, str]]:
    path = outpath / "000000" / "result" / f"{workflow}.csv"
    if not path.is_file():
        return []
    with path.open() as handle:
        return list(csv.DictReader(handle))


def record_of(workdir: Path) -> dict[str, Any] | None:
    path = workdir / "run" / "run_record.json"
    return json.loads(path.read_text()) if path.is_file() else None


def squeue(job: str, env: dict[str, str]) -> str:
    return subprocess.run(["squeue", "-h", "-j", job, "-o", "%T %r"], env=env, capture_output=True,
                          text=True).stdout.strip()


# ---- one row per point --------------------------------------------------------------------------------------------
def point_rows(part: str, outpath: Path, workflow: str, poller: CounterPoller, check: Callable[[dict[str, Any]], str]
               ) -> list[dict[str, Any]]:
    """Each point of a JUBE run: its table row's figures, its record's steady window against the independent read,
    and the part's own check of its record ("ok", or what is wrong)."""
    rows = []
    table = {row["JobID"]: row for row in table_rows(outpath, workflow)}
    for workdir in workdirs(outpath):
        record = record_of(workdir)
        job = (workdir / "job.id").read_text().strip() if (workdir / "job.id").is_file() else "-"
        row: dict[str, Any] = {"part": part, "point": workdir.parent.name.split("_")[0], "job": job}
        if record is None:
            rows.append({**row, "status": "no record", "check": "no run record"})
            continue
        metrics = record.get("metrics") or {}
        unit = metrics.get("work_unit") or "tokens"
        shown = table.get(job, {})
        row.update(status=record["status"], note=(shown.get("Note") or record.get("status_reason") or "")[:300],
                   **{"units/s": metrics.get(f"{unit}_per_s"), "units/Wh": metrics.get(f"{unit}_per_wh")})
        row.update(steady_against_counter(record, poller))
        row["check"] = check(record)
        row["record"] = str(workdir.relative_to(outpath.parent))
        rows.append(row)
    return rows


def within_target(row: dict[str, Any]) -> bool:
    deviation = row.get("deviation %")
    return isinstance(deviation, float) and abs(deviation) <= TARGET_PCT


def expect_ok(record: dict[str, Any]) -> str:
    return "ok" if record["status"] == "OK" else f"expected OK, got {record['status']}: {record.get('status_reason')}"


# ---- the parts ----------------------------------------------------------------------------------------------------
class Parts:
    """The parts of the run, sharing the cluster's environment, the output folder and the two pollers."""

    def __init__(self, out: Path, env: dict[str, str], counter: CounterPoller, processes: ProcessPoller,
                 llm_model: str, inference_model: str) -> None:
        self.out, self.env, self.counter, self.processes = out, env, counter, processes
        self.llm, self.inference_model = llm_model, inference_model
        self.facts: dict[str, Any] = {}

    def pair(self) -> list[dict[str, Any]]:
        """Two jobs for the one GPU; the first cancelled mid-run, the second starting once it is gone."""
        first, second = self.out / "pair-cancelled", self.out / "pair-gpt"
        jube_run("llm", [self.llm], first, {**self.env, **ENDLESS})
        jube_run("llm", [self.llm], second, self.env)
        (a_dir,), (b_dir,) = workdirs(first), workdirs(second)
        a_job, b_job = (a_dir / "job.id").read_text().strip(), (b_dir / "job.id").read_text().strip()
        wait_for(lambda: "] steady window:" in _text(a_dir / "job.out"), 400, f"job {a_job}'s steady window")
        time.sleep(10.0)  # mid-run: inside the steady window
        waiting = squeue(b_job, self.env)
        cancel_ns = time.monotonic_ns()
        subprocess.run(["scancel", a_job], env=self.env, check=True)
        start_s = wait_for(lambda: squeue(b_job, self.env).startswith("RUNNING"), 120, f"job {b_job} to start")
        a_gone_s = wait_for(lambda: not squeue(a_job, self.env), 120, f"job {a_job} to leave the queue")
        wait_for(lambda: (a_dir / "job.done").exists() and (b_dir / "job.done").exists(), 560, "both jobs' done files")
        for outpath in (first, second):
            jube(["continue", str(outpath), "-a", "-r", "--hide-animation"], outpath, self.env, 120)
        a_pids = self.processes.pids_between(0, cancel_ns)
        b_record = record_of(b_dir) or {}
        b_start_ns = min((w["t_start_ns"] for w in b_record.get("windows") or []), default=None)
        overlap = sorted(a_pids & self.processes.pids_between(b_start_ns, time.monotonic_ns())) if b_start_ns else []
        shown = {job: _job_times(job, self.env) for job in (a_job, b_job)}
        self.facts["pair"] = {"slurm_start_end": shown, "second_job_while_first_ran": waiting,
                              "second_started_after_scancel_s": start_s,
                              "first_left_queue_after_scancel_s": a_gone_s, "first_job_gpu_pids": sorted(a_pids),
                              "first_job_pids_in_second_windows": overlap}

        def first_cancelled(record: dict[str, Any]) -> str:
            return "ok" if record["status"] == "CANCELLED" else f"expected CANCELLED, got {record['status']}"

        def second_waited(record: dict[str, Any]) -> str:
            problems = [expect_ok(record)] if record["status"] != "OK" else []
            if not waiting.startswith("PENDING"):
                problems.append(f"it did not wait while the first ran (squeue: {waiting!r})")
            if start_s > 10:
                problems.append(f"it started {start_s:.1f} s after the scancel (limit 10 s)")
            if overlap or b_start_ns is None:
                problems.append(f"the first job's GPU processes {overlap} were alive in its windows")
            return "; ".join(problems) or f"ok (waited: {waiting}; started {start_s:.1f} s after the scancel)"

        return [*point_rows("pair: cancelled", first, "llm", self.counter, first_cancelled),
                *point_rows("pair: queued GPT", second, "llm", self.counter, second_waited)]

    def timeout(self) -> list[dict[str, Any]]:
        outpath = self.out / "timeout"
        jube_run("llm", [self.llm, "wait"], outpath, {**self.env, **ENDLESS, f"JOULEBENCH_{TAG}_TIME_LIMIT": "0:03:00"})

        def timed_out(record: dict[str, Any]) -> str:
            steady = next((w for w in record.get("windows") or [] if w["name"] == "steady"), None)
            traces = list((Path(record["config"].get("out_dir") or ".") / "energy").glob("*/trace.h5"))
            problems = [] if record["status"] == "TIMEOUT" else [f"expected TIMEOUT, got {record['status']}"]
            if steady is None or not (steady.get("energy") or {}).get("energy_j"):
                problems.append("no steady window with energy")
            if not traces:
                problems.append("no trace.h5 kept")
            return "; ".join(problems) or "ok"

        return point_rows("timeout", outpath, "llm", self.counter, timed_out)

    def oom(self) -> list[dict[str, Any]]:
        outpath = self.out / "oom"
        holder = subprocess.Popen(
            [sys.executable, "-c", "import time, torch; free, _ = torch.cuda.mem_get_info(); "
             "x = torch.empty(free - 3 * 2**30, dtype=torch.uint8, device='cuda'); print('holding', flush=True); "
             "time.sleep(3600)"], stdout=subprocess.PIPE, text=True)
        try:
            assert holder.stdout is not None
            holder.stdout.readline()
            jube_run("llm", [self.llm, "wait"], outpath, self.env)
        finally:
            holder.kill()
            holder.wait()

        def out_of_memory(record: dict[str, Any]) -> str:
            reason = record.get("status_reason") or ""
            if record["status"] != "FAILED":
                return f"expected FAILED, got {record['status']}"
            return "ok" if "out of GPU memory" in reason and "Fix:" in reason else f"reason names no OOM/fix: {reason}"

        return point_rows("oom beside a co-tenant", outpath, "llm", self.counter, out_of_memory)

    def resnet(self) -> list[dict[str, Any]]:
        outpath = self.out / "resnet"
        jube_run("resnet50", ["pytorch", "wait"], outpath, self.env)
        rows = point_rows("resnet50 (cold compile)", outpath, "resnet50", self.counter, expect_ok)
        for row, workdir in zip(rows, workdirs(outpath), strict=False):
            windows = (record_of(workdir) or {}).get("windows") or []
            warmup: dict[str, Any] = next((w for w in windows if w["name"] == "warmup"), {})
            row["note"] = f"warm-up window (compile) {warmup.get('duration_s')} s; {row.get('note', '')}"
        return rows

    def inference(self) -> list[dict[str, Any]]:
        outpath = self.out / "inference"
        jube_run("inference", [self.inference_model, "wait"], outpath, {**self.env, "JOULEBENCH_SWEEP_RATE": ",max"})
        rows = point_rows("inference", outpath, "inference", self.counter, expect_ok)
        serving = [w for w in workdirs(outpath) if "--rate" in read_settings(w / "job.env").get("JB_TRAIN_ARGS", "")]
        if serving:
            rows.append(self._in_process(serving[0]))
        return rows

    def _in_process(self, workdir: Path) -> dict[str, Any]:
        """The JUBE serving point's own driver options, run in-process with its own meter: the per-request figures
        of both side by side."""
        settings = read_settings(workdir / "job.env")
        out_dir = self.out / "inference-in-process"
        subprocess.run([sys.executable, "-m", settings["JB_DRIVER"], settings.get("JB_DRIVER_COMMAND") or "load",
                        *shlex.split(settings["JB_TRAIN_ARGS"]), "--energy-methods", "nvml", "--out-dir", str(out_dir)],
                       env=self.env, cwd=REPO, timeout=400)
        jube_side = ((record_of(workdir) or {}).get("requests") or {}).get("energy") or {}
        saved = out_dir / "run_record.json"
        record: dict[str, Any] = json.loads(saved.read_text()) if saved.is_file() else {"status": "no record"}
        own = (record.get("requests") or {}).get("energy") or {}
        quantiles = {side: request_quantiles(path) for side, path in
                     (("jube", workdir / "run" / "requests.h5"), ("in_process", out_dir / "requests.h5"))}
        agree = quantiles_agree(quantiles["jube"], quantiles["in_process"])
        self.facts["per_request"] = {"jube": _per_request(jube_side), "in_process": _per_request(own),
                                     "quantiles_low_value_high_j": quantiles, "agree": agree}
        row: dict[str, Any] = {"part": "inference: same serving point in-process", "point": "load", "job": "-",
                               "status": record["status"],
                               "check": "ok (J/request p50 and p90 agree)" if all(agree.values()) else
                               f"J/request of JUBE and in-process disagree: {agree}"}
        row.update(steady_against_counter(record, self.counter))
        return row


def request_quantiles(path: Path) -> dict[str, list[float]]:
    """J/request p50 and p90 of a requests table's counted, finished requests, each as [low, value, high]: the
    quantile of the requests' 95 % lower bounds, of their energies, of their upper bounds (work and idle parts)."""
    import h5py
    import numpy as np

    with h5py.File(path, "r") as handle:
        table = {name: handle["requests"][name][()] for name in handle["requests"]}
    chosen = table["counted"].astype(bool) & np.isfinite(table["finish_s"]) & np.isfinite(table["energy_j"])
    low = (table["work_j_low"] + table["idle_j_low"])[chosen]
    high = (table["work_j_high"] + table["idle_j_high"])[chosen]
    return {f"p{int(q * 100)}": [float(np.quantile(values, q)) for values in (low, table["energy_j"][chosen], high)]
            for q in (0.5, 0.9)}


def quantiles_agree(first: dict[str, list[float]], second: dict[str, list[float]]) -> dict[str, bool]:
    """Per quantile: the two runs' values lie within their combined 95 % intervals (the difference at most the sum of
    the two half-widths)."""
    return {q: abs(first[q][1] - second[q][1]) <= (first[q][2] - first[q][0]) / 2 + (second[q][2] - second[q][0]) / 2
            for q in first}


def _job_times(job: str, env: dict[str, str]) -> str:
    """Slurm's StartTime and EndTime of a job while the controller knows it (MinJobAge, 300 s)."""
    shown = subprocess.run(["scontrol", "show", "job", "-o", job], env=env, capture_output=True, text=True).stdout
    fields = dict(item.split("=", 1) for item in shown.split() if "=" in item)
    return f"{fields.get('JobState')} {fields.get('StartTime')} - {fields.get('EndTime')}"


def _per_request(block: dict[str, Any]) -> dict[str, Any]:
    keys = ("energy_per_request_j", "shares", "checks_failed", "unavailable_reason", "requests")
    return {key: block.get(key) for key in keys if key in block}


def _text(path: Path) -> str:
    return path.read_text(errors="replace") if path.is_file() else ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="JUBE run directories, results.md and results.json")
    parser.add_argument("--debs", type=Path, help="Debian 12's slurmctld, slurmd, slurm-client, munge and libraries "
                                                  "(.deb files): the cluster runs from them, unpacked (not installed)")
    parser.add_argument("--llm-model", default="800M", help="the LLM workflow's model tag (tiny: a CPU rehearsal)")
    parser.add_argument("--inference-model", default="llama-8b", help="the inference workflow's model tag")
    parser.add_argument("--parts", default=",".join(PART_SECONDS),
                        help=f"comma list of {', '.join(PART_SECONDS)} (in the order given)")
    parser.add_argument("--deadline-s", type=float, default=3600.0,
                        help="skip a part that would end past this many seconds after the start (PART_SECONDS)")
    args = parser.parse_args(argv)
    script_start = time.monotonic()
    names = [p for p in args.parts.split(",") if p]
    unknown = [p for p in names if p not in PART_SECONDS]
    if unknown:
        parser.error(f"unknown part(s) {', '.join(unknown)}")
    args.out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)}
    if args.debs:
        root = Path("/tmp/jb-slurm-root")
        unpack_debs(args.debs, root)
        env["JOULEBENCH_SLURM_PREFIX"] = str(root)
    started = cluster("start", env)
    print(started.stderr, end="", flush=True)
    if started.returncode != 0:
        for log in sorted(Path("/tmp/joulebench-slurm-gpu/log").glob("*.log")):
            print(f"--- {log}\n{log.read_text()[-3000:]}")
        cluster("stop", env)
        return 1
    env = exported(started.stdout, env)
    rows: list[dict[str, Any]] = []
    try:
        with CounterPoller() as counter, ProcessPoller() as processes:
            parts = Parts(args.out, env, counter, processes, args.llm_model, args.inference_model)
            for name in names:
                begun = time.monotonic()
                if begun - script_start + PART_SECONDS[name] > args.deadline_s:
                    rows.append({"part": name, "status": "skipped", "check": f"would end past --deadline-s "
                                 f"{args.deadline_s:.0f} (it takes up to {PART_SECONDS[name]} s)"})
                    continue
                try:
                    rows += getattr(parts, name)()
                except Exception as exc:  # one part's failure must not cost the others their rows
                    traceback.print_exc()
                    rows.append({"part": name, "status": "not run to its end", "check": f"{type(exc).__name__}: {exc}"})
                parts.facts.setdefault("seconds", {})[name] = round(time.monotonic() - begun, 1)
                write_results(args.out, markdown_table(rows, HEADER) + "\n", {"rows": rows, "facts": parts.facts})
                print(f"part {name}: {parts.facts['seconds'][name]} s", flush=True)
    finally:
        stopped = cluster("stop", env)
        print(stopped.stderr, end="", flush=True)
    print(markdown_table(rows, HEADER))
    print(json.dumps(parts.facts, default=str))
    return exit_status(rows, lambda row: str(row.get("check", "")).startswith("ok")
                       and (row.get("status") != "OK" or within_target(row)))


if __name__ == "__main__":
    sys.exit(main())
