"""Shared pieces of the JUBE workflow tests: real JUBE, a real local Slurm cluster, the real drivers.

The cluster (jube/slurm-local.sh) is started once per session if it is not running and stopped at the end
only if this session started it. Each workflow run gets its own JUBE outpath under tmp_path; the table is
read from the CSV file JUBE writes (<outpath>/<id>/result/<table>.dat).
"""

from __future__ import annotations

import csv
import itertools
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
JUBE_DIR = REPO / "jube"
SLURM_SCRIPT = JUBE_DIR / "slurm-local.sh"
FAKES_DIR = REPO / "tests" / "fakes"
H100_TRACE_DIR = REPO / "tests" / "data" / "h100_trace"
LLM_XML = JUBE_DIR / "llm_benchmark.xml"
RESNET_XML = JUBE_DIR / "resnet50_benchmark.xml"

HAVE_JUBE = shutil.which("jube") is not None
HAVE_SLURM = all(shutil.which(c) for c in ("slurmctld", "slurmd", "munged", "sbatch")) and os.geteuid() == 0
requires_jube = pytest.mark.skipif(not HAVE_JUBE, reason="JUBE not installed (apt-get install jube; jube/ci-setup.sh)")
requires_slurm = pytest.mark.skipif(
    not (HAVE_JUBE and HAVE_SLURM),
    reason="needs JUBE, Debian's slurmctld/slurmd/munge and root (jube/ci-setup.sh)",
)


def _cluster(shape: int) -> Iterator[Path]:
    """Start the cluster unless it runs; stop it (its daemons, files and /etc/hosts lines) if this session started
    it, also when it did not come up."""
    base = Path(f"/tmp/joulebench-slurm-{shape}")
    script = [str(SLURM_SCRIPT)]
    running = subprocess.run([*script, "status", "--shape", str(shape)], capture_output=True).returncode == 0
    try:
        if not running:
            started = subprocess.run([*script, "start", "--shape", str(shape)], capture_output=True, text=True)
            logs = "".join(f"\n--- {log}\n{log.read_text()[-2000:]}" for log in sorted(base.glob("log/*.log")))
            assert started.returncode == 0, f"slurm-local.sh start failed:\n{started.stderr}{logs}"
        yield base / "slurm.conf"
    finally:
        if not running:
            subprocess.run([*script, "stop", "--shape", str(shape)], capture_output=True)


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[Path]:
    """The 2-node cluster (n1, n2; partition debug); yields its SLURM_CONF."""
    yield from _cluster(2)


@pytest.fixture(scope="session")
def slurm_cluster_4() -> Iterator[Path]:
    """The 4-node cluster (c1-c4; partitions devel (default, 2 nodes) and booster (4 nodes))."""
    yield from _cluster(4)


def without_profile_overrides() -> dict[str, str]:
    """The caller's environment minus its JOULEBENCH_* profile overrides; the quiet load average of tests/conftest.py
    stays (the jobs' disturbed check must not see this machine's load)."""
    from joulebench.disturbed import LOADAVG_ENV

    return {k: v for k, v in os.environ.items()
            if (k == LOADAVG_ENV or not k.upper().startswith("JOULEBENCH_")) and k != "SLURM_CONF"}


@pytest.fixture
def jube_env() -> dict[str, str]:
    """Without the caller's profile overrides, with this interpreter running the drivers."""
    env = without_profile_overrides()
    env["JOULEBENCH_PYTHON"] = sys.executable
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    return env


def with_fake_nvml(env: dict[str, str]) -> dict[str, str]:
    """Every process of the job (sampler and ranks) imports the fake pynvml replaying the H100 trace.

    Two fake GPUs per node, as the cluster's GRES says: a job given GPU 1 of a node must find a GPU 1."""
    env = dict(env)
    env["PYTHONPATH"] = os.pathsep.join([str(FAKES_DIR), env.get("PYTHONPATH", "")])
    env.update(JPWR_FAKE_NVML_TRACE=str(H100_TRACE_DIR), JPWR_FAKE_NVML_DEVICES="2", JOULEBENCH_JPWR_METHODS="nvml")
    return env


def jube(*args: str, env: dict[str, str], check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(["jube", *args], env=env, capture_output=True, text=True, cwd=REPO, timeout=600)
    if check and proc.returncode != 0:
        raise AssertionError(f"jube {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc


def jube_run(xml: Path, tags: list[str], outpath: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    args = ["run", str(xml), "-o", str(outpath), "--hide-animation"]
    if tags:
        args += ["--tag", *tags]
    return jube(*args, env=env)


def submit_workdirs(outpath: Path) -> list[Path]:
    return sorted(outpath.glob("000000/*_submit/work"))


def wait_for_jobs(outpath: Path, timeout_s: float = 240.0) -> None:
    """Poll (cheaply) until every submitted job touched its done file; the workflow itself never blocks."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        dirs = submit_workdirs(outpath)
        if dirs and all((d / "job.done").exists() for d in dirs):
            return
        time.sleep(0.5)
    raise AssertionError(f"jobs under {outpath} did not finish within {timeout_s} s")


def continue_and_read(outpath: Path, workflow: str, env: dict[str, str]) -> tuple[str, list[dict[str, str]]]:
    """The one `jube continue` (with analyse + result), then the full table the compare step wrote."""
    proc = jube("continue", str(outpath), "-a", "-r", "--hide-animation", env=env)
    assert "FINISHED" in jube("status", str(outpath), env=env).stdout
    return proc.stdout, read_table(outpath, workflow)


def read_table(outpath: Path, workflow: str) -> list[dict[str, str]]:
    """The rows of the full table (jube/jbtable.py) of the workflow's first run in `outpath`."""
    path = outpath / "000000" / "result" / f"{workflow}.csv"
    with path.open() as handle:
        return list(csv.DictReader(handle))


TABLE_WIDTH = 160  # the default table's limit (docs/jube.md, "Result tables")


def default_table(output: str, name: str) -> list[dict[str, str]]:
    """The rows of the named default (pretty) table in `jube result`'s output, after checking that each of its
    lines fits TABLE_WIDTH characters."""
    lines = output.splitlines()
    block = [line for line in itertools.takewhile(str.strip, lines[lines.index(f"{name}:") + 1:])]
    too_wide = [line for line in block if len(line) > TABLE_WIDTH]
    assert not too_wide, f"{name}: {len(too_wide)} line(s) over {TABLE_WIDTH} characters:\n" + "\n".join(block)
    head, _, *rows = ([cell.strip() for cell in line.strip("|").split(" | ")] for line in block)
    return [dict(zip(head, row, strict=True)) for row in rows]


def is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
