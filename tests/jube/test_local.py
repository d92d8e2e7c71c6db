"""The `local` system: no Slurm at all, the job script runs on this machine inside `jube run`."""

from __future__ import annotations

from pathlib import Path

from tests.jube.conftest import LLM_XML, RESNET_XML, jube, jube_run, read_table, requires_jube, submit_workdirs
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


def test_local_llm_tagged_and_resnet50_untagged_run_without_slurm(jube_env: dict[str, str], tmp_path: Path) -> None:
    """This machine has no GPU: the CPU-sized settings, said in the note. ResNet-50 without a system tag is
    `local` too, in fp32 at 64 px, with a progress line per iteration in the job log."""
    env, called = _no_slurm(jube_env, tmp_path)
    runs = {"llm": (LLM_XML, ["local", "tiny"], "llm_csv"), "resnet": (RESNET_XML, ["pytorch"], "resnet50_csv")}
    for name, (xml, tags, table) in runs.items():
        out = tmp_path / name
        proc = jube_run(xml, tags, out, env)  # local jobs finish inside `jube run`: no continue
        assert "FINISHED" in jube("status", str(out), env=env).stdout, proc.stdout
        jube("result", "-a", str(out), env=env)
        (row,) = read_table(out, table)
        assert (row["JobID"], row["System"], row["Devices"], row["Status"], row["Precision"]) == (
            "local", "local", "1", "OK", "fp32"), row
        assert row["Energy(Wh)"] == "n/a" and row["Note"].startswith(f"{CPU_NOTE}; energy n/a: "), row
        (workdir,) = submit_workdirs(out)
        assert_patterns_match(xml, (workdir / "result.txt").read_text())
        assert "finished: status OK" in (workdir / "job.err").read_text()
    (llm,) = read_table(tmp_path / "llm", "llm_csv")
    assert llm["Model"] == "tiny" and float(llm["Tokens/s"]) > 0
    (resnet,) = read_table(tmp_path / "resnet", "resnet50_csv")
    assert (resnet["Model"], resnet["Image px"], resnet["GBS"]) == ("resnet50-pytorch", "64", "8")
    progress = [line for line in (submit_workdirs(tmp_path / "resnet")[0] / "job.out").read_text().splitlines()
                if line.startswith("[resnet50] step ")]
    assert len(progress) == 12 and "ETA" in progress[0]  # 2 warm-up + 10 measured iterations
    assert not called.exists(), f"the local workflow called Slurm: {called.read_text()}"
