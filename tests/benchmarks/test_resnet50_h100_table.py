"""benchmarks/resnet50_h100.py's table: rates for people (a CPU smoke test's 0.28 img/s reads 0.28, not 0)."""

from __future__ import annotations

from benchmarks import resnet50_h100 as script


def _record(images_per_s: float, tflops: float) -> dict:
    return {"status": "OK", "hardware": {}, "metrics": {
        "devices": 1, "global_batch_size": 4, "compile_mode": "eager", "images_per_s": images_per_s,
        "images_per_s_per_device": images_per_s, "time_per_iteration_s": 4 / images_per_s, "energy_wh": None,
        "images_per_wh": None, "mean_power_w_per_device": None, "model_tflops_per_device": tflops,
        "energy_method": None, "energy_coverage": None}}


def test_small_rates_keep_their_digits_and_large_ones_read_whole() -> None:
    text = script.table([("cpu", _record(0.2817, 0.0031)), ("h100", _record(5910.4, 412.7))])
    cpu, h100 = (line.split() for line in text.splitlines()[2:])
    assert cpu[4:6] == ["0.282", "0.282"] and cpu[12] == "0.0031"
    assert h100[4:6] == ["5,910", "5,910"] and h100[12] == "413"
    assert cpu[9:12] == ["n/a", "n/a", "n/a"]  # missing energy reads n/a, never 0
