#!/usr/bin/env python3
"""Commands on a multi-GPU host, each on one GPU of its own in its own copy of the clone; a GPU that comes free
takes the next command. For single-GPU measurements (the documented GPU lines, issue 46's fronts) run side by side.

    python3 benchmarks/gpu_pool.py --out $OUT/pool TASKS          # every GPU of the host
    python3 benchmarks/gpu_pool.py --out $OUT/pool --gpus 2 TASKS

TASKS holds one task a line, `NAME: COMMAND` (blank lines and `#` comments skipped), in the order they are taken.
COMMAND runs under bash from the root of the worker's copy of the clone (lines write into the root: `runs/`,
`out/`), with CUDA_VISIBLE_DEVICES = the worker's GPU UUID, so a meter and an independent counter read name the
same device; `{out}` in it stands for the task's own folder (OUT/NAME). Each task's output goes to OUT/NAME.log;
OUT/pool.json (task, GPU, exit status, start, seconds) is rewritten after every task, so a stopped pool keeps what
finished. Exit status 1 when a task failed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # run as a script from a checkout

from benchmarks import common  # noqa: E402
from jpwr.output import write_atomic  # noqa: E402

COPY_LEAVES_OUT = shutil.ignore_patterns(".git", ".venv", "__pycache__", ".mypy_cache", ".pytest_cache",
                                         ".ruff_cache", ".hypothesis")


@dataclass(frozen=True)
class Task:
    name: str
    command: str


@dataclass(frozen=True)
class Worker:
    root: Path  # its copy of the clone
    gpu: str  # the UUID it may use ("" : the environment's own)


def read_tasks(path: Path) -> list[Task]:
    tasks = []
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, command = line.partition(":")
        if not sep or not name.strip() or not command.strip() or "/" in name:
            raise SystemExit(f"{path}:{number}: expected `NAME: COMMAND` (NAME without '/'), got {line!r}")
        tasks.append(Task(name.strip(), command.strip()))
    names = [t.name for t in tasks]
    if len(set(names)) != len(names):
        raise SystemExit(f"{path}: task names repeat: {sorted({n for n in names if names.count(n) > 1})}")
    return tasks


def make_workers(uuids: list[str], out: Path) -> list[Worker]:
    """One worker a GPU, each with a copy of the clone (the pool's own output left out, where it lies inside)."""
    def leave_out(folder: str, names: list[str]) -> set[str]:
        return COPY_LEAVES_OUT(folder, names) | ({out.name} if Path(folder).resolve() == out.parent else set())

    made = []
    for i, uuid in enumerate(uuids):
        root = out / f"clone-gpu{i}"
        shutil.copytree(REPO, root, ignore=leave_out, symlinks=True, dirs_exist_ok=True)
        made.append(Worker(root, uuid))
    return made


def run_task(task: Task, worker: Worker, out: Path) -> dict[str, Any]:
    folder = out / task.name
    folder.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    if worker.gpu:
        env.update(CUDA_VISIBLE_DEVICES=worker.gpu, CUDA_DEVICE_ORDER="PCI_BUS_ID")
    started = time.time()
    print(f"=== {task.name} on {worker.gpu or 'the environment GPU(s)'}: {task.command}", flush=True)
    with open(out / f"{task.name}.log", "w") as sink:
        code = subprocess.run(["bash", "-c", task.command.replace("{out}", str(folder))], cwd=worker.root, env=env,
                              stdout=sink, stderr=subprocess.STDOUT, check=False).returncode
    row = {"task": task.name, "gpu": worker.gpu, "exit": code, "started": started, "seconds": time.time() - started}
    print(f"=== {task.name}: exit {code} after {row['seconds']:.0f} s", flush=True)
    return row


def run_pool(tasks: list[Task], workers: list[Worker], out: Path) -> list[dict[str, Any]]:
    """Each worker takes the next task when its last one ends; pool.json rewritten after every task."""
    queue, rows, lock = deque(tasks), [], threading.Lock()

    def work(worker: Worker) -> None:
        while True:
            with lock:
                if not queue:
                    return
                task = queue.popleft()
            row = run_task(task, worker, out)
            with lock:
                rows.append(row)
                write_atomic(out / "pool.json", json.dumps(rows, indent=1))

    threads = [threading.Thread(target=work, args=(w,), name=f"gpu-{i}") for i, w in enumerate(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tasks", type=Path, help="`NAME: COMMAND` lines")
    parser.add_argument("--out", type=Path, default=Path("gpu_pool_out"))
    parser.add_argument("--gpus", type=int, default=None, help="use the first N GPUs (default: all)")
    args = parser.parse_args(argv)
    tasks = read_tasks(args.tasks)
    uuids = common.gpu_uuids()
    if args.gpus is not None and not 1 <= args.gpus <= len(uuids):
        parser.error(f"--gpus {args.gpus}: this host has {len(uuids)} GPU(s)")
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    rows = run_pool(tasks, make_workers(uuids[:args.gpus], out), out)
    for row in rows:
        print(f"{row['task']:<32} {row['gpu']:<40} exit {row['exit']:<4} {row['seconds']:7.0f} s")
    return 0 if all(r["exit"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
