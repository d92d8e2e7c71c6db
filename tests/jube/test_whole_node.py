"""The whole node (issue 43 items 2 and 3): `local` runs data parallel over every GPU the job may use, with the
per-GPU batch of one GPU (weak scaling); the devices_per_node sweep dimension and its scaling table.

The GPUs are the hardware boundary's fakes: a stand-in nvidia-smi listing four H100s (what validate counts) and the
fake NVML of four devices (what the samplers meter). The ranks run on the CPU (driver_device = cpu)."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.jube.conftest import (
    LLM_XML,
    REPO,
    default_table,
    jube,
    read_table,
    requires_jube,
    submit_workdirs,
    with_fake_nvml,
)
from tests.jube.test_local import _no_slurm
from tests.jube.test_profile import CLEAN_ENV, _fake_tool, jbprofile
from tests.jube.test_record_fields import jbrecord, jbsettings  # noqa: F401  (jbrecord loads jbscaling)

jbscaling = sys.modules["jbscaling"]  # loaded by jbrecord from the same directory

GPUS = 4
WHOLE_NODE_SCRIPT = REPO / "benchmarks" / "whole_node_jube.py"
NVIDIA_SMI = "\n".join(f"GPU {i}: NVIDIA H100 80GB HBM3 (UUID: GPU-{i})" for i in range(GPUS))


def _gpu_host(tmp_path: Path) -> dict[str, str]:
    return _fake_tool(tmp_path, "nvidia-smi", NVIDIA_SMI)


def _option(settings: dict[str, str], key: str, option: str) -> str:
    args = shlex.split(settings[key])
    return args[args.index(option) + 1]


def test_local_on_a_gpu_host_runs_data_parallel_over_every_gpu_with_one_gpu_s_batch(tmp_path: Path) -> None:
    """Four GPUs: four ranks on one node, GBS = the profile's one-GPU batch x 4 (batch_devices = 1 on local); the
    record's rule is weak. The inference workflow stays on one GPU."""
    env = _gpu_host(tmp_path)
    profile = jbprofile.load_profile("local", env)
    assert (profile["devices_per_node"], profile["batch_devices"], profile["scaling"]) == ("all", "1", "weak")
    llm = jbprofile.build_settings("llm", [], {}, "run", env)
    assert (llm["JB_NODES"], llm["JB_TASKS_PER_NODE"], llm["JB_WORLD_SIZE"], llm["JB_SCALING"]) == (
        "1", str(GPUS), str(GPUS), "weak")
    assert _option(llm, "JB_VALIDATE_ARGS", "--devices-per-node") == str(GPUS)
    assert _option(llm, "JB_TRAIN_ARGS", "--global-batch-size") == str(int(profile["gbs_800m"]) * GPUS)
    assert llm["JB_COORD_DEVICES_PER_NODE"] == str(GPUS)
    resnet = jbprofile.build_settings("resnet50", [], {"framework": "pytorch"}, "run", env)
    assert _option(resnet, "JB_TRAIN_ARGS", "--global-batch-size") == str(int(profile["resnet_gbs"]) * GPUS)
    inference = jbprofile.build_settings("inference", [], {}, "run", env)
    assert (inference["JB_WORLD_SIZE"], inference["JB_SCALING"]) == ("1", "")


@pytest.mark.parametrize(("override", "devices"), [({"CUDA_VISIBLE_DEVICES": "1,3"}, 2),
                                                   ({"JOULEBENCH_LOCAL_DEVICES_PER_NODE": "3"}, 3)])
def test_local_uses_the_gpus_the_job_may_use_or_the_pinned_number(tmp_path: Path, override: dict[str, str],
                                                                   devices: int) -> None:
    """A binding of the caller limits the count (the note says so); a profile key pins fewer."""
    env = {**_gpu_host(tmp_path), **override}
    settings = jbprofile.build_settings("llm", [], {}, "run", env)
    gbs = int(jbprofile.load_profile("local", env)["gbs_800m"])
    assert (settings["JB_TASKS_PER_NODE"], _option(settings, "JB_TRAIN_ARGS", "--global-batch-size")) == (
        str(devices), str(gbs * devices))
    bound = "CUDA_VISIBLE_DEVICES" in override
    assert (f"{GPUS} NVIDIA GPU(s) found by nvidia-smi" in settings["JB_NOTE"]) and (
        f", {devices} usable by this job (CUDA_VISIBLE_DEVICES)" in settings["JB_NOTE"]) == bound


def test_a_host_without_a_gpu_keeps_one_process() -> None:
    settings = jbprofile.build_settings("llm", [], {}, "run", CLEAN_ENV)
    assert (settings["JB_WORLD_SIZE"], settings["JB_COORD_DEVICES_PER_NODE"]) == ("1", "1")


def test_more_devices_than_a_node_has_are_refused_before_submission(tmp_path: Path) -> None:
    with pytest.raises(jbprofile.PointRefused, match=rf"has {GPUS} GPU\(s\) this job may use, the point asks for "
                       rf"devices_per_node={GPUS + 1}\. Fix: use devices_per_node <= {GPUS} on this machine"):
        jbprofile.build_settings("llm", [], {"devices_per_node": str(GPUS + 1)}, "run", _gpu_host(tmp_path))
    cluster = _fake_tool(tmp_path, "sbatch", "")
    per_node = jbprofile.load_profile("A100", cluster)["devices_per_node"]
    with pytest.raises(jbprofile.PointRefused, match=rf"devices_per_node={int(per_node) * 2} is more than a node of "
                       rf"A100 has \(devices_per_node = {per_node}\)\. Fix: use devices_per_node <= {per_node}"):
        jbprofile.build_settings("llm", ["A100"], {"devices_per_node": str(int(per_node) * 2)}, "run", cluster)


def test_weak_scaling_keeps_the_per_device_batch_and_strong_the_batch(tmp_path: Path) -> None:
    """A100's gbs_800M is written for its nodes_800M nodes of devices_per_node GPUs: one device of it gets that
    batch's per-device share (weak), the batch as written (strong), or the point's own GBS (strong, as given)."""
    env = _fake_tool(tmp_path, "sbatch", "")
    profile = jbprofile.load_profile("A100", env)
    written, reference = int(profile["gbs_800m"]), int(profile["nodes_800m"]) * int(profile["devices_per_node"])
    one = jbprofile.build_settings("llm", ["A100"], {"devices_per_node": "1"}, "run", env)
    assert (one["JB_SCALING"], _option(one, "JB_TRAIN_ARGS", "--global-batch-size")) == (
        "weak", str(written // reference))
    strong = jbprofile.build_settings("llm", ["A100"], {"devices_per_node": "1"}, "run",
                                      {**env, "JOULEBENCH_SCALING": "strong"})
    assert (strong["JB_SCALING"], _option(strong, "JB_TRAIN_ARGS", "--global-batch-size")) == ("strong", str(written))
    own = jbprofile.build_settings("llm", ["A100"], {"devices_per_node": "1", "global_batch_size": "8"}, "run", env)
    assert (own["JB_SCALING"], _option(own, "JB_TRAIN_ARGS", "--global-batch-size")) == ("strong", "8")
    uneven = {**env, "JOULEBENCH_A100_GBS_800M": str(reference + 1)}
    with pytest.raises(jbprofile.PointRefused, match=r"weak scaling: gbs_800m = .* has no whole per-device batch on 1"
                       r"\. Fix: set global_batch_size for this point, or scaling = strong"):
        jbprofile.build_settings("llm", ["A100"], {"devices_per_node": "1"}, "run", uneven)
    with pytest.raises(jbprofile.ConfigError, match="scaling = 'linear' is neither weak nor strong"):
        jbprofile.build_settings("llm", ["A100"], {}, "run", {**env, "JOULEBENCH_SCALING": "linear"})


def test_efficiency_is_per_device_throughput_against_the_group_s_one_device_point() -> None:
    point = jbscaling.ScalingPoint
    rows = jbscaling.efficiencies([
        point("a1", "gpt", "weak", 1, 1000.0), point("a2", "gpt", "weak", 2, 1900.0),
        point("a4", "gpt", "weak", 4, None),  # failed: no throughput
        point("b2", "gpt-gbs8", "strong", 2, 1500.0),  # its group has no one-device point
        point("i1", "inference", "", 1, 50.0)])
    assert rows["a1"] == {"scaling": "weak", "scaling_efficiency": "100.0%"}
    assert rows["a2"]["scaling_efficiency"] == f"{100 * 1900.0 / 2 / 1000.0:.1f}%"
    assert rows["a4"]["scaling_efficiency"] == rows["b2"]["scaling_efficiency"] == "n/a"
    assert rows["i1"] == {"scaling": "-", "scaling_efficiency": "-"}


@requires_jube
def test_a_devices_sweep_on_a_job_bound_to_two_of_four_gpus(jube_env: dict[str, str], tmp_path: Path) -> None:
    """One JUBE run, devices_per_node = 1,2,4 on a host of 4 GPUs whose caller binds GPUs 1 and 2: 1 and 2 ranks run
    (the bound GPUs alone in the headline, the idle two on the whole-node line), 4 is INVALID before any job; the
    scaling table gives each row's efficiency against the 1-device row. Run by benchmarks/whole_node_jube.py, as on
    the GPU host: every headline agrees with an independent read of the job's GPUs (the fake NVML on one timeline)."""
    env, called = _no_slurm(with_fake_nvml(jube_env), tmp_path)
    env.update({"JPWR_FAKE_NVML_DEVICES": str(GPUS),
                "JPWR_FAKE_NVML_ORIGIN_NS": str(time.monotonic_ns()),
                "CUDA_VISIBLE_DEVICES": "1,2", "JOULEBENCH_METER_WHOLE_NODE": "yes",
                "JOULEBENCH_LOCAL_DRIVER_DEVICE": "cpu", "JOULEBENCH_LOCAL_GBS_TINY": "4",
                "JOULEBENCH_LLM_WARMUP_ITERATIONS": "1", "JOULEBENCH_SWEEP_DEVICES_PER_NODE": "1,2,4"})
    _gpu_host(tmp_path)  # the stand-in nvidia-smi, in the bin directory of _no_slurm
    script = subprocess.run([sys.executable, str(WHOLE_NODE_SCRIPT), "--out", str(tmp_path / "wn"), "--",
                             str(LLM_XML), "--tag", "local", "tiny"], env=env, capture_output=True, text=True,
                            timeout=900)
    out = tmp_path / "wn" / "jube"
    assert (tmp_path / "wn" / "whole_node.json").is_file(), script.stdout[-2000:] + script.stderr[-3000:]
    shown = jube("result", str(out), env=env).stdout
    rows = read_table(out, "llm")
    assert [(r["Devices/node"], r["Status"]) for r in rows] == [("1", "OK"), ("2", "OK"), ("4", "INVALID")], rows
    assert "Fix: use devices_per_node <= 2 on this machine" in rows[2]["Note"]
    records = {}
    for workdir in submit_workdirs(out):
        settings = jbsettings.read_settings(workdir / "job.env")
        if settings["JB_STATUS"] == "OK":
            records[settings["JB_WORLD_SIZE"]] = json.loads((workdir / "run" / "run_record.json").read_text())
    for devices, bound in (("1", [1]), ("2", [1, 2])):
        record = records[devices]
        steady = next(w for w in record["windows"] if w["name"] == "steady")["energy"]
        assert [d["index"] for d in steady["per_device"]] == bound
        assert sorted(d["index"] for d in steady["outside_job"]) == sorted(set(range(GPUS)) - set(bound))
        assert (record["config"]["scaling"], record["config"]["devices"]) == ("weak", int(devices))
        assert record["config"]["global_batch_size"] == 4 * int(devices)  # the per-device batch stays
        assert record["launch"]["world_size"] == int(devices)
    scaling = default_table(shown, "llm_scaling")
    assert [(r["Devices"], r["Scaling"]) for r in scaling] == [("1", "weak"), ("2", "weak"), ("n/a", "n/a")]
    one, two = (records[d]["metrics"]["tokens_per_s"] for d in ("1", "2"))
    assert [r["Efficiency"] for r in scaling] == ["100.0%", f"{100 * two / 2 / one:.1f}%", "n/a"]
    assert [r["Efficiency vs 1 device"] for r in rows] == [r["Efficiency"] for r in scaling]
    checked = json.loads((tmp_path / "wn" / "whole_node.json").read_text())
    assert [(r["status"], r.get("devices"), r["within"]) for r in checked] == [
        ("OK", 1, "yes"), ("OK", 2, "yes"), ("INVALID", None, "n/a: no steady window")], script.stdout[-3000:]
    assert all(r["outside_j"] > 0 and r["independent_others_j"] > 0 for r in checked[:2])
    assert all(r["diff_pct"] == pytest.approx(100 * (r["job_j"] - r["independent_j"]) / r["independent_j"])
               for r in checked[:2])
    assert script.returncode == 0 and (tmp_path / "wn" / "whole_node.md").read_text().count("\n| ") == 4
    assert not called.exists()
