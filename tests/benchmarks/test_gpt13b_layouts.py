"""benchmarks/gpt13b_layouts.py on the CPU: its options, the commands it would launch on a 4-GPU host, and a layout
the memory estimate refuses becoming a `refused` row with estimate and capacity, never launched."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpt13b_layouts.py"
_spec = importlib.util.spec_from_file_location("gpt13b_layouts", SCRIPT)
layouts = importlib.util.module_from_spec(_spec)
sys.modules["gpt13b_layouts"] = layouts
_spec.loader.exec_module(layouts)


def test_default_layouts_are_the_issues_three_on_four_gpus(tmp_path: Path) -> None:
    args = layouts.build_arguments(["--out", str(tmp_path), "--", "--iterations", "6"])
    assert [layouts.layout_name(tp, pp, args.gpus) for tp, pp in args.layouts] == [
        "DP1-TP2-PP2", "DP1-TP4-PP1", "DP2-TP2-PP1"]
    assert args.driver_args == ["--iterations", "6"]
    with pytest.raises(argparse.ArgumentTypeError, match="'2-2' is not TPxPP"):
        layouts.parse_layouts("2x2,2-2")


def test_commands_run_every_gpu_under_jpwr_and_validate_with_the_device_memory(tmp_path: Path) -> None:
    args = layouts.build_arguments(["--out", str(tmp_path), "--device-memory-gib", "94", "--", "--iterations", "6"])
    train = layouts.train_command(4, 1, args, tmp_path / "run")
    jpwr_end = train.index("--")
    assert train[1:4] == ["-m", "jpwr", "--methods"] and "torch.distributed.run" in train[jpwr_end:]
    assert train[train.index("--nproc-per-node") + 1] == "4" and train[train.index("--tensor-parallel") + 1] == "4"
    assert train[train.index("--global-batch-size") + 1] == "128" and train[-4:-2] == ["--iterations", "6"]
    check = layouts.validate_command(2, 1, args)
    assert check[check.index("--device-memory-gib") + 1] == "94.0" and check[check.index("--devices-per-node") + 1] \
        == "4"


def test_a_layout_the_estimate_refuses_is_a_row_with_estimate_and_capacity_and_is_not_launched(tmp_path: Path) -> None:
    args = layouts.build_arguments(["--out", str(tmp_path)])
    row = layouts.run_layout(2, 1, args, energy=None, memory=None, uuids=[])  # never reaches the pollers
    assert row["status"] == "refused" and row["estimate GiB"] > args.device_memory_gib
    assert f"needs about {row['estimate GiB']:.1f} GiB per device" in row["note"]
    assert f"the device has {args.device_memory_gib:.1f} GiB" in row["note"] and "Fix: " in row["note"]
    assert not (tmp_path / row["layout"]).exists()
