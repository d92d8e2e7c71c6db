"""benchmarks/gpu_pool.py: tasks taken in turn by workers, each in its own root with its own GPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import gpu_pool


def test_tasks_file_is_read_in_order_and_a_bad_line_is_named(tmp_path: Path):
    good = tmp_path / "tasks"
    good.write_text("# comment\n\na: echo 1\nb: echo {out}\n")
    assert [t.name for t in gpu_pool.read_tasks(good)] == ["a", "b"]
    bad = tmp_path / "bad"
    bad.write_text("a: echo 1\nno command here\n")
    with pytest.raises(SystemExit, match="bad:2: expected `NAME: COMMAND`"):
        gpu_pool.read_tasks(bad)
    twice = tmp_path / "twice"
    twice.write_text("a: echo 1\na: echo 2\n")
    with pytest.raises(SystemExit, match="task names repeat"):
        gpu_pool.read_tasks(twice)


def test_each_task_runs_once_in_its_workers_root_with_its_gpu(tmp_path: Path):
    roots = [tmp_path / "r0", tmp_path / "r1"]
    for root in roots:
        root.mkdir()
    workers = [gpu_pool.Worker(root, f"GPU-{i}") for i, root in enumerate(roots)]
    tasks = [gpu_pool.Task(f"t{i}", f"echo $CUDA_VISIBLE_DEVICES > ran-t{i}; echo done > {{out}}/x; exit {i % 2}")
             for i in range(5)]
    out = tmp_path / "out"
    out.mkdir()
    rows = gpu_pool.run_pool(tasks, workers, out)
    assert sorted(r["task"] for r in rows) == [f"t{i}" for i in range(5)]
    for row in rows:
        root = next(w.root for w in workers if w.gpu == row["gpu"])
        assert (root / f"ran-{row['task']}").read_text().strip() == row["gpu"]  # its root, its GPU
        assert row["exit"] == int(row["task"][1:]) % 2
        assert (out / row["task"] / "x").read_text() == "done\n"  # {out}: the task's own folder
    assert len(json.loads((out / "pool.json").read_text())) == 5
