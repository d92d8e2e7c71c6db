"""The `local` system: no Slurm at all, the job script runs on this machine inside `jube run`."""

from __future__ import annotations

from pathlib import Path

from tests.jube.conftest import LLM_XML, jube, jube_run, read_table, requires_jube, submit_workdirs
from tests.jube.test_static import assert_patterns_match

pytestmark = requires_jube


def _no_slurm(env: dict[str, str], tmp_path: Path) -> tuple[dict[str, str], Path]:
    """sbatch/srun on PATH that only leave a trace: the local workflow must never call them."""
    bin_dir, called = tmp_path / "bin", tmp_path / "slurm-called"
    bin_dir.mkdir()
    for name in ("sbatch", "srun", "squeue", "scancel"):
        tool = bin_dir / name
        tool.write_text(f"#!/bin/sh\necho {name} >> {called}\nexit 1\n")
        tool.chmod(0o755)
    return {**env, "PATH": f"{bin_dir}:{env['PATH']}", "JOULEBENCH_LLM_ITERATIONS": "3"}, called


def test_local_tiny_and_no_tag_run_without_slurm(jube_env: dict[str, str], tmp_path: Path) -> None:
    env, called = _no_slurm(jube_env, tmp_path)
    for name, tags in (("tagged", ["local", "tiny"]), ("untagged", [])):
        out = tmp_path / name
        proc = jube_run(LLM_XML, tags, out, env)  # local jobs finish inside `jube run`: no continue
        assert "FINISHED" in jube("status", str(out), env=env).stdout, proc.stdout
        jube("result", "-a", str(out), env=env)
        (row,) = read_table(out, "llm_csv")
        assert (row["JobID"], row["System"], row["Model"], row["Devices"], row["Status"]) == (
            "local", "local", "tiny", "1", "OK"), row
        assert float(row["Tokens/s"]) > 0
        assert row["Energy(Wh)"] == "n/a" and row["Note"].startswith("energy n/a: ")
        assert_patterns_match(LLM_XML, (submit_workdirs(out)[0] / "result.txt").read_text())
    assert not called.exists(), f"the local workflow called Slurm: {called.read_text()}"
