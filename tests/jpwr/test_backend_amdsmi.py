"""The amdsmi backend against the fake amdsmi module: units, key spellings, MI250 packages, N/A, the lock."""

from __future__ import annotations

import sys
import threading

import pytest

from jpwr.backends import create_backend
from jpwr.backends.amdsmi import AmdSmiBackend
from jpwr.clock import VirtualClock
from jpwr.domains import METRIC_NAMES, Kind, Signal, Status

S = 1_000_000_000


def _gpu(fake, n: int, **kw):
    return fake.FakeGpu(uuid=f"GPU-{n:016x}", bdf=f"0000:{0xC1 + n:02x}:00.0", **kw)


def _mi250(fake, n: int, serial: str = "", **kw):
    kw.setdefault("power_w", 400.0)
    kw.setdefault("power_key", "average_socket_power")
    return _gpu(fake, n, name="AMD Instinct MI250X", board_serial=serial, secondary_die=n % 2 == 1, **kw)


def _open(fake, gpus, selectors=None):
    clock = VirtualClock()
    fake.configure(gpus, clock)
    backend = create_backend("rocm", clock, selectors=selectors)
    return clock, backend, backend.discover()


def _values(backend, disc):
    return {r.sensor_id.rsplit("/", 1)[1]: r for r in backend.read(disc.sensors)}


def test_mi300x_counter_ticks_times_resolution_in_joules(fake_amdsmi) -> None:
    clock, backend, disc = _open(fake_amdsmi, [_gpu(fake_amdsmi, 0, power_w=300.0)])
    (domain,) = disc.domains
    assert domain.id == "amdsmi:GPU-0000000000000000" and domain.kind is Kind.GPU
    assert domain.pci_bus_id == "0000:c1:00.0"
    assert {s.signal for s in disc.sensors} == {Signal.ENERGY_COUNTER, Signal.POWER_INSTANT}
    first = _values(backend, disc)
    clock.advance_ns(2 * S)
    second = _values(backend, disc)
    assert first["energy_counter"].value == pytest.approx(1000.0, abs=16e-6)  # one 15.3 µJ tick
    assert second["energy_counter"].value - first["energy_counter"].value == pytest.approx(600.0, abs=32e-6)
    assert second["power_instant"].value == 300.0


def test_old_energy_key_and_average_power(fake_amdsmi) -> None:
    gpu = _gpu(fake_amdsmi, 0, energy_key="power", power_key="average_socket_power", counter_resolution=1.0)
    _, backend, disc = _open(fake_amdsmi, [gpu])
    values = _values(backend, disc)
    assert values["energy_counter"].value == pytest.approx(1000.0)
    assert values["power_average"].status is Status.OK and values["power_average"].value == 300.0


@pytest.mark.parametrize("serial", ["0123-4567", ""])
@pytest.mark.parametrize("secondary_reports", ["N/A (Secondary die)", 0])
def test_mi250_two_gcds_are_one_package(fake_amdsmi, serial, secondary_reports) -> None:
    gpus = [_mi250(fake_amdsmi, i, serial=f"{serial}{i // 2}" if serial else "", secondary_reports=secondary_reports)
            for i in range(4)]
    _, backend, disc = _open(fake_amdsmi, gpus)
    assert [d.kind for d in disc.domains] == [Kind.PACKAGE, Kind.PACKAGE]
    first = disc.domains[0]
    assert first.shared_with == ("amdsmi:GPU-0000000000000000", "amdsmi:GPU-0000000000000001")
    assert first.device_uuid == "GPU-0000000000000000"  # metered through the die that reports
    readings = backend.read(disc.sensors)
    assert all(r.status is Status.OK and r.value > 0 for r in readings)
    assert sorted(r.value for r in readings if r.sensor_id.endswith("power_average")) == [400.0, 400.0]


def test_job_with_the_secondary_gcd_gets_the_shared_package(fake_amdsmi) -> None:
    gpus = [_mi250(fake_amdsmi, i, serial="S1") for i in range(2)]
    _, _, disc = _open(fake_amdsmi, gpus, selectors=["1"])
    (package,) = disc.domains
    assert package.kind is Kind.PACKAGE and len(package.shared_with) == 2
    assert dict(package.attrs)["job_gcds"] == "amdsmi:GPU-0000000000000001"


def test_na_and_uint32_max_are_unsupported_never_zero(fake_amdsmi) -> None:
    gpus = [_gpu(fake_amdsmi, 0, power_w=None, unsupported_as=fake_amdsmi.UINT32_MAX),
            _gpu(fake_amdsmi, 1, power_w=250.0)]
    _, backend, disc = _open(fake_amdsmi, gpus)
    assert [s.signal for s in disc.sensors if s.domain_id.endswith("0")] == [Signal.ENERGY_COUNTER]
    assert any("reports no power" in line for line in disc.unavailable)
    fake_amdsmi.set_power(1, None)  # the sensor drops out after discovery
    (power,) = [r for r in backend.read(disc.sensors) if r.sensor_id.endswith("power_instant")]
    assert power.status is Status.UNSUPPORTED and power.value is None


def test_energy_unsupported_and_selection_by_hip_id_and_uuid(fake_amdsmi) -> None:
    gpus = [_gpu(fake_amdsmi, 0, hip_id=1, energy_supported=False), _gpu(fake_amdsmi, 1, hip_id=0)]
    _, _, disc = _open(fake_amdsmi, gpus, selectors=["1"])
    assert [d.device_uuid for d in disc.domains] == ["GPU-0000000000000000"]  # HIP id 1 = enumeration 0
    assert [s.signal for s in disc.sensors] == [Signal.POWER_INSTANT]
    assert any("energy_counter" in line for line in disc.unavailable)
    fake_amdsmi.reset()
    _, _, disc = _open(fake_amdsmi, gpus, selectors=["GPU-0000000000000001", "00000000:C1:00.0", "0000:ff:00.0"])
    assert [d.device_uuid for d in disc.domains] == ["GPU-0000000000000000", "GPU-0000000000000001"]
    assert any("'0000:ff:00.0'" in line for line in disc.unavailable)


def test_missing_library_or_driver_is_unavailable(fake_amdsmi, monkeypatch) -> None:
    assert "amdsmi_init failed" in create_backend("amdsmi", VirtualClock()).discover().unavailable[0]
    monkeypatch.setitem(sys.modules, "amdsmi", None)
    assert "not installed" in create_backend("amdsmi", VirtualClock()).discover().unavailable[0]


def test_counter_plausibility_check_catches_a_frozen_counter(fake_amdsmi) -> None:
    clock, backend, disc = _open(fake_amdsmi, [_gpu(fake_amdsmi, 0, frozen_counter=True, power_w=300.0)])
    e0 = _values(backend, disc)["energy_counter"].value
    clock.advance_ns(S // 2)
    after = _values(backend, disc)
    e1, watts = after["energy_counter"].value, after["power_instant"].value
    assert AmdSmiBackend.counter_plausible(e0, e1, watts, 0.5) is False
    assert AmdSmiBackend.counter_plausible(0.0, 150.0, 300.0, 0.5) is True
    assert AmdSmiBackend.counter_plausible(0.0, 1.0, 0.0, 0.5) is None  # no power, nothing to compare


def test_all_calls_are_serialised_by_the_backend_lock(fake_amdsmi) -> None:
    _, backend, disc = _open(fake_amdsmi, [_gpu(fake_amdsmi, i) for i in range(2)])

    def hammer() -> None:
        for _ in range(200):
            backend.read(disc.sensors)
            backend.read_metrics()

    threads = [threading.Thread(target=hammer) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    import amdsmi

    assert amdsmi._state.max_concurrent_calls == 1


def test_metrics_in_si_units(fake_amdsmi) -> None:
    _, backend, _ = _open(fake_amdsmi, [_gpu(fake_amdsmi, 0)])
    metrics = {m.name: m.value for m in backend.read_metrics()}
    assert set(metrics) <= set(METRIC_NAMES)
    assert metrics["utilization_gpu"] == pytest.approx(0.97) and metrics["sm_clock_hz"] == 1.7e9
    assert metrics["memory_used_bytes"] == 1024 * 1024**2 and metrics["power_limit_w"] == pytest.approx(500.0)
