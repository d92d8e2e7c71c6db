"""Synthetic runs with known per-phase powers (tests/analysis/synthetic_run.py), metered once per session."""

from __future__ import annotations

import dataclasses
import shutil
import sys
from pathlib import Path

import pytest

from tests.analysis import synthetic_run


@dataclasses.dataclass(frozen=True)
class MeteredRun:
    run_dir: Path
    schedule: synthetic_run.Schedule


def metered(root: Path, name: str, **options: object) -> MeteredRun:
    pynvml = sys.modules.get("pynvml") or __import__("pynvml")  # the fake (tests/conftest.py put it first)
    try:
        schedule = synthetic_run.run(root / name / "run", pynvml, **options)  # type: ignore[arg-type]
    finally:
        pynvml.reset()
    return MeteredRun(root / name / "run", schedule)


@pytest.fixture(scope="session")
def synthetic_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("attribution")


@pytest.fixture(scope="session")
def steady_run(synthetic_root: Path) -> MeteredRun:
    """40 s steady window: forward and backward resolvable, the 20 ms optimizer step not."""
    return metered(synthetic_root, "steady")


@pytest.fixture(scope="session")
def interfered_run(synthetic_root: Path) -> MeteredRun:
    """The same, with 60 W of unmarked work in the second half of the steady window."""
    return metered(synthetic_root, "interfered", steady_s=20.0, interference_w=60.0)


@pytest.fixture
def fresh_copy(tmp_path: Path):
    """A writable copy of a metered run (the CLI writes into its run record)."""
    def copy(run: MeteredRun) -> Path:
        target = tmp_path / "run"
        shutil.copytree(run.run_dir, target)
        return target
    return copy
