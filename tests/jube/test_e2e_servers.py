"""End to end: the inference workflow's serving points with engine=transformers start a real `transformers serve`.

Real JUBE runs each point as a job; the job's driver (`llm_inference load --server-command` from the profile's
server_transformers template, its port from jbport.py) starts the server on the CPU with the tiny preset saved as
a checkpoint (`save-checkpoint`), loads it, and stops it; the job's sampler meters the fake pynvml replaying the
recorded H100 trace. Locally without Slurm (two rates), and on the local Slurm cluster (one point).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from llm_inference.cli import main
from tests.jube.conftest import (
    HAVE_JUBE,
    JUBE_DIR,
    REPO,
    continue_and_read,
    default_table,
    jube_run,
    read_table,
    requires_slurm,
    submit_workdirs,
    wait_for_jobs,
    with_fake_nvml,
)

INFERENCE_XML = JUBE_DIR / "inference_benchmark.xml"
TRANSFORMERS = Path(sys.executable).parent / "transformers"
pytestmark = [pytest.mark.skipif(not HAVE_JUBE, reason="JUBE not installed (apt-get install jube)"),
              pytest.mark.skipif(not TRANSFORMERS.exists(), reason="transformers[serving] is not installed"),
              pytest.mark.slow]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ckpt") / "tiny"
    assert main(["save-checkpoint", "--preset", "tiny", "--out", str(out)]) == 0
    return out


def _server_env(env: dict[str, str], checkpoint: Path, rates: str) -> dict[str, str]:
    return {**with_fake_nvml(env), "JOULEBENCH_SWEEP_ENGINE": "transformers", "JOULEBENCH_SWEEP_RATE": rates,
            "JOULEBENCH_SWEEP_MAX_CONCURRENCY": "4", "JOULEBENCH_SWEEP_STEADY_SECONDS": "2",
            "JOULEBENCH_INFERENCE_CHECKPOINT": str(checkpoint), "HF_HUB_OFFLINE": "1"}


def _assert_served(rows: list[dict[str, str]], workdirs: list[Path], rates: list[str]) -> None:
    assert [(r["Rate req/s"], r["Engine"], r["Status"]) for r in rows] == [(r, "transformers", "OK") for r in rates]
    for row in rows:
        assert float(row["Requests/s"]) > 0 and float(row["TTFT p90(s)"]) > 0
        assert float(row["J/output token"]) > 0 and row["Energy method"] in ("counter", "counter+power")
        # the client-side estimate, fitted after the job on the node's trace (jbrecord.py finalize), or the fit's own
        # reason why not (2 s windows hold about the 20 counter periods it needs)
        assert "no in-process trace" not in row["Note"] and "not fitted after the job" not in row["Note"], row["Note"]
        if row["J/request p50"] == "n/a":
            assert "J/request and shares n/a: fit refused: " in row["Note"], row["Note"]
        else:
            assert float(row["J/request p90"]) >= float(row["J/request p50"]) > 0, row["Note"]
    for work in workdirs:
        log = (work / "run" / "server.log").read_text()
        assert "transformers.cli.transformers serve" in log and "--port" in log
        assert "# joulebench: server stopped by SIGTERM" in log  # stopped when the driver ended


def test_local_serving_points_start_and_stop_transformers_serve(checkpoint, jube_env, tmp_path):
    env = {k: v for k, v in _server_env(jube_env, checkpoint, "8,max").items()}
    env.pop("JPWR_FAKE_NVML_DEVICES")  # one fake GPU on this machine
    out = tmp_path / "runs"
    proc = subprocess.run(["jube", "run", str(INFERENCE_XML), "-o", str(out), "--hide-animation", "-a", "-r"],
                          env=env, cwd=REPO, capture_output=True, text=True, timeout=500)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = read_table(out, "inference")
    _assert_served(rows, [w / "work" for w in sorted((out / "000000").glob("*_submit"))], ["8", "max"])
    shown = default_table(proc.stdout, "inference")  # within 160 characters; serving's columns in the CSV (above)
    assert [(row["Point"], row["Status"]) for row in shown] == [("rate=8", "OK"), ("rate=max", "OK")], shown


@requires_slurm
def test_a_slurm_serving_point_starts_transformers_serve_on_its_node(checkpoint, slurm_cluster, jube_env, tmp_path):
    env = {**_server_env(jube_env, checkpoint, "8"), "SLURM_CONF": str(slurm_cluster)}
    out = tmp_path / "slurm"
    jube_run(INFERENCE_XML, ["CI"], out, env)
    jobs = submit_workdirs(out)
    assert len(jobs) == 1
    wait_for_jobs(out)
    _, rows = continue_and_read(out, "inference", env)
    _assert_served(rows, jobs, ["8"])
    assert os.path.exists(jobs[0] / "run" / "requests.h5")
