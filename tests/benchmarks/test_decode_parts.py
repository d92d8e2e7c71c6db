"""benchmarks/decode_parts_h100.py off a GPU: its settings are refused by name, and the step it counts from its
parts is the parts' sum (each GEMM times its calls, one layer's attention times the layers)."""

from __future__ import annotations

import pytest

from benchmarks import decode_parts_h100 as parts


def test_settings_are_block_warps_stages() -> None:
    assert parts.parse_settings("64x4x3,128x8x2") == [(64, 4, 3), (128, 8, 2)]
    for bad in ("64x4", "64x0x3", "ax4x3"):
        with pytest.raises(SystemExit, match=f"--settings '{bad}': not BLOCKxWARPSxSTAGES"):
            parts.parse_settings(bad)


def test_llama_8b_matrices_are_the_step_s() -> None:
    shapes = {name: (outputs, inputs, calls) for name, outputs, inputs, calls in parts.gemms("llama-8b")}
    assert shapes == {"Q/K/V": (6144, 4096, 32), "out": (4096, 4096, 32), "gate/up": (28672, 4096, 32),
                      "down": (4096, 14336, 32), "LM head": (128256, 4096, 1)}


def test_the_step_is_counted_from_its_parts() -> None:
    gemm_rows = [{"ms": 0.2, "of reference": 0.5, "calls": 32}, {"ms": 1.0, "of reference": 0.8, "calls": 1}]
    copy = 2.5e12  # the card's copy rate, bytes/s; each row's share of it as measure_attention writes it
    attention = [{"status": "OK", "module's": True, "setting": "64x4x3", "ms": 0.25, "K/V GB/s": 2000.0,
                  "of copy rate": 2000e9 / copy},
                 {"status": "OK", "module's": False, "setting": "128x8x3", "ms": 0.2, "K/V GB/s": 2500.0,
                  "of copy rate": 2500e9 / copy},
                 {"status": "failed: OutOfResources", "module's": False, "setting": "128x8x4"}]
    step = parts.step_row(512, gemm_rows, attention, layers=32)
    assert step["GEMMs ms"] == pytest.approx(0.2 * 32 + 1.0)
    assert step["GEMMs ms at reference rate"] == pytest.approx(0.1 * 32 + 0.8)
    assert step["attention ms (module's setting)"] == pytest.approx(8.0)
    assert step["attention ms at copy rate"] == pytest.approx(0.5e9 / copy * 1e3 * 32)  # 0.5 GB a layer
    assert (step["best setting"], step["attention ms (best)"]) == ("128x8x3", pytest.approx(6.4))
    assert step["sum ms"] == pytest.approx(7.4 + 8.0)
