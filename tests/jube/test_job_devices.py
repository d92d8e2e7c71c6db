"""jube/job.sh on `local` meters the job's devices only (issue 43): a fake NVML node of 4 GPUs.

Before, the one-node local job started `jpwr serve` without the job's device binding, so every GPU of the host went
into the headline (measured on 2- and 4-GPU hosts: the idle GPUs' energy was 9.9 % and 25.8 % of it).
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.jube.conftest import LLM_XML, jube, jube_run, read_table, requires_jube, submit_workdirs, with_fake_nvml
from tests.jube.test_local import _no_slurm

pytestmark = requires_jube


def test_local_meters_the_job_s_gpu_and_puts_the_node_s_others_on_the_whole_node_line(jube_env: dict[str, str],
                                                                                      tmp_path: Path) -> None:
    """The caller binds GPUs 2 and 3; `local` runs one rank (devices_per_node = 1), so the job's device is GPU 2: the
    headline is GPU 2's alone, and meter_whole_node = yes puts GPUs 0, 1 and 3 on their own line and column."""
    env, called = _no_slurm(with_fake_nvml(jube_env), tmp_path)
    env.update(JPWR_FAKE_NVML_DEVICES="4", CUDA_VISIBLE_DEVICES="2,3", JOULEBENCH_METER_WHOLE_NODE="yes")
    out = tmp_path / "llm"
    proc = jube_run(LLM_XML, ["local", "tiny"], out, env)
    assert "FINISHED" in jube("status", str(out), env=env).stdout, proc.stdout
    jube("result", "-a", str(out), env=env)
    (row,) = read_table(out, "llm")
    (workdir,) = submit_workdirs(out)
    assert row["Status"] == "OK", row
    assert "the job's devices: CUDA_VISIBLE_DEVICES=2" in (workdir / "job.err").read_text()
    record = json.loads((workdir / "run" / "run_record.json").read_text())
    steady = next(w for w in record["windows"] if w["name"] == "steady")["energy"]
    assert steady["devices"] == 1 and [d["index"] for d in steady["per_device"]] == [2]
    assert sorted(d["index"] for d in steady["outside_job"]) == [0, 1, 3]
    assert steady["energy_j"] == steady["per_device"][0]["energy_j"] > 0
    metrics = record["metrics"]
    (gpu,) = metrics["per_device"]
    assert (metrics["energy_devices"], metrics["outside_job_devices"]) == (1, 3) and metrics["energy_warning"] is None
    assert metrics["outside_job_energy_j"] == sum(d["energy_j"] for d in steady["outside_job"])
    assert row["Per GPU (J/W/util)"].startswith("2: ") and row["Per GPU (J/W/util)"].count(" J/") == 1
    # the tiny CPU run's steady window can be shorter than the replayed trace's utilisation samples: then n/a, never 0
    # (the mean over samples is tested in tests/test_job_devices.py); the table says what the record says
    assert row["Per GPU (J/W/util)"].endswith(" %" if gpu["utilization_gpu"] is not None else "n/a"), row
    assert row["Not in job"].startswith("3 devices ") and row["Not in job"].endswith(" J")
    serve_log = (workdir / "run" / "jpwr-serve.log").read_text()
    assert "not used by the job: 3 devices, " in serve_log
    assert not called.exists()


def test_local_without_a_binding_meters_gpu_0_alone(jube_env: dict[str, str], tmp_path: Path) -> None:
    """The README's case: nothing binds the job, the host has 4 GPUs; the run uses GPU 0 and only GPU 0 is metered."""
    env, _ = _no_slurm(with_fake_nvml(jube_env), tmp_path)
    env["JPWR_FAKE_NVML_DEVICES"] = "4"
    env.pop("CUDA_VISIBLE_DEVICES", None)
    out = tmp_path / "llm"
    jube_run(LLM_XML, ["local", "tiny"], out, env)
    jube("result", "-a", str(out), env=env)
    (row,) = read_table(out, "llm")
    (workdir,) = submit_workdirs(out)
    record = json.loads((workdir / "run" / "run_record.json").read_text())
    steady = next(w for w in record["windows"] if w["name"] == "steady")["energy"]
    assert row["Status"] == "OK" and row["Devices"] == "1", row
    assert steady["devices"] == 1 and [d["index"] for d in steady["per_device"]] == [0] and steady["outside_job"] == []
    assert record["metrics"]["outside_job_devices"] is None and row["Not in job"] == "n/a"
    assert not any("metered devices" in w for w in record["warnings"])
