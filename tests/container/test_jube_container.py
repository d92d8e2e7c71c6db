"""The `container` tag through real JUBE (Debian's 2.5.1) on the `local` system: without a runtime the
validate step stops with the fix and nothing is submitted; with the fake `apptainer` (Apptainer cannot run
on CI) and an image in place, validate, sampler, ranks, combine and finalize all go through the launcher."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from tests.container.conftest import FAKE_BIN, REPO, jbcontainer
from tests.jube.conftest import LLM_XML, jube, jube_run, read_table, requires_jube


def workflow_env(tmp_path: Path, with_runtime: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith(("JOULEBENCH_", "APPTAINER_"))}
    env.update(JOULEBENCH_PYTHON=sys.executable, JOULEBENCH_CONTAINER_DIR=str(tmp_path / "sif"),
               PYTHONPATH=str(REPO), FAKE_APPTAINER_LOG=str(tmp_path / "apptainer.log"))
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if not (Path(p) / "apptainer").exists())
    if with_runtime:
        env["PATH"] = f"{FAKE_BIN}{os.pathsep}{env['PATH']}"
    return env


@requires_jube
def test_missing_runtime_stops_the_validate_step(tmp_path: Path) -> None:
    out = tmp_path / "runs"
    jube_run(LLM_XML, ["local", "container"], out, workflow_env(tmp_path, with_runtime=False))
    assert "ERROR" in jube("status", str(out), env=workflow_env(tmp_path, False)).stdout
    stderr = next(out.glob("000000/*_validate/work/stderr")).read_text()
    assert "neither apptainer nor singularity is on PATH" in stderr and "Fix: load it" in stderr
    assert not list(out.glob("000000/*_submit"))  # nothing submitted


@requires_jube
def test_job_runs_every_step_inside_the_image(tmp_path: Path) -> None:
    image = tmp_path / "sif" / f"nvidia-pytorch-{jbcontainer.host_arch()}.sif"
    image.parent.mkdir()
    image.write_text("stands in for a built image")
    out = tmp_path / "runs"
    env = workflow_env(tmp_path, with_runtime=True)
    jube_run(LLM_XML, ["local", "container"], out, env)
    jube("result", "-a", str(out), env=env)
    [row] = read_table(out, "llm")
    assert row["Status"] == "OK", row
    workdir = next(out.glob("000000/*_submit/work")).resolve()
    record = json.loads((workdir / "run" / "run_record.json").read_text())
    assert record["status"] == "OK"

    calls = [line.split("\t") for line in (tmp_path / "apptainer.log").read_text().splitlines()]
    prefix = f"exec --bind {REPO} {image} {sys.executable}"
    commands = [argv.removeprefix(prefix).split()[:3] for _, argv in calls]
    assert all(argv.startswith(prefix) for _, argv in calls), calls  # local is a CPU system: no --nv/--rocm
    assert commands == [["-m", "llm_training", "validate"], ["-m", "jpwr", "serve"], ["-m", "llm_training", "train"],
                        ["-m", "jpwr", "combine"], [str(REPO / "jube" / "jbrecord.py"), "finalize", "--settings"],
                        [str(REPO / "jube" / "jbrecord.py"), "compare", "--rundir"]]
    validate_bind, *job_binds, compare_bind = [bind for bind, _ in calls]
    assert validate_bind == ""  # the login-node check needs only the repository
    assert all(bind.split(",")[0] == str(workdir) for bind in job_binds), job_binds
    assert compare_bind == str((out / "000000").resolve()), compare_bind  # compare reads every point's record
