"""The fake pynvml's device settings: permission, logged calls, the shared state file and the clock response."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from jpwr.clock import VirtualClock

S = 1_000_000_000


def _steady(replay) -> tuple[int, int]:
    marks = {(name, edge): t for name, edge, t in replay.marks_ns()}
    return marks[("steady", "begin")], marks[("steady", "end")]


def _counter_j(nv, index: int) -> float:
    return nv.nvmlDeviceGetTotalEnergyConsumption(nv.nvmlDeviceGetHandleByIndex(index)) / 1000


def _window(nv, clock, start: int, end: int, devices: int) -> list[float]:
    """Energy (J) per device over [start, end] of the replay clock."""
    clock.set_ns(start)
    before = [_counter_j(nv, i) for i in range(devices)]
    clock.set_ns(end)
    return [_counter_j(nv, i) - before[i] for i in range(devices)]


def test_set_calls_need_privilege_and_every_call_is_logged(fake_pynvml, h100_trace_dir) -> None:
    replay = fake_pynvml.configure(h100_trace_dir, VirtualClock())
    fake_pynvml.nvmlInit()
    handle = fake_pynvml.nvmlDeviceGetHandleByIndex(0)
    default = fake_pynvml.nvmlDeviceGetPowerManagementLimit(handle)
    low = fake_pynvml.nvmlDeviceGetPowerManagementLimitConstraints(handle)[0]
    with pytest.raises(fake_pynvml.NVMLError_NoPermission):
        fake_pynvml.nvmlDeviceSetPowerManagementLimit(handle, low)
    assert fake_pynvml.nvmlDeviceGetPowerManagementLimit(handle) == default
    replay.privileged = True
    with pytest.raises(fake_pynvml.NVMLError_InvalidArgument):
        fake_pynvml.nvmlDeviceSetPowerManagementLimit(handle, low - 1)
    fake_pynvml.nvmlDeviceSetPowerManagementLimit(handle, low)
    assert fake_pynvml.nvmlDeviceGetPowerManagementLimit(handle) == low
    assert fake_pynvml.nvmlDeviceGetEnforcedPowerLimit(handle) == low
    calls = [(c["function"], c["args"], c["result"]) for c in replay.store.snapshot()["calls"]]
    assert calls == [("nvmlDeviceSetPowerManagementLimit", [low], "NVMLError_NoPermission"),
                     ("nvmlDeviceSetPowerManagementLimit", [low - 1], "NVMLError_InvalidArgument"),
                     ("nvmlDeviceSetPowerManagementLimit", [low], "ok")]


def test_the_recordings_own_settings_replay_it_bit_for_bit(fake_pynvml, h100_trace_dir) -> None:
    clock = VirtualClock()
    replay = fake_pynvml.configure(h100_trace_dir, clock, devices=2, privileged=True, origin_ns=0)
    fake_pynvml.nvmlInit()
    handle = fake_pynvml.nvmlDeviceGetHandleByIndex(1)
    fake_pynvml.nvmlDeviceSetPowerManagementLimit(handle, fake_pynvml.nvmlDeviceGetPowerManagementDefaultLimit(handle))
    fake_pynvml.nvmlDeviceResetGpuLockedClocks(handle)
    for t in range(0, replay.trace.duration_ns * 2, replay.trace.duration_ns // 7):
        clock.set_ns(t)
        assert _counter_j(fake_pynvml, 1) == _counter_j(fake_pynvml, 0) == replay.trace.energy_mj(t) / 1000
        assert (fake_pynvml.nvmlDeviceGetPowerUsage(handle)
                == replay.trace.row(replay.trace.usage_t, t)[0]["power_usage_mW"])


def test_lower_power_limit_caps_power_and_clock_where_the_load_exceeded_it(fake_pynvml, h100_trace_dir) -> None:
    clock = VirtualClock()
    replay = fake_pynvml.configure(h100_trace_dir, clock, devices=2, privileged=True, origin_ns=0)
    fake_pynvml.nvmlInit()
    capped = fake_pynvml.nvmlDeviceGetHandleByIndex(1)
    limit_mw = fake_pynvml.nvmlDeviceGetPowerManagementLimitConstraints(capped)[0]
    fake_pynvml.nvmlDeviceSetPowerManagementLimit(capped, limit_mw)
    start, end = _steady(replay)
    default_j, capped_j = _window(fake_pynvml, clock, start, end, 2)
    assert capped_j / ((end - start) / S) == pytest.approx(limit_mw / 1000, rel=0.02)
    assert default_j / ((end - start) / S) > 1.5 * limit_mw / 1000
    clock.set_ns((start + end) // 2)
    free = fake_pynvml.nvmlDeviceGetHandleByIndex(0)
    sm = fake_pynvml.NVML_CLOCK_SM
    assert fake_pynvml.nvmlDeviceGetClockInfo(capped, sm) < fake_pynvml.nvmlDeviceGetClockInfo(free, sm)
    assert fake_pynvml.nvmlDeviceGetCurrentClocksEventReasons(capped) & fake_pynvml.nvmlClocksEventReasonSwPowerCap
    idle_start = replay.marks_ns()[0][2]
    idle_j = _window(fake_pynvml, clock, idle_start + S // 2, idle_start + 2 * S, 2)
    assert idle_j[0] == idle_j[1]  # idle power is below the limit: untouched


def test_counter_is_continuous_across_a_change(fake_pynvml, h100_trace_dir) -> None:
    clock = VirtualClock()
    replay = fake_pynvml.configure(h100_trace_dir, clock, privileged=True, origin_ns=0)
    fake_pynvml.nvmlInit()
    handle = fake_pynvml.nvmlDeviceGetHandleByIndex(0)
    start, end = _steady(replay)
    clock.set_ns((start + end) // 2)
    before = _counter_j(fake_pynvml, 0)
    fake_pynvml.nvmlDeviceSetGpuLockedClocks(handle, 990, 990)
    assert _counter_j(fake_pynvml, 0) == before
    clock.set_ns(end)
    assert _counter_j(fake_pynvml, 0) > before


def test_locked_clock_lowers_power_and_stretches_the_phase_by_the_response(fake_pynvml, h100_trace_dir) -> None:
    clock = VirtualClock()
    response = fake_pynvml.ClockResponse(phases={"steady": fake_pynvml.PhaseResponse(2.5, 0.8)})
    replay = fake_pynvml.configure(h100_trace_dir, clock, devices=2, privileged=True, origin_ns=0,
                                   clock_response=response)
    fake_pynvml.nvmlInit()
    locked = fake_pynvml.nvmlDeviceGetHandleByIndex(1)
    lock_mhz = min(fake_pynvml.nvmlDeviceGetSupportedGraphicsClocks(locked, 2619)) * 3
    fake_pynvml.nvmlDeviceSetGpuLockedClocks(locked, lock_mhz, lock_mhz)
    start, end = _steady(replay)
    default_j, locked_j = _window(fake_pynvml, clock, start, end, 2)
    assert locked_j < default_j
    clock.set_ns((start + end) // 2)
    assert fake_pynvml.nvmlDeviceGetClockInfo(locked, fake_pynvml.NVML_CLOCK_SM) == lock_mhz
    reasons = fake_pynvml.nvmlDeviceGetCurrentClocksEventReasons(locked)
    assert reasons & fake_pynvml.nvmlClocksEventReasonApplicationsClocksSetting
    rows = replay.scaled.phase_rows("steady")
    recorded = sum(replay.trace.rows[i]["sm_clock_MHz"] for i in rows) / len(rows)
    assert replay.phase_time_factor("steady", 1) == pytest.approx(0.2 + 0.8 * recorded / lock_mhz)
    assert replay.phase_time_factor("steady", 0) == 1.0


def test_state_file_is_shared_between_processes_per_node(fake_pynvml, fake_env, h100_trace_dir, tmp_path,
                                                          monkeypatch) -> None:
    template = str(tmp_path / "gpus-{node}.json")
    script = ("import pynvml; pynvml.nvmlInit(); "
              "pynvml.nvmlDeviceSetGpuLockedClocks(pynvml.nvmlDeviceGetHandleByIndex(0), 1410, 1410)")
    env = fake_env(JPWR_FAKE_NVML_TRACE=str(h100_trace_dir), JPWR_FAKE_NVML_STATE=template,
                   JPWR_FAKE_NVML_PRIVILEGED="1", SLURMD_NODENAME="n1")
    subprocess.run([sys.executable, "-c", script], env=env, check=True, timeout=60)
    monkeypatch.setenv("SLURMD_NODENAME", "n1")
    assert fake_pynvml.configure(h100_trace_dir, state_file=template).settings(0).locked_mhz == (1410, 1410)
    monkeypatch.setenv("SLURMD_NODENAME", "n2")
    assert fake_pynvml.configure(h100_trace_dir, state_file=template).settings(0).locked_mhz is None
    data = json.loads((tmp_path / "gpus-n1.json").read_text())
    assert [c["function"] for c in data["calls"]] == ["nvmlDeviceSetGpuLockedClocks"]
