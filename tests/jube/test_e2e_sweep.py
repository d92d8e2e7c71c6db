"""Power-limit and clock sweeps end to end (issue 18): real JUBE 2.5.1, the local Slurm cluster, fake GPUs at pynvml.

The fake GPUs' settings live in one state file per node (JPWR_FAKE_NVML_STATE with {node}), shared by every process
of a job (the guard that applies and restores, the sampler, the ranks) and read here from outside: what was applied,
and that every device is back at its defaults after OK, FAILED, TIMEOUT and CANCELLED jobs. The fake's clock response
scales power with the settings (tests/fakes/pynvml/device_state.py), so the table's figures move; the CPU ranks'
time does not respond to a clock, so the slowdowns are noise here, not a result.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.jube.conftest import (
    LLM_XML,
    continue_and_read,
    is_number,
    jube,
    jube_run,
    read_table,
    requires_slurm,
    submit_workdirs,
    wait_for_jobs,
    with_fake_nvml,
)
from tests.jube.test_e2e_slurm import _wait_for_text
from tests.jube.test_static import assert_patterns_match

pytestmark = requires_slurm
FAKE_DEFAULT_MW = 700_000  # the recorded H100's power limit: the fake GPUs' own setting


def _sweep_env(jube_env: dict[str, str], slurm_conf: Path, tmp_path: Path) -> dict[str, str]:
    """A site that allows settings (the profile key) and jobs that may make them (the fake's privilege flag)."""
    env = with_fake_nvml({**jube_env, "SLURM_CONF": str(slurm_conf)})
    env.update(JOULEBENCH_NODES="1", JOULEBENCH_VENDOR="nvidia", JOULEBENCH_DEVICE_SETTINGS="allowed",
               JOULEBENCH_LLM_ITERATIONS="40", JPWR_FAKE_NVML_PRIVILEGED="1",
               JPWR_FAKE_NVML_STATE=str(tmp_path / "gpus-{node}.json"),
               JOULEBENCH_DEVICE_SETTINGS_STATE_DIR=str(tmp_path / "settings-state"))
    return env


def _devices(tmp_path: Path) -> dict[str, dict]:
    """Every fake GPU any job touched, on every node: uuid@node -> its state."""
    found = {}
    for path in tmp_path.glob("gpus-*.json"):
        for uuid, device in json.loads(path.read_text())["devices"].items():
            found[f"{uuid}@{path.stem}"] = device
    return found


def _setting(workdir: Path, key: str) -> str:
    """A value job.env holds for this point (what jbprofile wrote for the job)."""
    return next(line.split("=", 1)[1].strip("'\"") for line in (workdir / "job.env").read_text().splitlines()
                if line.startswith(f"{key}="))


def _steady_energy(workdir: Path) -> dict:
    """The steady window's energy, its stated bound and its length, from the point's run record."""
    record = json.loads((workdir / "run" / "run_record.json").read_text())
    (steady,) = [w for w in record["windows"] if w["name"] == "steady"]
    return {**steady["energy"], "duration_s": steady["duration_s"]}


def _set_calls(tmp_path: Path) -> list[dict]:
    return [c for p in tmp_path.glob("gpus-*.json") for c in json.loads(p.read_text())["calls"]]


def test_a_power_limit_by_clock_sweep_applies_records_compares_and_restores_on_every_exit_path(
    slurm_cluster: Path, jube_env: dict[str, str], tmp_path: Path
) -> None:
    env = _sweep_env(jube_env, slurm_cluster, tmp_path)
    endless = {"JOULEBENCH_LLM_ITERATIONS": "1000000"}
    setting = {"JOULEBENCH_SWEEP_POWER_LIMIT": "400", "JOULEBENCH_SWEEP_SM_CLOCK": "1410"}
    cases = {
        "sweep": {"JOULEBENCH_SWEEP_POWER_LIMIT": ",500,400", "JOULEBENCH_SWEEP_SM_CLOCK": ",1410"},
        "FAILED": {**setting, "JOULEBENCH_DRIVER_DEVICE": "cuda"},  # passes validate, fails in the ranks
        "TIMEOUT": {**setting, **endless, "JOULEBENCH_TIME_LIMIT": "0:01:00"},  # the job's own stop budget
        "CANCELLED": {**setting, **endless},  # scancel: Slurm's TERM reaches every step, the guard's too
    }
    outs = {name: tmp_path / name.lower() for name in cases}
    for name, extra in cases.items():
        jube_run(LLM_XML, ["CI", "tiny"], outs[name], {**env, **extra})
    cancelled = submit_workdirs(outs["CANCELLED"])[0]
    _wait_for_text(cancelled / "job.out", "[llm_training] step ", timeout_s=300)
    assert any(d["power_limit_mW"] == 400_000 for d in _devices(tmp_path).values())  # held while it trains
    subprocess.run(["scancel", (cancelled / "job.id").read_text().strip()], env=env, check=True)
    for out in outs.values():
        wait_for_jobs(out, timeout_s=400)

    # One row per point, with what was asked, read back and observed, and the comparison with the default row.
    _, rows = continue_and_read(outs["sweep"], "llm", env)
    points = {(r["Power limit W asked"], r["SM MHz asked"]): r for r in rows}
    assert set(points) == {(p, c) for p in ("default", "500", "400") for c in ("default", "1410")}, rows
    for (power, clock), row in points.items():
        assert row["Status"] == "OK", row
        assert (row["Power limit W read back"], row["SM MHz locked"]) == (power, clock), row
        assert is_number(row["SM MHz mean"]) and float(row["Power/device(W)"]) > 0, row
        default = (power, clock) == ("default", "default")
        assert (row["Slowdown vs default"], row["Energy saving vs default"]) == ("+0.00%", "+0.00%") or not default
        assert row["Slowdown vs default"].endswith("%") and row["Energy saving vs default"].endswith("%"), row
    # The fake caps power at the limit (the replayed trace reaches ~700 W): the 400 W points' steady windows stay
    # at 400 W within their stated bound (a 2 s window of the tiny model has a bound of a few %).
    capped = [_steady_energy(w) for w in submit_workdirs(outs["sweep"]) if _setting(w, "JB_POWER_LIMIT") == "400"]
    assert len(capped) == 2 and all(float(points[("400", c)]["Power/device(W)"]) < 500 for c in ("default", "1410"))
    for energy in capped:
        assert (energy["energy_j"] - energy["error_bound_j"]) / energy["duration_s"] <= 400.0, energy
    assert len(list(outs["sweep"].glob("000000/*_compare/work/compare.txt"))) == 6  # each point copied its own
    for workdir in submit_workdirs(outs["sweep"]):
        run_id = _setting(workdir, "JB_RUN_ID")
        compared = (outs["sweep"] / "000000" / "compare" / f"{run_id}.txt").read_text()
        assert_patterns_match(LLM_XML, (workdir / "result.txt").read_text(), compared)
    applied = [c for c in _set_calls(tmp_path) if c["result"] == "ok"]
    assert {c["args"][0] for c in applied if c["function"] == "nvmlDeviceSetPowerManagementLimit"} >= {
        500_000, 400_000, FAKE_DEFAULT_MW}  # set, and set back

    # The other exit paths: the job's status, and the guard restored before the job ended.
    for name in ("FAILED", "TIMEOUT", "CANCELLED"):
        (workdir,) = submit_workdirs(outs[name])
        record = json.loads((workdir / "run" / "run_record.json").read_text())
        assert record["status"] == name, (name, record["status_reason"])
        (node,) = record["config"]["device_settings"]["nodes"]
        assert [d["power_limit_w"] for d in node["devices"]] == [400.0], name
        assert node["restore"]["status"] == "restored", (name, node["restore"])
        (row,) = continue_and_read(outs[name], "llm", env)[1]
        assert (row["Status"], row["Power limit W read back"], row["SM MHz locked"]) == (name, "400", "1410"), row
        assert "NOT restored" not in row["Note"], row
    # Every device every job touched is back at its own settings, and no state file is left for the epilog.
    devices = _devices(tmp_path)
    assert devices and all(d["power_limit_mW"] == FAKE_DEFAULT_MW and d["locked_clocks_MHz"] is None
                           for d in devices.values()), devices
    assert not list((tmp_path / "settings-state").glob("*.json"))


def test_a_site_without_the_opt_in_refuses_the_setting_before_submission_and_runs_the_default_row(
    slurm_cluster: Path, jube_env: dict[str, str], tmp_path: Path
) -> None:
    env = {**_sweep_env(jube_env, slurm_cluster, tmp_path), "JOULEBENCH_DEVICE_SETTINGS": "off",
           "JOULEBENCH_SWEEP_POWER_LIMIT": ",400"}
    out = tmp_path / "refused"
    jube_run(LLM_XML, ["CI", "tiny"], out, env)
    refused = [w for w in submit_workdirs(out) if not (w / "job.id").exists()]
    assert len(refused) == 1 and len(submit_workdirs(out)) == 2  # only the default row reached sbatch
    wait_for_jobs(out, timeout_s=300)
    jube("continue", str(out), "-a", "-r", "--hide-animation", env=env)
    rows = {r["Power limit W asked"]: r for r in read_table(out, "llm")}
    assert list(rows) == ["default", "400"]  # the sweep's order, though the refused point had its row first
    assert rows["default"]["Status"] == "OK" and rows["default"]["Slowdown vs default"] == "+0.00%"
    assert rows["400"]["Status"] == "INVALID" and rows["400"]["JobID"] == "n/a"
    note = rows["400"]["Note"]
    assert "power_limit=400 W" in note and "device settings are off for this system" in note and "Fix:" in note
    assert "ERROR" in jube("status", str(out), env=env).stdout  # the verdict step says a point was refused
    assert _set_calls(tmp_path) == []  # nothing anywhere tried to change a setting
