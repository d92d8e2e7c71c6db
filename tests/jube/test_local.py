"""The `local` system: no Slurm at all, the job script runs on this machine inside `jube run`."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from tests.jube.conftest import (
    LLM_XML,
    RESNET_XML,
    TABLE_WIDTH,
    default_table,
    jube,
    jube_run,
    read_table,
    requires_jube,
    submit_workdirs,
    with_fake_nvml,
)
from tests.jube.test_static import assert_patterns_match

pytestmark = requires_jube
CPU_NOTE = "local: no GPU found (neither nvidia-smi -L nor rocm-smi lists one): CPU-sized settings of [local.cpu]"


def _no_slurm(env: dict[str, str], tmp_path: Path) -> tuple[dict[str, str], Path]:
    """sbatch/srun on PATH that only leave a trace: the local workflow must never call them."""
    bin_dir, called = tmp_path / "bin", tmp_path / "slurm-called"
    bin_dir.mkdir()
    for name in ("sbatch", "srun", "squeue", "scancel", "scontrol", "sinfo"):
        tool = bin_dir / name
        tool.write_text(f"#!/bin/sh\necho {name} >> {called}\nexit 1\n")
        tool.chmod(0o755)
    return {**env, "PATH": f"{bin_dir}:{env['PATH']}", "JOULEBENCH_LLM_ITERATIONS": "3"}, called


def _steady_steps(workdir: Path) -> int:
    record = json.loads((workdir / "run" / "run_record.json").read_text())
    return next(w["steps"] for w in record["windows"] if w["name"] == "steady")


def test_local_llm_and_resnet50_run_without_slurm_and_measure_the_iterations_asked(jube_env: dict[str, str],
                                                                                  tmp_path: Path) -> None:
    """This machine has no GPU: the CPU-sized settings, said in the note. ResNet-50 without a system tag is
    `local` too, in fp32 at 64 px, with a progress line per iteration in the job log. llm_iterations = N and
    resnet_iterations = N both mean N measured iterations, the warm-up's on top (llm_training's side of this needs the
    driver where --iterations counts measured iterations)."""
    env, called = _no_slurm(jube_env, tmp_path)
    measured, warmup = 4, 2  # [local.cpu]'s warm-up
    env.update(JOULEBENCH_LLM_ITERATIONS=str(measured), JOULEBENCH_RESNET_ITERATIONS=str(measured))
    runs = {"llm": (LLM_XML, ["local", "tiny"], "llm"), "resnet": (RESNET_XML, ["pytorch"], "resnet50")}
    for name, (xml, tags, table) in runs.items():
        out = tmp_path / name
        proc = jube_run(xml, tags, out, env)  # local jobs finish inside `jube run`: no continue
        assert "FINISHED" in jube("status", str(out), env=env).stdout, proc.stdout
        shown = jube("result", "-a", str(out), env=env).stdout
        assert max(map(len, shown.splitlines())) <= TABLE_WIDTH, shown  # every line, not only the default table's
        (row,) = read_table(out, table)
        assert (row["JobID"], row["System"], row["Devices"], row["Status"], row["Precision"]) == (
            "local", "local", "1", "OK", "fp32"), row
        # the profile's note first; a busy CI machine may add "disturbed: ..." (step times) before the energy reason
        assert row["Energy(Wh)"] == "n/a" and row["Note"].startswith(CPU_NOTE) and "; energy n/a: " in row["Note"], row
        (short,) = default_table(shown, table)  # the note's reasons as heads, the row's own first
        assert short["Reason"].startswith("energy n/a: no energy sensor") and "jpwr info" in row["Note"]
        assert (short["Point"], short["Status"]) == ("-", "OK"), short  # one point: no coordinate tells it apart
        assert (row["Iterations asked"], row["Warm-up iterations"]) == (str(measured), str(warmup)), row
        (workdir,) = submit_workdirs(out)
        assert_patterns_match(xml, (workdir / "result.txt").read_text())
        assert "finished: status OK" in (workdir / "job.err").read_text()
    (llm,) = read_table(tmp_path / "llm", "llm")
    assert llm["Model"] == "tiny" and float(llm["Tokens/s"]) > 0
    (resnet,) = read_table(tmp_path / "resnet", "resnet50")
    assert (resnet["Model"], resnet["Image px"], resnet["GBS"]) == ("resnet50-pytorch", "64", "8")
    progress = [line for line in (submit_workdirs(tmp_path / "resnet")[0] / "job.out").read_text().splitlines()
                if line.startswith("[resnet50] step ")]
    assert len(progress) == warmup + measured and "ETA" in progress[0]
    assert not called.exists(), f"the local workflow called Slurm: {called.read_text()}"
    steps = {name: _steady_steps(submit_workdirs(tmp_path / name)[0]) for name in runs}
    assert steps == {"llm": measured, "resnet": measured}, steps
    assert (llm["Measured iterations"], resnet["Measured iterations"]) == (str(measured), str(measured))


def test_local_failed_row_says_the_driver_s_own_error(jube_env: dict[str, str], tmp_path: Path) -> None:
    """The driver refuses its device (exit 64, no record): the row and the job log's last line give its own words."""
    env, _ = _no_slurm({**jube_env, "JOULEBENCH_DRIVER_DEVICE": "cuda"}, tmp_path)
    out = tmp_path / "llm"
    jube_run(LLM_XML, ["local", "tiny"], out, env)
    jube("result", "-a", str(out), env=env)
    (row,) = read_table(out, "llm")
    host = socket.gethostname().split(".")[0]
    said = (f"rank 0 on {host} exited with code 64: llm_training: error: --device cuda but no CUDA/ROCm device is "
            "visible. Fix: ")
    assert row["Status"] == "FAILED" and row["Note"].startswith(f"{CPU_NOTE}; {said}"), row
    (workdir,) = submit_workdirs(out)
    last = [line for line in (workdir / "job.err").read_text().splitlines() if line.startswith("joulebench-job:")][-1]
    assert f"finished: status FAILED ({said}" in last and last.endswith("; exit code 1"), last


@pytest.mark.parametrize("node_devices", ["own", "all"])
def test_local_runs_several_node_identities_with_a_sampler_each(jube_env: dict[str, str], tmp_path: Path,
                                                                 node_devices: str) -> None:
    """nodes = 2 on `local` (issue 21): two node identities on this host, one rank and one `jpwr serve` each, the
    job script's own combine. Two fake GPUs: each metered by its node (own), or by both and counted once (all)."""
    env, called = _no_slurm(with_fake_nvml(jube_env), tmp_path)
    env.update(JOULEBENCH_NODES="2", JOULEBENCH_LOCAL_NODE_DEVICES=node_devices)
    out = tmp_path / "llm"
    proc = jube_run(LLM_XML, ["local", "tiny"], out, env)
    assert "FINISHED" in jube("status", str(out), env=env).stdout, proc.stdout
    jube("result", "-a", str(out), env=env)
    (row,) = read_table(out, "llm")
    assert (row["Status"], row["Devices"]) == ("OK", "2"), row
    (workdir,) = submit_workdirs(out)
    record = json.loads((workdir / "run" / "run_record.json").read_text())
    steady = next(w for w in record["windows"] if w["name"] == "steady")["energy"]
    combined = json.loads((workdir / "run" / "energy" / "summary.json").read_text())["windows"]["steady"]["energy"]
    assert steady["devices"] == combined["devices"] == 2 and steady["energy_j"] > 0
    assert sorted(combined["nodes"]) == [f"{socket.gethostname().split('.')[0]}-n{i}" for i in (0, 1)]
    overlap = [w for w in combined["warnings"] if "metered by the samplers of nodes" in w]
    assert (len(overlap) == 2) if node_devices == "all" else not overlap, combined["warnings"]
    assert abs(combined["energy_j"] - steady["energy_j"]) <= steady["error_bound_j"]
    assert not called.exists()


def test_local_refuses_more_node_identities_than_gpus(jube_env: dict[str, str], tmp_path: Path) -> None:
    """With a GPU listed by nvidia-smi, each node identity needs its own: the point is INVALID before any job."""
    bin_dir = tmp_path / "gpu-bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)'\n")
    smi.chmod(0o755)
    env, _ = _no_slurm({**jube_env, "PATH": f"{bin_dir}:{jube_env['PATH']}", "JOULEBENCH_NODES": "2"}, tmp_path)
    out = tmp_path / "llm"
    jube_run(LLM_XML, ["local", "tiny"], out, env)
    jube("result", "-a", str(out), env=env)
    (row,) = read_table(out, "llm")
    assert row["Status"] == "INVALID" and "has 1 GPU(s)" in row["Note"], row
