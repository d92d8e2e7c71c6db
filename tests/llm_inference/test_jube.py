"""The inference JUBE workflow: profile resolution for every system, and a real local run with fake NVML."""

from __future__ import annotations

import csv
import importlib.util
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from llm_inference.cli import main

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


def test_every_system_resolves_to_one_device_and_passes_the_drivers_validate(tmp_path, capsys):
    env = _fake_sbatch_env(tmp_path)
    rejected = []
    for system in jbprofile.system_names(env):
        if jbprofile.load_profile(system, env)["unsupported"]:
            with pytest.raises(jbprofile.ConfigError, match="cannot run the llm_inference driver"):
                jbprofile.build_settings("inference", [system], {}, "run", env)
            continue
        for model in (None, *jbprofile.INFERENCE_MODEL_TAGS):
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
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("JOULEBENCH_")}
    env.update(JOULEBENCH_PYTHON=sys.executable, JOULEBENCH_SWEEP_BATCH_SIZE="1,2", JOULEBENCH_JPWR_METHODS="nvml",
               JPWR_FAKE_NVML_TRACE=str(h100_trace_dir),
               PYTHONPATH=os.pathsep.join([str(REPO / "tests" / "fakes"), str(REPO), env.get("PYTHONPATH", "")]))
    out = tmp_path / "runs"
    proc = subprocess.run(["jube", "run", str(JUBE_DIR / "inference_benchmark.xml"), "-o", str(out),
                           "--hide-animation", "-e", "-a", "-r"], env=env, cwd=REPO, capture_output=True, text=True,
                          timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with (out / "000000" / "result" / "inference_csv.dat").open() as handle:
        rows = list(csv.DictReader(handle))
    assert [(r["Model"], r["Task"], r["Batch"], r["Status"]) for r in rows] == [
        ("tiny", "tiny", "1", "OK"), ("tiny", "tiny", "2", "OK")]
    for row in rows:  # energy from the fake H100 through the job's `jpwr serve`
        assert float(row["J/output token"]) > 0 and float(row["Decode J/token bound"]) > 0
        assert row["Energy method"] == "counter+power" and float(row["Output tokens/s"]) > 0
