"""The inference JUBE workflow: profile resolution for every system, and a real local run with fake NVML."""

from __future__ import annotations

import importlib.util
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from llm_inference.cli import main
from tests.jube.conftest import read_table, without_profile_overrides
from tests.jube.test_static import assert_patterns_match

REPO = Path(__file__).resolve().parents[2]
JUBE_DIR = REPO / "jube"
_spec = importlib.util.spec_from_file_location("jbprofile", JUBE_DIR / "jbprofile.py")
jbprofile = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("jbprofile", jbprofile)
_spec.loader.exec_module(jbprofile)


def _fake_sbatch_env(tmp_path: Path) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "sbatch").chmod(0o755)
    return {"PATH": f"{bin_dir}:/usr/bin:/bin"}


def test_every_system_resolves_to_one_device_and_passes_the_drivers_validate(tmp_path, capsys, roomy_host):
    env = _fake_sbatch_env(tmp_path)
    rejected = []
    for system in jbprofile.system_names(env):
        if jbprofile.load_profile(system, env)["unsupported"]:
            with pytest.raises(jbprofile.ConfigError, match="cannot run the llm_inference driver"):
                jbprofile.build_settings("inference", [system], {}, "run", env)
            continue
        for model in (None, *jbprofile.WORKLOADS["inference"].model_tags):
            tags = [system] if model is None else [system, model]
            settings = jbprofile.build_settings("inference", tags, {}, "run", env)
            assert (settings["JB_NODES"], settings["JB_WORLD_SIZE"], settings["JB_DRIVER_COMMAND"]) == ("1", "1", "run")
            args = shlex.split(settings["JB_VALIDATE_ARGS"])
            if model == "gpt2" and "summarization" in args:
                continue  # GPT-2's 1024 positions cannot hold it; validate says so (test_validation)
            if main(["validate", *args]) != 0:
                rejected.append((system, model, capsys.readouterr().err.strip()))
    assert not rejected, "\n".join(map(str, rejected))
    with pytest.raises(jbprofile.ConfigError, match="unknown tag '800M' for the inference workflow"):
        jbprofile.build_settings("inference", ["CI", "800M"], {}, "run", env)


@pytest.mark.skipif(shutil.which("jube") is None, reason="JUBE not installed (apt-get install jube)")
def test_local_workflow_sweeps_batch_sizes_into_the_result_table(tmp_path, h100_trace_dir):
    env = without_profile_overrides()
    env.update(JOULEBENCH_PYTHON=sys.executable, JOULEBENCH_SWEEP_BATCH_SIZE="1,2", JOULEBENCH_JPWR_METHODS="nvml",
               JPWR_FAKE_NVML_TRACE=str(h100_trace_dir),
               PYTHONPATH=os.pathsep.join([str(REPO / "tests" / "fakes"), str(REPO), env.get("PYTHONPATH", "")]))
    out = tmp_path / "runs"
    proc = subprocess.run(["jube", "run", str(JUBE_DIR / "inference_benchmark.xml"), "-o", str(out),
                           "--hide-animation", "-e", "-a", "-r"], env=env, cwd=REPO, capture_output=True, text=True,
                          timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = read_table(out, "inference")
    assert [(r["Model"], r["Task"], r["Batch"], r["Status"]) for r in rows] == [
        ("tiny", "tiny", "1", "OK"), ("tiny", "tiny", "2", "OK")]
    for row in rows:  # energy from the fake H100 through the job's `jpwr serve`
        assert float(row["J/output token"]) > 0 and float(row["Decode J/token bound"]) > 0
        assert row["Energy method"] == "counter+power" and float(row["Output tokens/s"]) > 0


def test_serving_points_resolve_to_load_and_pass_the_drivers_validate_load(tmp_path, capsys):
    """A rate makes the point a serving point: `load` with the profile's slots and SLOs, validated by validate-load;
    the static-only parameters read `-` there and the serving ones `-` on static points."""
    env = _fake_sbatch_env(tmp_path)
    rejected = []
    for system in jbprofile.system_names(env):
        if jbprofile.load_profile(system, env)["unsupported"]:
            continue
        settings = jbprofile.build_settings("inference", [system], {"rate": "max"}, "run", env)
        assert settings["JB_DRIVER_COMMAND"] == "load"
        assert (settings["JB_COORD_RATE"], settings["JB_COORD_BATCH_SIZE"]) == ("max", "-")
        args = shlex.split(settings["JB_VALIDATE_ARGS"])
        assert "--max-concurrency" in args and "--batch-size" not in args
        if main(["validate-load", *args]) != 0:
            rejected.append((system, capsys.readouterr().err.strip()))
    assert not rejected, "\n".join(map(str, rejected))
    static = jbprofile.build_settings("inference", ["CI"], {"max_concurrency": "8"}, "run", env)
    assert static["JB_DRIVER_COMMAND"] == "run" and static["JB_COORD_MAX_CONCURRENCY"] == "-"
    assert "max_concurrency=8 ignored" in static["JB_NOTE"]
    with pytest.raises(jbprofile.PointRefused, match=r"engine=hf with rate set: .* CI has no server_hf"):
        jbprofile.build_settings("inference", ["CI"], {"rate": "4", "engine": "hf"}, "run", env)
    with pytest.raises(jbprofile.PointRefused, match=r"inference_checkpoint is empty.*save-checkpoint"):
        jbprofile.build_settings("inference", ["CI"], {"rate": "4", "engine": "transformers"}, "run", env)


def test_a_server_engine_resolves_to_its_profile_template(tmp_path, capsys):
    """engine=<name> on a serving point: the profile's server_<name> template, version command and request extras
    become the driver's options (validated by validate-load: every shipped template renders), the engine a column;
    the port is the job's (jbport.py, added by job.sh)."""
    env = {**_fake_sbatch_env(tmp_path), "JOULEBENCH_INFERENCE_CHECKPOINT": str(tmp_path / "ckpt")}
    assert main(["save-checkpoint", "--preset", "tiny", "--out", str(tmp_path / "ckpt")]) == 0
    for engine in ("transformers", "vllm", "sglang", "tgi"):
        settings = jbprofile.build_settings("inference", ["CI"], {"rate": "4", "engine": engine}, "run", env)
        assert settings["JB_COORD_ENGINE"] == engine and settings["JB_SERVER"] == "yes"
        args = shlex.split(settings["JB_VALIDATE_ARGS"])
        assert args[args.index("--engine-name") + 1] == engine and "--server-port" not in args
        assert "{model}" in args[args.index("--server-command") + 1]
        assert main(["validate-load", *args]) == 0, capsys.readouterr().err
    extra = shlex.split(jbprofile.build_settings("inference", ["CI"], {"rate": "4", "engine": "vllm"}, "run",
                                                 env)["JB_VALIDATE_ARGS"])
    assert extra[extra.index("--request-extra") + 1] == '{"ignore_eos": true}'
    continuous = jbprofile.build_settings("inference", ["CI"], {"rate": "4"}, "run", env)
    assert continuous["JB_COORD_ENGINE"] == "continuous" and not continuous["JB_SERVER"]
    assert "JB_SERVER" in (JUBE_DIR / "job.sh").read_text()
    with pytest.raises(jbprofile.PointRefused, match="max_concurrency=0 is out of range"):
        jbprofile.build_settings("inference", ["CI"], {"rate": "4", "max_concurrency": "0"}, "run", env)


@pytest.mark.skipif(shutil.which("jube") is None, reason="JUBE not installed (apt-get install jube)")
def test_local_workflow_sweeps_rates_into_the_result_table(tmp_path, h100_trace_dir):
    """A real `jube run` of the serving mode: rate 0 is refused by validate-load before anything runs (an INVALID row
    naming --rate), rates 40 and max each run `llm_inference load` as one job under the job's sampler; once the
    samplers stopped, the job fits each rate's per-request energy on the node's trace (jbrecord.py finalize)."""
    env = without_profile_overrides()  # 3 s windows: 30 counter periods of the fake H100, the per-request fit needs 20
    env.update(JOULEBENCH_PYTHON=sys.executable, JOULEBENCH_SWEEP_RATE="0,40,max", JOULEBENCH_JPWR_METHODS="nvml",
               JOULEBENCH_SWEEP_MAX_CONCURRENCY="4", JOULEBENCH_SWEEP_STEADY_SECONDS="3",
               JPWR_FAKE_NVML_TRACE=str(h100_trace_dir),
               PYTHONPATH=os.pathsep.join([str(REPO / "tests" / "fakes"), str(REPO), env.get("PYTHONPATH", "")]))
    out = tmp_path / "runs"
    proc = subprocess.run(["jube", "run", str(JUBE_DIR / "inference_benchmark.xml"), "-o", str(out),
                           "--hide-animation", "-a", "-r"], env=env, cwd=REPO, capture_output=True, text=True,
                          timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = read_table(out, "inference")
    assert [(r["Model"], r["Rate req/s"], r["Slots"], r["Batch"], r["Engine"], r["Status"]) for r in rows] == [
        ("tiny", "0", "4", "-", "continuous", "INVALID"), ("tiny", "40", "4", "-", "continuous", "OK"),
        ("tiny", "max", "4", "-", "continuous", "OK")], proc.stdout[-3000:]
    assert "--rate" in rows[0]["Note"] and "0" in rows[0]["Note"]
    for row in rows[1:]:
        assert float(row["TTFT p90(s)"]) > 0 and float(row["Per-token latency p90(s)"]) > 0
        assert float(row["Goodput req/s"]) >= 0 and float(row["Requests/s"]) > 0
        assert float(row["J/output token"]) > 0 and row["Energy method"] == "counter+power"
        for column in ("J/request p50", "J/request p90", "Prefill share", "Decode share", "Idle share"):
            assert row[column] == "n/a" or float(row[column]) > 0, (column, row[column])  # never 0
        # Fitted after the job on the node's trace: J/request and the idle share, prefill and decode where the fit
        # splits them, the model's checks; or the note says why not (the fit's own reason, never "waits for a trace").
        assert "no in-process trace" not in row["Note"] and "not fitted after the job" not in row["Note"], row["Note"]
        if row["J/request p50"] == "n/a":
            assert "J/request and shares n/a: fit refused: " in row["Note"], row["Note"]
            continue
        assert float(row["J/request p90"]) >= float(row["J/request p50"]) > 0 and float(row["Idle share"]) > 0, row
        if row["Prefill share"] == "n/a":
            assert "prefill/decode shares n/a: " in row["Note"], row["Note"]
        assert "J/request model checks" in row["Note"], row["Note"]
    assert any(row["J/request p50"] != "n/a" for row in rows[1:]), [row["Note"] for row in rows]
    results = sorted((out / "000000").glob("*_submit/work/result.txt"))
    assert len(results) == 3
    for result in results:  # every pattern of the workflow, static and serving ones, matches each row's result.txt
        assert_patterns_match(JUBE_DIR / "inference_benchmark.xml", result.read_text())
    assert [r["Slowdown vs default"] for r in rows] == ["-", "-", "-"]  # no GPU setting swept: the compare step ran
    pretty = (out / "000000" / "result" / "inference.dat").read_text()
    # The default table (160 columns): each row's point by its rate, the headline figures; the serving columns
    # (p90s, goodput, J per request, shares) are the full table's, checked above.
    assert all(title in pretty for title in ("Point", "TTFT(s)", "s/token", "J/token", "Cov %", "Reason")), pretty
    assert "rate=40" in pretty and "rate=max" in pretty and max(map(len, pretty.splitlines())) <= 160, pretty


def test_tensor_parallel_points_get_one_node_of_that_many_ranks_or_an_invalid_row(tmp_path, capsys):
    env = _fake_sbatch_env(tmp_path)
    settings = jbprofile.build_settings("inference", ["H100", "llama-8b"], {"tensor_parallel": "4"}, "run", env)
    assert (settings["JB_NODES"], settings["JB_TASKS_PER_NODE"], settings["JB_WORLD_SIZE"]) == ("1", "4", "4")
    assert settings["JB_COORD_TENSOR_PARALLEL"] == "4"
    args = shlex.split(settings["JB_VALIDATE_ARGS"])
    assert args[args.index("--tensor-parallel") + 1] == "4" and main(["validate", *args]) == 0
    serving = jbprofile.build_settings("inference", ["H100"], {"tensor_parallel": "2", "rate": "max"}, "run", env)
    assert "--tensor-parallel 2" in serving["JB_TRAIN_ARGS"] and serving["JB_DRIVER_COMMAND"] == "load"
    with pytest.raises(jbprofile.PointRefused, match="tensor_parallel=3 does not divide the 4 devices"):
        jbprofile.build_settings("inference", ["H100"], {"tensor_parallel": "3"}, "run", env)
    with pytest.raises(jbprofile.PointRefused, match="tensor_parallel=2 does not divide the 1 devices of a CI node"):
        jbprofile.build_settings("inference", ["CI"], {"tensor_parallel": "2"}, "run", env)
    # local counts the GPUs of this host: on a CPU host one "device", which 2 ranks cannot divide
    with pytest.raises(jbprofile.PointRefused, match="tensor_parallel=2 does not divide the 1 devices of a local node"):
        jbprofile.build_settings("inference", ["local"], {"tensor_parallel": "2"}, "run", env)
    # the heads' divisibility is the driver's: validate refuses what the preset cannot split
    tiny = jbprofile.build_settings("inference", ["H100", "tiny"], {"tensor_parallel": "4"}, "run", env)
    assert main(["validate", *shlex.split(tiny["JB_VALIDATE_ARGS"])]) == 64
    assert "does not divide the 2 KV heads of tiny" in capsys.readouterr().err
