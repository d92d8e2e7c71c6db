"""benchmarks/conv_stats_sweep_h100.py's tables without a GPU: each launch setting keeps its own name on every shape.

Why: the 2026-12-07 H100 sweep named its rows after the tile widths a shape had clamped, so on the 64-channel shapes
two settings shared a name, and the summary called settings that ran OK everywhere "not OK" on 2–13 shapes.
"""

from __future__ import annotations

from benchmarks import conv_stats_sweep_h100 as sweep


def test_every_setting_has_its_own_name_and_a_total_over_every_shape() -> None:
    labels = [sweep.setting_label(setting) for setting in sweep.SETTINGS]
    assert len(set(labels)) == len(labels)
    shapes = {"1x1/256-64@56": 2, "1x1/64-256@56": 4}  # a shape whose 64 outputs clamp BLOCK_N 128 to 64, and one not
    rows = [{"shape": shape, "count": count, "setting": label, "status": "OK", "µs": 10.0 + index}
            for shape, count in shapes.items() for index, label in enumerate(labels)]
    lines, figures = sweep.summary(rows)
    assert figures["totals_ms"] == {label: (10.0 + index) * 6 / 1e3 for index, label in enumerate(labels)}
    assert figures["best_ms"] == 10.0 * 6 / 1e3 and figures["no_ok_setting"] == []
    assert not any("not OK" in line for line in lines)
