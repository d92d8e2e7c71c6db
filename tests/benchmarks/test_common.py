"""benchmarks/common.py: which GPU a single-GPU script reads (CUDA_VISIBLE_DEVICES), and a record's steady window
beside the independent counter read, at the fake pynvml replaying the H100 trace."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import common

REPO = Path(__file__).resolve().parents[2]
SHIPPED_RECORD = REPO / "tests/reports/data/resnet50_cpu_replay/b2/run_record.json"


def test_the_first_visible_gpu_is_the_one_read(fake_pynvml, h100_trace_dir: Path) -> None:
    fake_pynvml.configure(h100_trace_dir, devices=3)
    uuids = common.gpu_uuids()
    assert len(set(uuids)) == 3
    assert common.first_gpu_uuid({}) == uuids[0]  # nothing set: NVML's first
    assert common.first_gpu_uuid({"CUDA_VISIBLE_DEVICES": "2,0"}) == uuids[2]  # an index, PCI bus order
    assert common.first_gpu_uuid({"CUDA_VISIBLE_DEVICES": f"{uuids[1]},{uuids[0]}"}) == uuids[1]
    for visible, named in (("5", 0), ("", 0), (uuids[0][:8], 3)):  # out of range, no GPU, an ambiguous prefix
        with pytest.raises(SystemExit, match=f"names {named} of this machine's 3 GPU"):
            common.first_gpu_uuid({"CUDA_VISIBLE_DEVICES": visible})


def test_a_steady_window_is_compared_only_with_the_devices_it_metered(fake_pynvml, h100_trace_dir: Path) -> None:
    record = json.loads(SHIPPED_RECORD.read_text())
    steady = next(w for w in record["windows"] if w["name"] == "steady")
    energy = steady["energy"]
    alone = common.steady_against_counter(record, None)
    assert alone["energy J"] == energy["energy_j"] and "deviation %" not in alone
    assert alone["bound %"] == pytest.approx(100 * energy["error_bound_j"] / energy["energy_j"])
    energy["error_bound_j"] = None
    assert common.steady_against_counter(record, None)["bound %"] is None  # n/a, never 0
    fake_pynvml.configure(h100_trace_dir, devices=2)
    with common.CounterPoller(common.gpu_uuids()[1:]) as poller:  # reads the second GPU only
        energy["per_device"] = [{"uuid": common.gpu_uuids()[0]}]
        row = common.steady_against_counter(record, poller)
    assert row["deviation %"] == "not compared: the record's devices were not read"


def test_a_driver_option_given_after_the_double_dash_replaces_the_script_s_own() -> None:
    """The drivers refuse an option given twice with different values (issue 61): the scripts' defaults give way."""
    from benchmarks.common import unless_given

    defaults = ["-m", "llm_training", "train", "--model", "800M", "--no-idle-baseline", "--iterations", "5"]
    assert unless_given(defaults, ["--model", "tiny", "--iterations=7"]) == [
        "-m", "llm_training", "train", "--no-idle-baseline", "--model", "tiny", "--iterations=7"]
    assert unless_given(defaults, []) == defaults
