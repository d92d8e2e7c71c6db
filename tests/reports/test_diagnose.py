"""The time × power decomposition is exact, and the diagnosis of two recorded runs adds up to their difference."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from joulebench.analysis.diagnose import UnitCost, decompose, diagnose
from joulebench.analysis.report import load_runs
from joulebench.latents import steady_latents
from joulebench.record import read_run_record
from jpwr.energy import J_PER_WH
from jpwr.trace_io import read_hdf5

positive = st.fractions(min_value=Fraction(1, 10**6), max_value=Fraction(10**6))


@settings(max_examples=60, deadline=None)
@given(positive, positive, positive, positive)
def test_decomposition_is_exact_in_rational_arithmetic(t1, p1, t2, p2):
    d = decompose(t1, p1, t2, p2)
    assert d.time_term + d.power_term == t2 * p2 - t1 * p1  # exact: no interaction remainder
    assert d.delta_e == d.e2 - d.e1


@settings(max_examples=60, deadline=None)
@given(st.floats(1e-6, 1e3), st.floats(1.0, 1e4), st.floats(1e-6, 1e3), st.floats(1.0, 1e4))
def test_decomposition_sums_in_floating_point(t1, p1, t2, p2):
    d = decompose(t1, p1, t2, p2)
    assert d.time_term + d.power_term == pytest.approx(d.delta_e, rel=1e-9, abs=1e-9 * max(d.e1, d.e2))


def _energy_per_unit_from_record(path) -> float:
    """Independent path: the record's steady-window energy (Wh) over its work count."""
    record = read_run_record(path)
    steady = record.window("steady")
    return record.metrics["energy_wh"] * J_PER_WH / steady.work["steps"]


def test_diagnosis_of_recorded_runs_sums_to_the_measured_difference(replayed_runs):
    a, b = (load_runs([replayed_runs / phase / "run_record.json"])[0] for phase in ("burst37", "burst100"))
    diagnosis = diagnose(a.cost, b.cost, a.latents, b.latents)
    d = diagnosis.decomposition
    measured = (_energy_per_unit_from_record(replayed_runs / "burst100" / "run_record.json")
                - _energy_per_unit_from_record(replayed_runs / "burst37" / "run_record.json"))
    assert d is not None
    assert d.time_term + d.power_term == pytest.approx(measured, rel=1e-9)
    text = diagnosis.text()
    assert "per step" in text and "Time per step" in text and "Mean accelerator power" in text
    assert "GPU utilisation" in text  # latent metrics came from the traces beside the records
    assert set(diagnosis.latents_a) >= {"utilization_gpu", "sm_clock_hz", "memory_used_bytes"}


def test_missing_energy_gives_na_and_no_decomposition():
    a = UnitCost("A", "tokens", 0.001, 700.0, 1, 8.0)
    b = UnitCost("B", "tokens", 0.002, None, 1, 16.0, reason="energy n/a: no sensors")
    diagnosis = diagnose(a, b)
    assert diagnosis.decomposition is None
    assert "n/a" in diagnosis.text() and "no sensors" in diagnosis.text()
    assert diagnosis.to_dict()["delta_energy_per_unit_j"] is None


def test_different_work_units_are_not_compared():
    diagnosis = diagnose(UnitCost("A", "tokens", 1e-3, 700.0, 1, 8.0), UnitCost("B", "images", 1e-2, 700.0, 1, 8.0))
    assert diagnosis.decomposition is None
    assert "cannot be compared" in diagnosis.text()


def test_steady_latents_of_the_h200_matmul_run(h200_trace):
    latents = steady_latents([read_hdf5(h200_trace)])
    # The recorded steady window was a continuous bf16 matmul: the GPU was busy all of it.
    assert latents["utilization_gpu"] > 0.9
    assert {"sm_clock_hz", "memory_clock_hz", "power_limit_w", "throttled_fraction"} <= set(latents)


def test_batch_size_and_devices_are_named_when_they_change():
    a = UnitCost("A", "tokens", 0.001, 700.0, 1, 8.0)
    b = UnitCost("B", "tokens", 0.0006, 1300.0, 2, 16.0)
    text = diagnose(a, b, {"sm_clock_hz": 1.98e9}, {"sm_clock_hz": 1.5e9}).text()
    assert "batch size rose from 8 to 16" in text
    assert "device count rose from 1 to 2" in text
    assert "SM clock fell from 1980 MHz to 1500 MHz" in text
