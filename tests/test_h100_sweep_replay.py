"""Issue 60's sweep on one H100 (2026-12-07: `load --rates 4,8,16,32,max --max-concurrency 256`, default windows,
committed under benchmarks/results/2026-12-07-wave5-s8/issue60) replayed on the CPU by the driver's own code.

The replay reproduces every rate's record: its per-rate and joint coefficients, each check's outcome, and whether the
card-state terms were adopted. Where a check fails, the record names its measured cause (the card state and the step
sizes of the fitted against the predicted windows), as the issue asks of a check it closes with failing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks.joint_fit_replay import differences, rate_dirs
from joulebench.record import RECORD_FILE

SWEEP = Path(__file__).parent.parent / "benchmarks/results/2026-12-07-wave5-s8/issue60/s60/issue60/sweep"
RATES = ["4", "8", "16", "32", "max"]


@pytest.fixture(scope="module")
def records() -> dict[str, dict[str, Any]]:
    return {d.name[5:]: json.loads((d / RECORD_FILE).read_text()) for d in rate_dirs(SWEEP)}


def test_the_replay_reproduces_every_rates_record_per_rate_and_joint() -> None:
    assert [d.name for d in rate_dirs(SWEEP)] == [f"rate_{r}" for r in RATES]
    assert differences(SWEEP) == []


def failing(block: dict[str, Any]) -> list[dict[str, Any]]:
    rows = [row for key in ("held_out_halves", "cross_rate", "controlled_split") for row in block.get(key) or []]
    return [row for row in rows if row.get("closes", row.get("passes")) is False]


def test_every_failing_check_names_its_measured_cause(records: dict[str, dict[str, Any]]) -> None:
    joint_failures = 0
    for label, record in records.items():
        energy = record["requests"]["energy"]
        for block in (energy, energy["joint"]):
            for row in failing(block):
                cause = row.get("measured_cause", "")
                assert cause.startswith("card state fitted") and "step size predicted/fitted" in cause, (label, row)
                assert row["conditions"]["fitted"]["sm_clock_mhz"] is not None
            assert (block["checks_failed"] == "none") == (not failing(block)), label
        joint_failures += len(failing(energy["joint"]))
    assert joint_failures > 0  # this sweep closes issue 60 with checks failing: each one is named above


def test_every_rate_records_its_requests_energy_and_the_joint_fit_leaves_none_out(
        records: dict[str, dict[str, Any]]) -> None:
    for label, record in records.items():
        energy = record["requests"]["energy"]
        assert energy["energy_per_request_j"]["p90"] >= energy["energy_per_request_j"]["p50"] > 0, label
        assert sum(energy["shares"].values()) == pytest.approx(1.0), label
        assert energy["joint"]["rates"] == RATES and energy["joint"]["rates_left_out"] == {}, label
        for term in ("clock_term", "cap_term"):
            assert energy["joint"][term]["adopted"] is False, (label, term)
