"""The nvml backend against the fake pynvml replaying the real H100 trace (tests/data/h100_trace)."""

from __future__ import annotations

import bisect
import csv
import gzip
import json
import subprocess
import sys

import pytest

from jpwr.backends import create_backend
from jpwr.clock import VirtualClock
from jpwr.domains import METRIC_NAMES, Kind, Signal, Status

MS = 1_000_000
S = 1_000_000_000


def _discover(fake_pynvml, trace_dir, selectors=None, **configure):
    clock = VirtualClock()
    replay = fake_pynvml.configure(trace_dir, clock, **configure)
    backend = create_backend("nvml", clock, selectors=selectors)
    return clock, replay, backend, backend.discover()


def _by_signal(disc, signal):
    return [s for s in disc.sensors if s.signal is signal]


def _rows(trace_dir):
    with gzip.open(trace_dir / "trace.csv.gz", "rt") as fh:
        return [{k: int(v) for k, v in row.items()} for row in csv.DictReader(fh)]


def test_discovery_identity_signals_and_versions(fake_pynvml, h100_trace_dir) -> None:
    meta = json.loads((h100_trace_dir / "meta.json").read_text())
    _, _, _, disc = _discover(fake_pynvml, h100_trace_dir)
    (domain,) = disc.domains
    assert domain.id == f"nvml:{meta['uuid']}" and domain.device_uuid == meta["uuid"]
    assert domain.pci_bus_id == meta["pci_bus_id"] and domain.index == 0 and domain.kind is Kind.GPU
    assert dict(domain.attrs)["power_limit_w"] == "700"
    assert disc.info == {"driver": meta["driver"], "nvml": meta["nvml"]}
    assert {s.id for s in disc.sensors} == {f"{domain.id}/energy_counter", f"{domain.id}/power_instant",
                                           f"{domain.id}/power_average"}
    assert _by_signal(disc, Signal.POWER_AVERAGE)[0].avg_window_s == 1.0
    assert _by_signal(disc, Signal.POWER_INSTANT)[0].avg_window_s is None
    assert _by_signal(disc, Signal.ENERGY_COUNTER)[0].est_update_s == pytest.approx(0.1)
    assert disc.unavailable == []


def test_replay_returns_the_recorded_counter_and_fields_in_si_units(fake_pynvml, h100_trace_dir) -> None:
    rows = _rows(h100_trace_dir)
    t_start = json.loads((h100_trace_dir / "meta.json").read_text())["t_start_ns"]
    clock, replay, backend, disc = _discover(fake_pynvml, h100_trace_dir)
    counter_after = [r["counter_t_after_ns"] for r in rows]
    fields_after = [r["fields_t_after_ns"] for r in rows]
    for rel in (0, 1 * S + 3 * MS, 4 * S, 7_777 * MS, 20 * S, 28 * S):
        clock.set_ns(replay.clock_ns(rel))
        readings = {r.sensor_id.rsplit("/", 1)[1]: r for r in backend.read(disc.sensors)}
        counter_row = rows[max(bisect.bisect_right(counter_after, t_start + rel) - 1, 0)]
        fields_row = rows[max(bisect.bisect_right(fields_after, t_start + rel) - 1, 0)]
        assert readings["energy_counter"].value == pytest.approx(counter_row["energy_mJ"] / 1000.0)
        assert readings["power_instant"].value == pytest.approx(fields_row["power_instant_mW"] / 1000.0)
        assert readings["power_average"].value == pytest.approx(fields_row["power_average_mW"] / 1000.0)
        assert readings["power_instant"].hw_timestamp_ns == fields_row["power_instant_hw_us"] * 1000
        assert all(r.status is Status.OK and r.t_before_ns == clock.monotonic_ns() for r in readings.values())


def test_counter_keeps_rising_when_the_trace_loops(fake_pynvml, h100_trace_dir) -> None:
    clock, replay, backend, disc = _discover(fake_pynvml, h100_trace_dir)
    counter = _by_signal(disc, Signal.ENERGY_COUNTER)
    values = []
    for rel in range(0, 3 * replay.trace.duration_ns, replay.trace.duration_ns // 7):
        clock.set_ns(replay.clock_ns(rel))
        values.append(backend.read(counter)[0].value)
    assert values == sorted(values) and values[-1] > 2 * values[0]


def test_phase_marks_are_on_the_configured_clock(fake_pynvml, h100_trace_dir) -> None:
    clock, replay, backend, disc = _discover(fake_pynvml, h100_trace_dir)
    marks = {(name, edge): t for name, edge, t in replay.marks_ns() if name == "steady"}
    counter = _by_signal(disc, Signal.ENERGY_COUNTER)
    clock.set_ns(marks["steady", "begin"])
    e0 = backend.read(counter)[0].value
    clock.set_ns(marks["steady", "end"])
    e1 = backend.read(counter)[0].value
    assert 600 < (e1 - e0) / 8.0 < 750  # the steady phase ran power-capped at ~700 W for 8 s


def test_no_driver_and_no_library_are_unavailable_not_errors(fake_pynvml, h100_trace_dir, monkeypatch) -> None:
    disc = create_backend("nvml", VirtualClock()).discover()
    (line,) = disc.unavailable
    assert line == "nvml: unavailable: nvmlInit failed: NVML Shared Library Not Found (no NVIDIA driver or GPU?)"
    fake_pynvml.configure(h100_trace_dir, VirtualClock(), init_error=fake_pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    assert "Driver Not Loaded" in create_backend("nvml", VirtualClock()).discover().unavailable[0]
    monkeypatch.setitem(sys.modules, "pynvml", None)
    assert "not installed" in create_backend("nvml", VirtualClock()).discover().unavailable[0]


def test_missing_counter_is_recorded_and_fields_remain(fake_pynvml, h100_trace_dir) -> None:
    faults = fake_pynvml.Faults(fails=(fake_pynvml.Fail("nvmlDeviceGetTotalEnergyConsumption"),))
    _, _, _, disc = _discover(fake_pynvml, h100_trace_dir, faults=faults)
    assert not _by_signal(disc, Signal.ENERGY_COUNTER)
    assert len(_by_signal(disc, Signal.POWER_INSTANT)) == 1
    assert any("energy_counter" in line and "Not Supported" in line for line in disc.unavailable)


@pytest.mark.parametrize(("name", "arch", "signal"), [
    ("NVIDIA H100 80GB HBM3", 9, Signal.POWER_AVERAGE),
    ("NVIDIA A100-SXM4-80GB", 7, Signal.POWER_INSTANT),  # GA100: GetPowerUsage is instantaneous
    ("Tesla V100-SXM2-32GB", 5, Signal.POWER_INSTANT),
])
def test_getpowerusage_is_a_labelled_fallback(fake_pynvml, h100_trace_dir, name, arch, signal) -> None:
    faults = fake_pynvml.Faults(fails=(fake_pynvml.Fail("field:186"), fake_pynvml.Fail("field:185")))
    clock, replay, backend, disc = _discover(fake_pynvml, h100_trace_dir, faults=faults,
                                             overrides={0: {"name": name, "architecture": arch}})
    (power,) = [s for s in disc.sensors if s.signal is not Signal.ENERGY_COUNTER]
    assert power.id.endswith(":getpowerusage") and power.signal is signal
    assert power.avg_window_s == (1.0 if signal is Signal.POWER_AVERAGE else None)
    assert "fallback" in disc.info[power.id]
    clock.set_ns(replay.clock_ns(5 * S))
    assert 100 < backend.read([power])[0].value < 1000  # mW -> W


def test_na_power_burst_reads_unsupported_never_zero(fake_pynvml, h100_trace_dir) -> None:
    faults = fake_pynvml.Faults(fails=(fake_pynvml.Fail("field:186", from_ns=5 * S, until_ns=6 * S),))
    clock, replay, backend, disc = _discover(fake_pynvml, h100_trace_dir, faults=faults)
    instant = _by_signal(disc, Signal.POWER_INSTANT)
    statuses = []
    for rel in (4 * S, 5 * S + 500 * MS, 6 * S):
        clock.set_ns(replay.clock_ns(rel))
        (reading,) = backend.read(instant)
        statuses.append((reading.status, reading.value is None))
    assert statuses == [(Status.OK, False), (Status.UNSUPPORTED, True), (Status.OK, False)]


def test_counter_faults_pass_through_raw(fake_pynvml, h100_trace_dir) -> None:
    """The backend reports the raw counter; unwrapping and discontinuities are the estimator's job."""
    faults = {0: fake_pynvml.Faults(counter_wrap_mj=5_000_000),
              1: fake_pynvml.Faults(counter_reset_at_ns=10 * S),
              2: fake_pynvml.Faults(counter_steps=((10 * S, -50_000),))}
    clock, replay, backend, disc = _discover(fake_pynvml, h100_trace_dir, devices=3, faults=faults)
    counters = _by_signal(disc, Signal.ENERGY_COUNTER)
    clock.set_ns(replay.clock_ns(10 * S - 1))
    before = [r.value for r in backend.read(counters)]
    clock.set_ns(replay.clock_ns(10 * S))
    after = [r.value for r in backend.read(counters)]
    truth = replay.trace.energy_mj(10 * S) / 1000
    assert after[0] == pytest.approx(truth % 5000)
    assert after[1] == 0.0 and before[1] > 0
    assert after[2] == pytest.approx(truth - 50) and after[2] < before[2]


def test_slow_read_is_visible_in_the_stamps(fake_pynvml, h100_trace_dir) -> None:
    faults = fake_pynvml.Faults(slow_ms={"nvmlDeviceGetTotalEnergyConsumption": 4.0})
    _, _, backend, disc = _discover(fake_pynvml, h100_trace_dir, faults=faults)
    readings = {r.sensor_id.rsplit("/", 1)[1]: r for r in backend.read(disc.sensors)}
    counter = readings["energy_counter"]
    assert counter.t_after_ns - counter.t_before_ns == 4 * MS
    assert readings["power_instant"].t_before_ns == counter.t_after_ns  # fields read after the counter


def test_optional_call_costs_follow_the_h100_measurement(fake_pynvml, h100_trace_dir) -> None:
    meta = json.loads((h100_trace_dir / "meta.json").read_text())
    _, _, backend, disc = _discover(fake_pynvml, h100_trace_dir, call_costs=True)
    counter = backend.read(_by_signal(disc, Signal.ENERGY_COUNTER))[0]
    assert counter.t_after_ns - counter.t_before_ns == int(meta["call_cost_s"]["counter"] * 1e9)


def test_selectors_resolve_to_uuids_not_positions(fake_pynvml, h100_trace_dir) -> None:
    clock = VirtualClock()
    mig = "MIG-11111111-2222-3333-4444-555555555555"
    replay = fake_pynvml.configure(h100_trace_dir, clock, devices=4, overrides={1: {"mig_uuids": [mig]}})
    uuids = [d.uuid for d in replay.devices]
    pci = replay.devices[3].pci_bus_id[4:]  # NVML reports an 8-digit PCI domain; CUDA and users write 4
    selectors = [uuids[2], "0", mig, pci, "GPU-ffffffff", "9"]
    disc = create_backend("nvml", clock, selectors=selectors).discover()
    got = {d.index: d for d in disc.domains}
    assert sorted(got) == [0, 1, 2, 3]
    assert all(got[i].device_uuid == uuids[i] and got[i].id == f"nvml:{uuids[i]}" for i in got)
    assert got[1].shared_with == ("mig",) and got[0].shared_with == ()
    assert len(disc.unavailable) == 2 and all("matches no single GPU" in u for u in disc.unavailable)


def test_uuid_prefix_selects_like_cuda(fake_pynvml, h100_trace_dir) -> None:
    other = "GPU-0badc0de-0000-1111-2222-333344445555"
    _, replay, _, disc = _discover(fake_pynvml, h100_trace_dir, devices=3, selectors=["GPU-ef47fe23"],
                                   overrides={2: {"uuid": other}})
    assert disc.domains == [] and "matches no single GPU" in disc.unavailable[0]  # ambiguous prefix
    disc = create_backend("nvml", replay.clock, selectors=["GPU-0bad"]).discover()
    assert [(d.index, d.device_uuid) for d in disc.domains] == [(2, other)]


def test_grace_hopper_counter_belongs_to_a_module_domain(fake_pynvml, h100_trace_dir) -> None:
    faults = fake_pynvml.Faults(fails=(fake_pynvml.Fail("field:186:0"), fake_pynvml.Fail("field:185:0")))
    _, _, _, disc = _discover(fake_pynvml, h100_trace_dir, faults=faults,
                              overrides={0: {"name": "NVIDIA GH200 480GB"}})
    gpu, module = disc.domains
    assert (gpu.kind, module.kind) == (Kind.GPU, Kind.MODULE)
    assert module.contains == (gpu.id,)
    assert {s.id for s in disc.sensors} == {f"{module.id}/energy_counter", f"{module.id}/power_instant"}
    assert sum("scope 0" in line for line in disc.unavailable) == 2


def test_unknown_sensor_reads_as_error(fake_pynvml, h100_trace_dir) -> None:
    _, _, backend, disc = _discover(fake_pynvml, h100_trace_dir)
    ghost = disc.sensors[0].__class__("nvml:GPU-gone/energy_counter", "nvml:GPU-gone", Signal.ENERGY_COUNTER)
    (reading,) = backend.read([ghost])
    assert reading.status is Status.ERROR and reading.value is None


def test_metrics_in_si_units(fake_pynvml, h100_trace_dir) -> None:
    clock, replay, backend, _ = _discover(fake_pynvml, h100_trace_dir)
    steady_begin = next(t for name, edge, t in replay.marks_ns() if (name, edge) == ("steady", "begin"))
    clock.set_ns(steady_begin + 2 * S)
    metrics = {m.name: m.value for m in backend.read_metrics()}
    assert set(metrics) == set(METRIC_NAMES)
    assert 1e9 < metrics["sm_clock_hz"] < 2.1e9 and 0.5 < metrics["utilization_gpu"] <= 1.0
    assert metrics["power_limit_w"] == 700.0


@pytest.mark.parametrize(("faults", "expected"), [
    ("", ["2", "6", "['ok']"]),
    ('{"fails": [{"target": "nvmlDeviceGetTotalEnergyConsumption"}]}', ["2", "4", "['ok']"]),
])
def test_subprocess_meters_the_trace_configured_from_environment(h100_trace_dir, fake_env, faults, expected) -> None:
    code = (
        "from jpwr.backends import create_backend\n"
        "from jpwr.clock import SYSTEM_CLOCK\n"
        "b = create_backend('nvml', SYSTEM_CLOCK)\n"
        "d = b.discover()\n"
        "print(len(d.domains), len(d.sensors), sorted({r.status.value for r in b.read(d.sensors)}))\n"
    )
    env = fake_env(JPWR_FAKE_NVML_TRACE=str(h100_trace_dir), JPWR_FAKE_NVML_DEVICES="2", JPWR_FAKE_NVML_FAULTS=faults)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == expected
