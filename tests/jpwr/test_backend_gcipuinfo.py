"""The gcipuinfo backend against the fake gcipuinfo: refresh before reads, identity by board serial, N/A."""

from __future__ import annotations

import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jpwr.backends import create_backend
from jpwr.backends.gcipuinfo import parse_quantity
from jpwr.clock import VirtualClock
from jpwr.domains import METRIC_NAMES, Kind, Signal, Status


def _board(fake, serial: str, first_id: int, powers: list[str], board_power: str = "250.0 W"):
    return [fake.ipu(first_id + i, serial, i, p, **{fake.TotalBoardPower: board_power}) for i, p in enumerate(powers)]


def _open(fake, devices, **kw):
    fake.configure(devices, **kw)
    backend = create_backend("gc", VirtualClock())
    return backend, backend.discover()


def _ipu_values(backend, disc):
    return {r.sensor_id: r for r in backend.read(disc.sensors) if "board:" not in r.sensor_id}


def test_discovery_keys_ipus_by_board_serial_and_index(fake_gcipuinfo) -> None:
    devices = _board(fake_gcipuinfo, "0063.0063.822391", 0, ["101.00W", "102.00W"]) + _board(
        fake_gcipuinfo, "0063.0063.822392", 2, ["103.00W", "104.00W"])
    _, disc = _open(fake_gcipuinfo, devices)
    ipus = [d for d in disc.domains if d.kind is Kind.IPU]
    boards = [d for d in disc.domains if d.kind is Kind.BOARD]
    assert [d.id for d in ipus] == [f"gcipuinfo:0063.0063.82239{b}:{i}" for b in (1, 2) for i in (0, 1)]
    assert boards[0].contains == ("gcipuinfo:0063.0063.822391:0", "gcipuinfo:0063.0063.822391:1")
    assert all(s.signal is Signal.POWER_INSTANT for s in disc.sensors) and len(disc.sensors) == 6


def test_values_refresh_before_every_read(fake_gcipuinfo) -> None:
    backend, disc = _open(fake_gcipuinfo, _board(fake_gcipuinfo, "S", 0, ["100.00W"]))
    stale_reader = fake_gcipuinfo.gcipuinfo()  # what a sampler without updateData() would see
    fake_gcipuinfo.set_attribute("0", fake_gcipuinfo.IpuPower, "222.50W")
    assert stale_reader.getDevices()[0][fake_gcipuinfo.IpuPower] == "100.00W"
    (reading,) = _ipu_values(backend, disc).values()
    assert reading.value == 222.5


def test_na_stays_with_its_ipu_and_never_shifts_values(fake_gcipuinfo) -> None:
    backend, disc = _open(fake_gcipuinfo, _board(fake_gcipuinfo, "S", 0, ["101.00W", "102.00W", "103.00W"]))
    fake_gcipuinfo.set_attribute("1", fake_gcipuinfo.IpuPower, "N/A")
    values = _ipu_values(backend, disc)
    assert values["gcipuinfo:S:0/power_instant"].value == 101.0
    assert values["gcipuinfo:S:1/power_instant"].status is Status.UNSUPPORTED
    assert values["gcipuinfo:S:1/power_instant"].value is None
    assert values["gcipuinfo:S:2/power_instant"].value == 103.0  # not shifted into IPU 1's place


def test_reordered_device_list_keeps_identity(fake_gcipuinfo) -> None:
    devices = _board(fake_gcipuinfo, "S", 0, ["101.00W", "102.00W"])
    backend, disc = _open(fake_gcipuinfo, devices)
    fake_gcipuinfo.configure(list(reversed(devices)))
    values = _ipu_values(backend, disc)
    assert values["gcipuinfo:S:0/power_instant"].value == 101.0
    assert values["gcipuinfo:S:1/power_instant"].value == 102.0


def test_board_power_and_failed_update(fake_gcipuinfo) -> None:
    backend, disc = _open(fake_gcipuinfo, _board(fake_gcipuinfo, "S", 0, ["N/A", "N/A"], board_power="12.6 W"))
    board = [s for s in disc.sensors if s.domain_id == "gcipuinfo:board:S"]
    assert backend.read(board)[0].value == 12.6
    fake_gcipuinfo.configure(_board(fake_gcipuinfo, "S", 0, ["N/A", "N/A"]), update_fails=True)
    assert {r.status for r in backend.read(disc.sensors)} == {Status.STALE}


@pytest.mark.parametrize(("text", "value"), [("123.45W", 123.45), ("12.6 W", 12.6), ("99.96%", 99.96),
                                             ("1300MHz", 1300.0), ("N/A", None), ("", None), (None, None)])
def test_parse_quantity(text, value) -> None:
    assert parse_quantity(text) == value


def test_metrics_and_unavailable_cases(fake_gcipuinfo, monkeypatch) -> None:
    backend, _ = _open(fake_gcipuinfo, _board(fake_gcipuinfo, "S", 0, ["100.00W"]))
    metrics = {m.name: m.value for m in backend.read_metrics()}
    assert set(metrics) <= set(METRIC_NAMES)
    assert metrics == {"utilization_gpu": pytest.approx(0.5), "sm_clock_hz": 1.85e9, "temperature_c": 40.1}
    fake_gcipuinfo.reset()
    assert "no IPUs found" in create_backend("gc", VirtualClock()).discover().unavailable[0]
    monkeypatch.setitem(sys.modules, "gcipuinfo", None)
    assert "not installed" in create_backend("gc", VirtualClock()).discover().unavailable[0]


@settings(max_examples=40, deadline=None)
@given(order=st.permutations(range(4)), missing=st.sets(st.integers(0, 3)))
def test_any_order_and_any_na_subset_keeps_every_value_on_its_ipu(order, missing) -> None:
    import gcipuinfo as fake

    devices = _board(fake, "S", 0, [f"{100 + i}.00W" for i in range(4)])
    fake.configure(devices)
    backend = create_backend("gc", VirtualClock())
    disc = backend.discover()
    live = [dict(devices[i], **({fake.IpuPower: "N/A"} if i in missing else {})) for i in order]
    fake.configure(live)
    values = _ipu_values(backend, disc)
    for i in range(4):
        reading = values[f"gcipuinfo:S:{i}/power_instant"]
        expected = (None, Status.UNSUPPORTED) if i in missing else (100.0 + i, Status.OK)
        assert (reading.value, reading.status) == expected
    fake.reset()
