"""The local cluster's GPU shape (`jube/slurm-local.sh start --shape gpu`) on this CPU machine, and the job's GPUs as
the metered GPUs under Slurm (issue 56).

The GPU shape counts the host's GPUs with `nvidia-smi -L` and hands out `/dev/nvidia<i>` as gres: here a fake
nvidia-smi lists the two GPUs of the fake pynvml (tests/fakes/nvidia_smi.py, the H100 trace replayed on two devices) and
fake device files stand in for /dev/nvidia0-1 (JOULEBENCH_SLURM_GPU_DEVICE_DIR), as shapes 2 and 4 do. Everything
else is real: Debian's slurmctld, slurmd and a munged of the shape's own, real sbatch and gres scheduling, JUBE 2.5.1,
the tiny GPT on CPU ranks (the SLURMGPU profile with CPU settings from the environment).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.jube.conftest import (
    FAKES_DIR,
    H100_TRACE_DIR,
    LLM_XML,
    SLURM_SCRIPT,
    continue_and_read,
    jube_run,
    requires_slurm,
    submit_workdirs,
    wait_for_jobs,
    with_fake_nvml,
)

pytestmark = [requires_slurm, pytest.mark.machine_wide]
BASE = Path("/tmp/joulebench-slurm-gpu")
HOST = os.uname().nodename.split(".")[0]
# The SLURMGPU profile on CPU ranks, as the CI section runs the tiny GPT (jube/systems.ini [CI])
CPU_PROFILE = {"VENDOR": "cpu", "DRIVER_DEVICE": "cpu", "PRECISION": "fp32", "LLM_ITERATIONS": "4",
               "LLM_WARMUP_ITERATIONS": "1", "MIN_STEADY_S": "1", "STARTUP_S_TINY": "30", "TIME_LIMIT": "0:05:00"}


def _fake_gpu_host(root: Path) -> dict[str, str]:
    """A `nvidia-smi` of the fake pynvml's two GPUs first on PATH, and two fake device files."""
    (root / "bin").mkdir()
    smi = root / "bin" / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\nexec {sys.executable} {FAKES_DIR / 'nvidia_smi.py'} \"$@\"\n")
    smi.chmod(0o755)
    (root / "dev").mkdir()
    for index in (0, 1):
        os.mknod(root / "dev" / f"nvidia{index}", 0o666 | 0o020000, os.makedev(1, 3))  # a character device
    return {"PATH": f"{root / 'bin'}{os.pathsep}{os.environ['PATH']}",
            "JOULEBENCH_SLURM_GPU_DEVICE_DIR": str(root / "dev"), "PYTHONPATH": str(FAKES_DIR),
            "JPWR_FAKE_NVML_TRACE": str(H100_TRACE_DIR), "JPWR_FAKE_NVML_DEVICES": "2"}


def _script(action: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["sh", str(SLURM_SCRIPT), action, "--shape", "gpu"], env={**os.environ, **env},
                          capture_output=True, text=True, timeout=120)


def _started(env: dict[str, str]) -> str:
    started = _script("start", env)
    logs = "".join(f"\n--- {log}\n{log.read_text()[-2000:]}" for log in sorted(BASE.glob("log/*.log")))
    assert started.returncode == 0, f"start --shape gpu failed:\n{started.stderr}{logs}"
    return started.stdout


def _ours_running() -> list[str]:
    """Processes whose command line names the shape's directory: its slurmctld, slurmd and munged."""
    found = subprocess.run(["pgrep", "-af", str(BASE)], capture_output=True, text=True).stdout
    return [line for line in found.splitlines() if "pgrep" not in line]


def _assert_nothing_left() -> None:
    assert not _ours_running(), _ours_running()
    assert not BASE.exists(), sorted(str(p) for p in BASE.rglob("*"))
    assert f" {HOST} # joulebench" not in Path("/etc/hosts").read_text()


@pytest.fixture(scope="module")
def gpu_host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    if _script("status", {}).returncode == 0:
        pytest.skip("a GPU-shape cluster already runs on this machine (not this session's to stop)")
    env = _fake_gpu_host(tmp_path_factory.mktemp("gpu-host"))
    try:
        yield env
    finally:
        _script("stop", env)


def test_the_gpu_shape_starts_with_the_hosts_gpus_and_stop_leaves_nothing_twice(gpu_host: dict[str, str]) -> None:
    for _ in range(2):  # a second start/stop cycle works as the first
        exports = _started(gpu_host)
        assert f"export SLURM_CONF={BASE}/slurm.conf" in exports
        conf = (BASE / "slurm.conf").read_text()
        assert f"NodeName={HOST} NodeAddr=127.0.0.1 Port=7021" in conf and "Gres=gpu:2" in conf
        assert "PartitionName=gpu" in conf and f"AuthInfo=socket={BASE}/run/munge/munge.socket" in conf
        assert (BASE / "gres.conf").read_text().strip() == (
            f"NodeName={HOST} Name=gpu File={gpu_host['JOULEBENCH_SLURM_GPU_DEVICE_DIR']}/nvidia[0-1]")
        assert not (BASE / "cgroup.conf").exists()  # cgroup v1 here: nothing of the cgroup v2 set-up
        shown = subprocess.run(["scontrol", "show", "node", HOST], capture_output=True, text=True,
                               env={**os.environ, "SLURM_CONF": str(BASE / "slurm.conf")}).stdout
        assert "Gres=gpu:2" in shown and "State=IDLE" in shown, shown
        assert len(_ours_running()) >= 3  # slurmctld, slurmd, munged
        stopped = _script("stop", gpu_host)
        assert stopped.returncode == 0, stopped.stderr
        _assert_nothing_left()


def test_the_shape_refuses_a_host_whose_gpus_have_no_device_files(gpu_host: dict[str, str], tmp_path: Path) -> None:
    refused = _script("start", {**gpu_host, "JOULEBENCH_SLURM_GPU_DEVICE_DIR": str(tmp_path)})
    assert refused.returncode == 1 and f"{tmp_path}/nvidia0 is no character device" in refused.stderr
    _script("stop", gpu_host)
    _assert_nothing_left()


def test_a_job_given_the_second_gpu_meters_it_alone_and_names_it_by_uuid(
        gpu_host: dict[str, str], jube_env: dict[str, str], tmp_path: Path) -> None:
    """A job holding GPU 0 first, then the tiny GPT through JUBE with the SLURMGPU tag: Slurm binds it to GPU 1 (the
    job sees both: ConstrainDevices=no), its node's sampler meters GPU 1 alone and the record names it by UUID."""
    _started(gpu_host)
    conf = str(BASE / "slurm.conf")
    env = {**with_fake_nvml({**jube_env, "SLURM_CONF": conf}), "JPWR_FAKE_NVML_DEVICES": "2",
           **{f"JOULEBENCH_SLURMGPU_{key}": value for key, value in CPU_PROFILE.items()}}
    holder = subprocess.run(["sbatch", "--parsable", "--gpus-per-node=1", "--output=/dev/null", "--wrap", "sleep 600"],
                            env=env, capture_output=True, text=True, check=True).stdout.strip()
    try:
        out = tmp_path / "llm"
        jube_run(LLM_XML, ["SLURMGPU", "tiny"], out, env)
        try:
            wait_for_jobs(out, timeout_s=360)
        except AssertionError as exc:  # what the queue and the job say, for a job that never ended
            queue = subprocess.run(["squeue", "-o", "%i %j %T %r"], env=env, capture_output=True, text=True).stdout
            logs = "".join(f"\n--- {log}\n{log.read_text()[-1500:]}" for log in sorted(out.rglob("*.err")))
            raise AssertionError(f"{exc}\nsqueue:\n{queue}{logs}") from None
        _, rows = continue_and_read(out, "llm", env)
    finally:
        subprocess.run(["scancel", holder], env=env)
    (row,) = rows
    assert row["Status"] == "OK" and row["System"] == "SLURMGPU" and float(row["Energy(Wh)"]) > 0, row
    (workdir,) = submit_workdirs(out)
    record = json.loads((workdir / "run" / "run_record.json").read_text())
    uuids = {line.split("(UUID: ")[1].rstrip(")\n"): int(line.split(":")[0][4:]) for line in subprocess.run(
        ["nvidia-smi", "-L"], env={**env, "PATH": gpu_host["PATH"]}, capture_output=True, text=True, check=True
    ).stdout.splitlines()}
    second = next(uuid for uuid, index in uuids.items() if index == 1)
    (node,) = record["job"]["devices"]
    assert node["node"] == HOST and node["binding"] == "CUDA_VISIBLE_DEVICES=1", node
    assert [(d["index"], d["uuid"]) for d in node["devices"]] == [(1, second)]
    steady = next(w for w in record["windows"] if w["name"] == "steady")
    assert [(d["index"], d["uuid"]) for d in steady["energy"]["per_device"]] == [(1, second)]
    assert not any("Slurm allocated" in w for w in record["warnings"]), record["warnings"]
    err = (workdir / "job.err").read_text()
    assert f"the job's devices on {HOST} (Slurm's binding): CUDA_VISIBLE_DEVICES=1 SLURM_JOB_GPUS=1" in err
    deadline = time.monotonic() + 30
    while subprocess.run(["squeue", "-h"], env=env, capture_output=True, text=True).stdout.strip():
        assert time.monotonic() < deadline, "jobs still queued 30 s after the scancel"
        time.sleep(0.5)
    _script("stop", gpu_host)
    _assert_nothing_left()
