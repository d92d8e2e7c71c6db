"""`python -m joulebench.device_settings` as a job script and an epilog run it: real processes, fake GPUs at pynvml
(and a fake zeusd), device state shared through the fake's state file so that each step is checked from outside."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from joulebench.device_settings import (
    Authorization,
    Privileges,
    Request,
    SettingRefused,
    authorize,
    probe,
    setter_for,
)
from jpwr.errors import ExitCode
from tests.fakes import pynvml as fake_nvml

FAKES = Path(__file__).resolve().parents[1] / "fakes"
DEVICE_SETTINGS = [sys.executable, "-m", "joulebench.device_settings"]
ALLOWED = ["--device-settings", "allowed"]


@pytest.fixture
def gpus(fake_env, h100_trace_dir, tmp_path):
    """Environment of a node with 3 fake H100s whose settings live in tmp_path/gpus.json, and our state file."""
    fake_state = tmp_path / "gpus.json"
    env = fake_env(JPWR_FAKE_NVML_TRACE=str(h100_trace_dir), JPWR_FAKE_NVML_DEVICES="3",
                   JPWR_FAKE_NVML_STATE=str(fake_state), JPWR_FAKE_NVML_PRIVILEGED="1", SLURMD_NODENAME="n1")
    for name in ("CUDA_VISIBLE_DEVICES", "SLURM_JOB_ID", "SLURM_STEP_GPUS", "SLURM_JOB_GPUS", "SLURM_JOB_UID"):
        env.pop(name, None)

    class Node:
        environ = env
        state = tmp_path / "settings-state.json"

        def run(self, *args: str, extra_env: dict[str, str] | None = None, timeout: float = 120):
            return subprocess.run([*DEVICE_SETTINGS, *args], env={**env, **(extra_env or {})}, capture_output=True,
                                  text=True, timeout=timeout, cwd=tmp_path)

        def popen(self, *args: str, extra_env: dict[str, str]) -> subprocess.Popen:
            return subprocess.Popen([*DEVICE_SETTINGS, *args], env={**env, **extra_env}, cwd=tmp_path,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

        def devices(self) -> dict[str, dict]:
            """Each fake GPU's settings as the device holds them: uuid -> {power_limit_mW, locked_clocks_MHz}."""
            if not fake_state.exists():
                return {}
            return {uuid: {"power_limit_mW": d["power_limit_mW"], "locked_clocks_MHz": d["locked_clocks_MHz"]}
                    for uuid, d in json.loads(fake_state.read_text())["devices"].items()}

        def calls(self) -> list[dict]:
            return json.loads(fake_state.read_text())["calls"] if fake_state.exists() else []

    return Node()


def _default(node) -> int:
    meta = json.loads((Path(node.environ["JPWR_FAKE_NVML_TRACE"]) / "meta.json").read_text())
    return int(meta["power_limit_mW"])


def _at_defaults(node) -> bool:
    return all(d == {"power_limit_mW": _default(node), "locked_clocks_MHz": None} for d in node.devices().values())


def _one_line_error(result) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("joulebench device-settings: error: ") and ". Fix: " in lines[0]
    return lines[0]


# ---- the refusal path -------------------------------------------------------------------------------------------
def test_site_policy_off_refuses_every_verb_and_calls_no_set_function(gpus) -> None:
    """Off is the default; even a privileged process on GPUs that would accept the call changes nothing."""
    for verb in ("probe", "apply"):
        for policy in ([], ["--device-settings", "off"]):
            state = ["--state", str(gpus.state)] if verb == "apply" else []
            result = gpus.run(verb, *policy, "--power-limit", "300", "--sm-clock", "1410", *state)
            assert result.returncode == ExitCode.NO_PERMISSION, result.stderr
            line = _one_line_error(result)
            assert "power_limit=300 W, sm_clock=1410 MHz" in line and "device_settings = off" in line
            assert "device_settings = allowed" in line.split(". Fix: ")[1]
    assert gpus.calls() == [] and not gpus.state.exists()


def test_unknown_policy_value_and_bad_numbers_are_usage_errors(gpus) -> None:
    result = gpus.run("apply", "--device-settings", "allow", "--power-limit", "300")
    assert result.returncode == ExitCode.USAGE
    assert "device_settings = 'allow' is not one of off, allowed" in _one_line_error(result)
    result = gpus.run("apply", *ALLOWED, "--sm-clock", "1.4GHz")
    assert result.returncode == ExitCode.USAGE
    assert "sm_clock='1.4GHz' is not a number of MHz" in _one_line_error(result)
    assert gpus.calls() == []


def test_without_root_or_zeusd_the_refusal_names_both_routes() -> None:
    request = Request(power_limit_w=300)
    with pytest.raises(SettingRefused) as refused:
        authorize("allowed", request, Privileges(euid=1000, cap_sys_admin=False), None)
    assert refused.value.exit_code == ExitCode.NO_PERMISSION
    assert "uid 1000, without CAP_SYS_ADMIN" in str(refused.value) and "zeusd_socket" in refused.value.fix
    assert authorize("allowed", request, Privileges(euid=1000, cap_sys_admin=True), None).route == "nvml"


def test_amd_gpus_are_changed_through_amdsmi_by_root_only() -> None:
    request = Request(power_limit_w=300)
    assert authorize("allowed", request, Privileges(euid=0, cap_sys_admin=True), None, vendor="amd").route == "amdsmi"
    with pytest.raises(SettingRefused, match="amdsmi set functions need root") as refused:
        authorize("allowed", request, Privileges(euid=1000, cap_sys_admin=False), None, vendor="amd")
    assert "zeusd" not in refused.value.fix  # zeusd is no route for AMD GPUs
    with pytest.raises(SettingRefused, match="zeusd drives NVIDIA GPUs only"):
        authorize("allowed", request, Privileges(euid=0, cap_sys_admin=True), "/run/zeusd.sock", vendor="amd")
    with pytest.raises(SettingRefused, match="not on graphcore devices"):
        authorize("allowed", request, Privileges(euid=0, cap_sys_admin=True), None, vendor="graphcore")


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv")
def test_an_unprivileged_user_is_refused_before_any_change(gpus, tmp_path) -> None:
    """The real uid check, run as user nobody."""
    tmp_path.chmod(0o777)
    result = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all",
                             *DEVICE_SETTINGS, "probe", *ALLOWED, "--power-limit", "300"],
                            env=gpus.environ, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    if "Permission denied" in result.stderr and "Traceback" in result.stderr:
        pytest.skip(f"user nobody cannot run this interpreter: {result.stderr.splitlines()[-1]}")
    assert result.returncode == ExitCode.NO_PERMISSION, result.stderr
    assert "uid 65534, without CAP_SYS_ADMIN" in _one_line_error(result)
    assert gpus.calls() == []


def test_an_authorization_cannot_be_made_by_hand() -> None:
    with pytest.raises(TypeError):
        Authorization("nvml", "forged")
    with pytest.raises(TypeError):
        setter_for(object(), None)  # type: ignore[arg-type]


def test_probe_reads_everything_and_changes_nothing(gpus) -> None:
    result = gpus.run("probe", *ALLOWED, "--power-limit", "300", "--sm-clock", "1400")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    default_w = _default(gpus) // 1000
    assert sum(f"power limit {default_w} W" in line and "persistence mode: yes" in line for line in lines) == 3
    assert sum("would set power limit 300 W, SM clock locked at 1395 MHz" in line for line in lines) == 3
    assert "1400 MHz is not a supported SM clock; locking the nearest, 1395 MHz" in result.stdout
    assert lines[-1].startswith("device-settings: power_limit=300 W, sm_clock=1400 MHz: permitted through NVML")
    assert gpus.calls() == [] and gpus.devices() == {}


def test_values_outside_the_device_range_are_refused_before_any_change(gpus) -> None:
    for args, expected in ((["--power-limit", "100"], "power_limit=100 W is outside the range of device 0"),
                           (["--sm-clock", "3000"], "sm_clock=3000 MHz is outside the supported SM clocks")):
        result = gpus.run("apply", *ALLOWED, *args, "--state", str(gpus.state))
        assert result.returncode == ExitCode.USAGE
        assert expected in _one_line_error(result)
    assert gpus.calls() == [] and not gpus.state.exists()


def test_states_that_could_not_be_restored_are_refused(fake_pynvml, h100_trace_dir, monkeypatch) -> None:
    """A clock some setting already holds cannot be read back, so a clock sweep would lose it; without persistence
    mode the setting could vanish before the run."""
    replay = fake_pynvml.configure(h100_trace_dir, devices=2, privileged=True)
    fake_pynvml.nvmlInit()
    fake_pynvml.nvmlDeviceSetGpuLockedClocks(fake_pynvml.nvmlDeviceGetHandleByIndex(1), 1200, 1200)  # an admin's
    root = Privileges(euid=0, cap_sys_admin=True)
    with pytest.raises(SettingRefused, match=r"sm_clock=1410 MHz: a clock setting already holds the clock of device 1"):
        probe("allowed", Request(sm_clock_mhz=1410), root, None, "nvidia", None)
    assert probe("allowed", Request(power_limit_w=300), root, None, "nvidia", None).plans[1].power_limit_mw == 300_000
    monkeypatch.setitem(fake_pynvml.SYNTHETIC, "persistence_mode", fake_pynvml.NVML_FEATURE_DISABLED)
    with pytest.raises(SettingRefused, match="persistence mode is off on device 0"):
        probe("allowed", Request(power_limit_w=300), root, None, "nvidia", None)
    assert len(replay.store.snapshot()["calls"]) == 1  # the admin's lock only


# ---- apply and restore ------------------------------------------------------------------------------------------
def test_apply_then_restore_in_separate_processes(gpus, tmp_path) -> None:
    record = tmp_path / "settings.json"
    result = gpus.run("apply", *ALLOWED, "--power-limit", "300", "--sm-clock", "1410", "--devices", "0,2",
                      "--state", str(gpus.state), "--record", str(record))
    assert result.returncode == 0, result.stderr
    applied = json.loads(record.read_text())
    assert applied["requested"] == {"power_limit_w": 300.0, "sm_clock_mhz": 1410} and applied["route"] == "nvml"
    assert [d["index"] for d in applied["devices"]] == [0, 2]
    for device in applied["devices"]:
        assert device["prior_power_limit_w"] == _default(gpus) / 1000
        assert device["power_limit_w"] == device["enforced_power_limit_w"] == 300
        assert device["locked_sm_clock_mhz"] == 1410 and device["clock_held_by_setting"] is True
        clocks = fake_nvml.SYNTHETIC["sm_clocks_MHz"]  # what analysis checks a recorded clock against
        assert device["supported_sm_clock_range_mhz"] == [min(clocks), max(clocks)]
        assert gpus.devices()[device["uuid"]] == {"power_limit_mW": 300_000, "locked_clocks_MHz": [1410, 1410]}
    assert len(gpus.devices()) == 2  # device 1 untouched
    saved = json.loads(gpus.state.read_text())
    assert [(d["prior_power_limit_mw"], d["touched"]) for d in saved["devices"]] == [
        (_default(gpus), ["power_limit", "sm_clock"])] * 2

    result = gpus.run("restore", *ALLOWED, "--state", str(gpus.state))
    assert result.returncode == 0, result.stderr
    assert "restored the prior settings of 2 device(s)" in result.stdout
    assert _at_defaults(gpus) and not gpus.state.exists()
    again = gpus.run("restore", *ALLOWED, "--state", str(gpus.state))
    assert again.returncode == 0 and "nothing to restore" in again.stdout


def test_empty_request_is_the_default_row(gpus, tmp_path) -> None:
    record = tmp_path / "settings.json"
    result = gpus.run("apply", "--power-limit", "", "--sm-clock", "", "--record", str(record))
    assert result.returncode == 0, result.stderr
    assert json.loads(record.read_text())["requested"] == {"power_limit_w": None, "sm_clock_mhz": None}
    assert gpus.calls() == []


def test_epilog_restores_after_the_apply_process_is_killed(gpus, tmp_path) -> None:
    """SIGKILL in the middle of the second device's clock lock: the state file already names what may have changed,
    and the epilog's restore (by job id and node, as Slurm runs it) puts every device back."""
    slow = json.dumps({"per_device": {"1": {"slow_ms": {"nvmlDeviceSetGpuLockedClocks": 60_000}}}})
    state_dir = tmp_path / "state-dir"
    job = {"SLURM_JOB_ID": "4242"}
    apply = gpus.popen("apply", *ALLOWED, "--power-limit", "250", "--sm-clock", "1200", "--state-dir", str(state_dir),
                       extra_env={**job, "JPWR_FAKE_NVML_FAULTS": slow})
    state = state_dir / "4242.n1.json"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if state.exists() and [d["touched"] for d in json.loads(state.read_text())["devices"]][1] == [
                "power_limit", "sm_clock"]:
            break
        time.sleep(0.05)
    apply.kill()
    apply.communicate(timeout=30)
    assert state.exists() and not _at_defaults(gpus)
    assert oct(state_dir.stat().st_mode & 0o7777) == oct(0o1777)

    epilog = gpus.run("restore", *ALLOWED, "--state-dir", str(state_dir), extra_env=job)
    assert epilog.returncode == 0, epilog.stderr
    assert _at_defaults(gpus) and not state.exists()
    resets = [c for c in gpus.calls() if c["function"] == "nvmlDeviceResetGpuLockedClocks"]
    assert len(resets) == 2  # devices 0 and 1 were touched; device 2 was never reached


def test_a_failing_device_rolls_back_the_others(gpus) -> None:
    fails = json.dumps({"per_device": {"2": {"fails": [{"target": "nvmlDeviceSetGpuLockedClocks", "code": 999}]}}})
    result = gpus.run("apply", *ALLOWED, "--power-limit", "300", "--sm-clock", "1410", "--state", str(gpus.state),
                      extra_env={"JPWR_FAKE_NVML_FAULTS": fails})
    assert result.returncode == ExitCode.IO, result.stderr
    line = _one_line_error(result)
    assert "failed on device 2" in line and "Unknown Error" in line and "every device is back" in line
    assert _at_defaults(gpus) and len(gpus.devices()) == 3 and not gpus.state.exists()
    changed = {c["uuid"] for c in gpus.calls() if c["result"] == "ok"}
    assert len(changed) == 3  # all three were changed (device 2's power limit too) and put back


def test_a_signal_during_apply_rolls_back_and_exits_with_the_signal(gpus) -> None:
    slow = json.dumps({"per_device": {"1": {"slow_ms": {"nvmlDeviceSetPowerManagementLimit": 60_000}}}})
    apply = gpus.popen("apply", *ALLOWED, "--power-limit", "300", "--state", str(gpus.state),
                       extra_env={"JPWR_FAKE_NVML_FAULTS": slow})
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not any(c["result"] == "ok" for c in gpus.calls()):
        time.sleep(0.05)
    time.sleep(0.2)
    apply.send_signal(signal.SIGTERM)
    _, stderr = apply.communicate(timeout=120)
    assert apply.returncode == 128 + signal.SIGTERM, stderr
    assert _at_defaults(gpus) and not gpus.state.exists()


def test_an_earlier_state_file_blocks_a_new_apply(gpus) -> None:
    assert gpus.run("apply", *ALLOWED, "--power-limit", "300", "--state", str(gpus.state)).returncode == 0
    result = gpus.run("apply", *ALLOWED, "--power-limit", "250", "--state", str(gpus.state))
    assert result.returncode == ExitCode.USAGE and "restore --state" in _one_line_error(result)
    refused = gpus.run("restore", "--state", str(gpus.state))
    assert refused.returncode == ExitCode.NO_PERMISSION and "device_settings = off" in _one_line_error(refused)
    assert gpus.run("restore", *ALLOWED, "--state", str(gpus.state)).returncode == 0 and _at_defaults(gpus)


def test_a_damaged_state_file_is_named_with_the_way_out(gpus) -> None:
    gpus.state.write_text('{"kind": "joulebench.device_settings_state", "vers')
    result = gpus.run("restore", *ALLOWED, "--state", str(gpus.state))
    assert result.returncode == ExitCode.DATA
    assert "is not a joulebench device-settings state file" in _one_line_error(result) and "by hand" in result.stderr
    assert gpus.calls() == []


def test_a_state_file_that_cannot_be_written_stops_apply_before_any_change(gpus, tmp_path) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    result = gpus.run("apply", *ALLOWED, "--power-limit", "300", "--state-dir", str(blocker / "state"))
    assert result.returncode == ExitCode.CANT_CREATE
    assert "cannot write the state file" in _one_line_error(result) and "nothing was changed" in result.stderr
    assert gpus.calls() == []


@pytest.mark.skipif(os.geteuid() != 0, reason="ownership checks apply to a privileged restore")
def test_a_privileged_restore_trusts_only_the_jobs_own_state_file(gpus) -> None:
    assert gpus.run("apply", *ALLOWED, "--power-limit", "300", "--state", str(gpus.state)).returncode == 0
    os.chown(gpus.state, 12345, 12345)
    result = gpus.run("restore", *ALLOWED, "--state", str(gpus.state), extra_env={"SLURM_JOB_UID": "1000"})
    assert result.returncode == ExitCode.USAGE and "owned by uid 12345" in _one_line_error(result)
    result = gpus.run("restore", *ALLOWED, "--state", str(gpus.state), extra_env={"SLURM_JOB_UID": "12345"})
    assert result.returncode == 0 and _at_defaults(gpus)


# ---- through zeusd ----------------------------------------------------------------------------------------------
@pytest.fixture
def zeusd(gpus, tmp_path):
    """A fake zeusd, privileged, on the same fake GPUs; the job's own process is not."""
    sock = Path("/tmp") / f"jb-zeusd-{os.getpid()}-{tmp_path.name[-12:]}.sock"  # AF_UNIX paths are short
    daemon = subprocess.Popen([sys.executable, str(FAKES / "zeusd.py"), str(sock)], env=gpus.environ,
                              stdout=subprocess.PIPE, text=True)
    assert daemon.stdout.readline().strip() == "ready"
    gpus.environ.pop("JPWR_FAKE_NVML_PRIVILEGED")
    yield sock
    daemon.terminate()
    daemon.wait(timeout=30)
    sock.unlink(missing_ok=True)
    Path(f"{sock}.requests").unlink(missing_ok=True)


def test_apply_and_restore_through_zeusd(gpus, zeusd) -> None:
    direct = gpus.run("apply", *ALLOWED, "--power-limit", "300", "--state", str(gpus.state))
    assert direct.returncode == ExitCode.IO and "Insufficient Permissions" in direct.stderr
    assert _at_defaults(gpus)
    via = ["--zeusd-socket", str(zeusd)]
    result = gpus.run("apply", *ALLOWED, *via, "--power-limit", "300", "--sm-clock", "1410", "--devices", "1",
                      "--state", str(gpus.state))
    assert result.returncode == 0, result.stderr
    assert f"through zeusd at {zeusd}" in result.stdout
    assert list(gpus.devices().values()) == [{"power_limit_mW": 300_000, "locked_clocks_MHz": [1410, 1410]}]
    assert gpus.run("restore", *ALLOWED, *via, "--state", str(gpus.state)).returncode == 0
    assert _at_defaults(gpus)
    requests = [json.loads(line) for line in Path(f"{zeusd}.requests").read_text().splitlines()]
    assert [(r["path"], r["body"]) for r in requests] == [
        ("/gpu/1/set_power_limit", {"power_limit_mw": 300_000, "block": True}),
        ("/gpu/1/set_gpu_locked_clocks", {"min_clock_mhz": 1410, "max_clock_mhz": 1410, "block": True}),
        ("/gpu/1/set_power_limit", {"power_limit_mw": _default(gpus), "block": True}),
        ("/gpu/1/reset_gpu_locked_clocks", {"block": True}),
    ]


def test_a_zeusd_socket_that_is_not_there_is_refused(gpus, tmp_path) -> None:
    missing = tmp_path / "zeusd.sock"
    result = gpus.run("probe", *ALLOWED, "--zeusd-socket", str(missing), "--power-limit", "300")
    assert result.returncode == ExitCode.NO_PERMISSION
    assert f"the zeusd socket {missing} does not exist here" in _one_line_error(result)
    missing.write_text("")
    result = gpus.run("probe", *ALLOWED, "--zeusd-socket", str(missing), "--power-limit", "300")
    assert f"{missing} is not a socket" in _one_line_error(result)
    assert gpus.calls() == []



# ---- hold: the job script's guard --------------------------------------------------------------------------------
def _held(gpus, template: str, record: Path) -> subprocess.Popen:
    """Start hold and wait until it applied (it writes the record then: the job script waits for the same file)."""
    hold = gpus.popen("hold", *ALLOWED, "--power-limit", "400", "--sm-clock", "1410", "--state", str(gpus.state),
                      "--record", template, extra_env={})
    deadline = time.monotonic() + 60
    while not record.exists() and hold.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert record.exists(), hold.communicate(timeout=30)
    assert all(d == {"power_limit_mW": 400_000, "locked_clocks_MHz": [1410, 1410]} for d in gpus.devices().values())
    return hold


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGUSR1, signal.SIGINT])
def test_hold_keeps_the_settings_until_a_stop_signal_then_restores(gpus, tmp_path, signum) -> None:
    record = tmp_path / "settings-n1.json"  # {node} is SLURMD_NODENAME's n1
    hold = _held(gpus, str(tmp_path / "settings-{node}.json"), record)
    assert hold.poll() is None and gpus.state.exists()
    time.sleep(1.5)  # a while of the run: nothing changes
    assert hold.poll() is None and not _at_defaults(gpus)
    hold.send_signal(signum)
    stdout, stderr = hold.communicate(timeout=60)
    assert hold.returncode == 0, stderr
    assert _at_defaults(gpus) and not gpus.state.exists()
    block = json.loads(record.read_text())
    assert block["restore"] == {"status": "restored", "stopped_by": signal.Signals(signum).name}
    assert [d["power_limit_w"] for d in block["devices"]] == [400.0] * 3
    assert "restored the prior settings of 3 device(s)" in stdout


def test_hold_restores_when_its_parent_is_gone(gpus, tmp_path) -> None:
    """The job script killed outright (SIGKILL to the script alone): its guard notices and restores."""
    record = tmp_path / "settings.json"
    script = f"{' '.join(DEVICE_SETTINGS)} hold {' '.join(ALLOWED)} --power-limit 400 --state {gpus.state} " \
             f"--record {record} & while [ ! -e {record} ]; do sleep 0.05; done; sleep 0.5; kill -KILL $$"
    shell = subprocess.run(["/bin/sh", "-c", script], env=gpus.environ, cwd=tmp_path, timeout=120)
    assert shell.returncode == -signal.SIGKILL
    deadline = time.monotonic() + 60
    while not _at_defaults(gpus) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _at_defaults(gpus) and not gpus.state.exists()
    while "restore" not in json.loads(record.read_text()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert json.loads(record.read_text())["restore"]["stopped_by"].startswith("its parent")


def test_hold_refused_by_the_site_changes_nothing(gpus, tmp_path) -> None:
    result = gpus.run("hold", "--power-limit", "400", "--record", str(tmp_path / "r.json"))
    assert result.returncode == ExitCode.NO_PERMISSION and "device settings are off" in _one_line_error(result)
    assert gpus.calls() == [] and not (tmp_path / "r.json").exists()


def test_probe_on_a_login_node_checks_policy_and_route_only(gpus, tmp_path) -> None:
    """The zeusd socket lives on the GPU nodes; a login node without it must not refuse, a policy of off must."""
    socket_path = str(tmp_path / "no-such.sock")
    here = gpus.run("probe", *ALLOWED, "--power-limit", "400", "--zeusd-socket", socket_path, "--login-node")
    assert here.returncode == 0 and "checked on each GPU node" in here.stdout, here.stderr
    assert "login node" in here.stdout and gpus.calls() == []
    off = gpus.run("probe", "--power-limit", "400", "--zeusd-socket", socket_path, "--login-node")
    assert off.returncode == ExitCode.NO_PERMISSION
