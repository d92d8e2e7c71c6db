"""`python -m joulebench.device_settings --vendor amd`: the same verbs on AMD GPUs through amdsmi, in real processes,
with fake GPUs at amdsmi whose settings and call log live in a file shared between processes (tests/fakes/amdsmi)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jpwr.errors import ExitCode

DEVICE_SETTINGS = [sys.executable, "-m", "joulebench.device_settings"]
AMD = ["--vendor", "amd", "--device-settings", "allowed"]
DEFAULTS = {"power_cap_uw": 500_000_000, "gfx_range_mhz": [500, 1700], "perf_level": "AMDSMI_DEV_PERF_LEVEL_AUTO"}


@pytest.fixture
def node(fake_env, tmp_path):
    """A node with 2 fake MI300X GCDs that accept set calls (root on a real node), and our state file."""
    fake_state = tmp_path / "amd-gpus.json"
    env = fake_env(JPWR_FAKE_AMDSMI_STATE=str(fake_state), JPWR_FAKE_AMDSMI_PRIVILEGED="1", SLURMD_NODENAME="n1")
    for name in ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "SLURM_JOB_ID"):
        env.pop(name, None)

    class Node:
        environ = env
        state = tmp_path / "settings-state.json"

        def run(self, *args: str, **extra: str) -> subprocess.CompletedProcess:
            return subprocess.run([*DEVICE_SETTINGS, *args], env={**env, **extra}, capture_output=True, text=True,
                                  timeout=120, cwd=tmp_path)

        def devices(self) -> dict[str, dict]:
            """uuid -> the settings the fake GPU holds now (absent before any settings call)."""
            return json.loads(fake_state.read_text())["devices"] if fake_state.exists() else {}

        def calls(self) -> list[dict]:
            return json.loads(fake_state.read_text())["calls"] if fake_state.exists() else []

        def set_calls(self) -> list[str]:
            return [c["call"] for c in self.calls()]

        def preset(self, **settings: object) -> None:
            """Settings an admin made before the job (written where the fake reads them)."""
            uuids = [f"{i:08x}-0000-1000-80d9-fa4e0000000{i}" for i in range(2)]
            fake_state.write_text(json.dumps({"devices": {u: {**DEFAULTS, **settings} for u in uuids}, "calls": []}))

    return Node()


def _at_defaults(node) -> bool:
    return len(node.devices()) == 2 and all(d == DEFAULTS for d in node.devices().values())


def test_probe_reads_power_cap_clock_range_and_level_and_changes_nothing(node) -> None:
    result = node.run("probe", *AMD, "--power-limit", "300", "--sm-clock", "1234")
    assert result.returncode == 0, result.stderr
    assert "power limit 500 W (default 500, range 100-500 W)" in result.stdout
    assert "supported 500-1700 MHz" in result.stdout and "held by a clock setting: no" in result.stdout
    assert "permitted through amdsmi (uid 0" in result.stdout
    assert node.set_calls() == []


def test_apply_then_restore_in_separate_processes_puts_back_cap_range_and_level(node, tmp_path) -> None:
    record = tmp_path / "settings.json"
    result = node.run("apply", *AMD, "--power-limit", "300", "--sm-clock", "1234", "--state", str(node.state),
                      "--record", str(record))
    assert result.returncode == 0, result.stderr
    applied = json.loads(record.read_text())
    assert applied["route"] == "amdsmi" and len(applied["devices"]) == 2
    for device in applied["devices"]:
        assert device["prior_power_limit_w"] == 500 and device["power_limit_w"] == 300
        assert device["locked_sm_clock_mhz"] == 1234  # any MHz of the range, not the nearest DPM level
        assert device["supported_sm_clock_range_mhz"] == [500, 1700]  # the range the probe reads (above)
        assert device["clock_held_by_setting"] is True
    assert all(d == {"power_cap_uw": 300_000_000, "gfx_range_mhz": [1234, 1234],
                     "perf_level": "AMDSMI_DEV_PERF_LEVEL_MANUAL"} for d in node.devices().values())
    saved = json.loads(node.state.read_text())
    assert [(d["prior_power_limit_mw"], d["prior_sm_clock_range_mhz"], d["touched"]) for d in saved["devices"]] == [
        (500_000, [500, 1700], ["power_limit", "sm_clock"])] * 2

    # as the epilog runs it, without --vendor: the state file's route says amdsmi
    result = node.run("restore", "--device-settings", "allowed", "--state", str(node.state))
    assert result.returncode == 0, result.stderr
    assert _at_defaults(node) and not node.state.exists()
    assert node.set_calls()[-3:] == ["amdsmi_set_power_cap", "amdsmi_set_gpu_clk_range", "amdsmi_set_gpu_perf_level"]


def test_a_clock_an_admin_set_is_not_swept_but_the_power_cap_is(node) -> None:
    node.preset(perf_level="AMDSMI_DEV_PERF_LEVEL_DETERMINISM")
    refused = node.run("apply", *AMD, "--sm-clock", "1200", "--state", str(node.state))
    assert refused.returncode == ExitCode.NO_PERMISSION
    assert "performance level is not AUTO" in refused.stderr and "amd-smi set --perf-level AUTO" in refused.stderr
    assert node.set_calls() == [] and not node.state.exists()
    power = node.run("apply", *AMD, "--power-limit", "250", "--state", str(node.state))
    assert power.returncode == 0, power.stderr
    assert node.run("restore", *AMD, "--state", str(node.state)).returncode == 0
    assert all(d["power_cap_uw"] == 500_000_000 and d["perf_level"].endswith("DETERMINISM")
               for d in node.devices().values())


def test_out_of_range_values_are_refused_before_any_change(node) -> None:
    for option, value, text in (("--power-limit", "600", "outside the range"), ("--sm-clock", "2100",
                                                                                  "500-1700 MHz")):
        result = node.run("apply", *AMD, option, value, "--state", str(node.state))
        assert result.returncode == ExitCode.USAGE and text in result.stderr
    assert node.set_calls() == [] and not node.state.exists()


def test_a_refused_set_call_rolls_back_and_names_the_call(node) -> None:
    """The site allows settings and the process is root, but the driver refuses (e.g. a VM guest)."""
    result = node.run("apply", *AMD, "--power-limit", "300", "--state", str(node.state),
                      JPWR_FAKE_AMDSMI_PRIVILEGED="0")
    assert result.returncode == ExitCode.IO
    assert "amdsmi amdsmi_set_power_cap" in result.stderr and "every device is back" in result.stderr
    assert not node.state.exists()


def test_hold_restores_on_sigterm(node, tmp_path) -> None:
    record = tmp_path / "settings-n1.json"
    hold = subprocess.Popen([*DEVICE_SETTINGS, "hold", *AMD, "--power-limit", "400", "--sm-clock", "1100",
                             "--state", str(node.state), "--record", str(tmp_path / "settings-{node}.json")],
                            env=node.environ, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not record.exists() and hold.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert record.exists(), hold.communicate(timeout=30)
    assert all(d["gfx_range_mhz"] == [1100, 1100] for d in node.devices().values())
    hold.send_signal(signal.SIGTERM)
    _, stderr = hold.communicate(timeout=60)
    assert hold.returncode == 0, stderr
    assert _at_defaults(node) and not node.state.exists()
    assert json.loads(Path(record).read_text())["restore"] == {"status": "restored", "stopped_by": "SIGTERM"}


def test_devices_are_chosen_by_hip_index_or_refused_by_name(node) -> None:
    one = node.run("probe", *AMD, "--power-limit", "300", "--devices", "1")
    assert one.returncode == 0, one.stderr
    assert "device 1 (" in one.stdout and "device 0 (" not in one.stdout
    visible = node.run("probe", *AMD, "--power-limit", "300", ROCR_VISIBLE_DEVICES="0")
    assert "device 0 (" in visible.stdout and "device 1 (" not in visible.stdout, visible.stderr
    missing = node.run("probe", *AMD, "--power-limit", "300", "--devices", "5")
    assert missing.returncode == ExitCode.USAGE and "'5' matches no single GPU of 2" in missing.stderr
