"""`jpwr qualify`: meter qualification on recorded CSVs made from the H100 trace, and live on the fake NVML.

The CSVs are what a site's export would hold, derived from tests/data/h100_trace: the reference (B) is
the energy counter turned into power between its updates, with ISO 8601 times; the meter under test (A)
is the instantaneous-power field with Unix-second times, as recorded (pass), with a 10 % gain error (fail),
or with its clock 4 s off (misaligned). Times are the wall clock of the recording (the field's own stamp).
"""

from __future__ import annotations

import csv
import datetime as dt
import gzip
import itertools
import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from jpwr.cli import main

# Windows in seconds of the trace (idle 0-3 s, 700 W matmul 3-11 s, bursts 14-20 s and 22-26 s at 30 % duty).
WINDOWS = [("w1-idle", "idle", 0.5, 2.5), ("w2-load1", "load1", 4.0, 6.0), ("w3-load2", "load2", 22.4, 23.9),
           ("w4-load1", "load1", 8.0, 10.0), ("w5-load2", "load2", 24.2, 25.7)]
LOADS = [("load1", 3.0, 11.0), ("load2", 14.0, 20.0), ("load2", 22.0, 26.0)]
GAIN_ERROR = 1.10  # the failing meter reads 10 % high


def _rows(trace_dir: Path) -> tuple[list[dict[str, int]], int, float]:
    meta = json.loads((trace_dir / "meta.json").read_text())
    with gzip.open(trace_dir / "trace.csv.gz", "rt", newline="") as fh:
        rows = [{k: int(v) for k, v in row.items()} for row in csv.DictReader(fh)]
    # the POWER_INSTANT field carries NVML's own wall-clock stamp: the recording's monotonic -> wall offset
    wall_minus_mono = statistics.median(r["power_instant_hw_us"] * 1000 - r["fields_t_after_ns"] for r in rows)
    return rows, int(meta["t_start_ns"]), wall_minus_mono


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    rows, start_ns, offset_ns = _rows(Path(__file__).resolve().parents[1] / "data" / "h100_trace")
    wall = lambda mono_ns: (mono_ns + offset_ns) / 1e9  # noqa: E731
    rel = lambda seconds: wall(start_ns + seconds * 1e9)  # noqa: E731
    out = tmp_path_factory.mktemp("qualify")
    with open(out / "reference.csv", "w", newline="") as fh:  # counter -> power between its updates
        writer = csv.writer(fh)
        writer.writerow(["timestamp", "power_w"])
        knots = [(r["counter_t_after_ns"], r["energy_mJ"]) for i, r in enumerate(rows)
                 if i == 0 or r["energy_mJ"] != rows[i - 1]["energy_mJ"]]
        for (t0, e0), (t1, e1) in itertools.pairwise(knots):
            stamp = dt.datetime.fromtimestamp(wall((t0 + t1) / 2), dt.UTC).isoformat()
            writer.writerow([stamp, (e1 - e0) / 1000 / ((t1 - t0) / 1e9)])
    for name, gain, shift in (("pass", 1.0, 0.0), ("fail", GAIN_ERROR, 0.0), ("misaligned", 1.0, 4.0)):
        with open(out / f"{name}.csv", "w", newline="") as fh:
            writer = csv.writer(fh)
            writer.writerow(["time_s", "Power (W)"])
            for r in rows:
                writer.writerow([r["power_instant_hw_us"] / 1e6 + shift, r["power_instant_mW"] / 1000 * gain])
    schedule = {"schema": "jpwr.qualify/1", "problems": [],
                "windows": [{"name": n, "load": load, "t0_wall_s": rel(a), "t1_wall_s": rel(b)}
                            for n, load, a, b in WINDOWS],
                "loads": [{"load": load, "start_wall_s": rel(a), "end_wall_s": rel(b)} for load, a, b in LOADS]}
    (out / "schedule.json").write_text(json.dumps(schedule))
    return out


def _qualify(recorded: Path, meter_a: str, *extra: str) -> tuple[int, dict]:
    out = recorded / f"out-{meter_a}-{len(extra)}"
    code = main(["qualify", f"csv:{recorded / meter_a}.csv", f"csv:{recorded / 'reference'}.csv",
                 "--windows", str(recorded / "schedule.json"), "--out", str(out), *extra])
    return code, json.loads((out / "qualify_result.json").read_text())


def test_a_meter_that_agrees_passes_with_the_olympic_score_of_the_middle_three(recorded, capsys):
    code, result = _qualify(recorded, "pass")
    diffs = [w["relative_difference"] for w in result["windows"]]
    assert len(diffs) == 5 and None not in diffs
    assert result["olympic_score"] == pytest.approx(statistics.fmean(sorted(map(abs, diffs))[1:4]))
    assert result["status"] == "PASS" and code == 0 and result["olympic_score"] <= 0.05
    assert result["meets_target"] == (result["olympic_score"] <= 0.01)
    assert abs(result["clock_offsets"]["a"]["detected_s"]) < 1.0 and not result["problems"]
    assert "Olympic score" in capsys.readouterr().out


def test_a_meter_reading_ten_percent_high_fails(recorded):
    code, result = _qualify(recorded, "fail")
    _, agreeing = _qualify(recorded, "pass")
    assert result["status"] == "FAIL" and code == 1 and result["olympic_score"] > 0.05
    for high, good in zip(result["windows"], agreeing["windows"], strict=True):
        assert high["relative_difference"] == pytest.approx(GAIN_ERROR * (1 + good["relative_difference"]) - 1)


def test_misaligned_clocks_are_detected_reported_and_only_accepted_when_corrected(recorded):
    code, result = _qualify(recorded, "misaligned")
    assert result["status"] == "INVALID" and code == 2
    assert result["clock_offsets"]["a"]["detected_s"] == pytest.approx(4.0, abs=0.3)
    assert any("clock is +4" in p and "--offset-a 4" in p for p in result["problems"])
    code, corrected = _qualify(recorded, "misaligned", "--offset-a", "4.0")
    assert corrected["status"] == "PASS" and code == 0 and corrected["clock_offsets"]["a"]["applied_s"] == 4.0
    assert corrected["olympic_score"] == pytest.approx(_qualify(recorded, "pass")[1]["olympic_score"], rel=0.05)


@pytest.mark.parametrize(("args", "text"), [
    (["nvml-power-poll:fast", "nvml"], "interval 'fast'"),
    (["csv:a.csv", "csv:b.csv"], "two CSV meters and no --windows"),
    (["bogus:x", "nvml"], "unknown meter 'bogus:x'"),
])
def test_bad_meter_specs_are_refused_with_a_fix(args, text, tmp_path, capsys):
    assert main(["qualify", *args, "--out", str(tmp_path)]) == 64
    err = capsys.readouterr().err
    assert text in err and "Fix:" in err


def test_a_csv_without_recognisable_columns_names_them(recorded, tmp_path, capsys):
    (tmp_path / "odd.csv").write_text("when,how_much\n1,2\n")
    code = main(["qualify", f"csv:{tmp_path / 'odd.csv'}", f"csv:{recorded / 'reference.csv'}",
                 "--windows", str(recorded / "schedule.json"), "--out", str(tmp_path / "o")])
    assert code == 64 and "['when', 'how_much']" in capsys.readouterr().err


def test_live_run_meters_five_windows_with_jpwr_and_the_polled_average(fake_env, h100_trace_dir, tmp_path):
    """Both live meters on the replayed H100 (fake NVML); user commands as loads. Short windows."""
    env = fake_env(JPWR_FAKE_NVML_TRACE=str(h100_trace_dir))
    result = subprocess.run([sys.executable, "-m", "jpwr", "qualify", "nvml", "nvml-power-poll:100ms",
                             "--window-seconds", "1", "--lead-seconds", "0.3", "--load1", "sleep 30",
                             "--load2", "sleep 30", "--out", str(tmp_path)],
                            env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode in (0, 1), result.stderr[-3000:] + result.stdout[-2000:]
    outcome = json.loads((tmp_path / "qualify_result.json").read_text())
    schedule = json.loads((tmp_path / "qualify.json").read_text())
    assert [w["load"] for w in schedule["windows"]] == ["idle", "load1", "load2", "load1", "load2"]
    assert len(schedule["loads"]) == 4 and schedule["load_commands"]["load1"] == ["sleep", "30"]
    for w in outcome["windows"]:
        assert w["energy_a_j"] > 0 and w["energy_b_j"] > 0
        assert w["relative_difference"] == pytest.approx(w["energy_a_j"] / w["energy_b_j"] - 1)
    assert outcome["status"] == ("PASS" if outcome["olympic_score"] <= 0.05 else "FAIL")
    assert (tmp_path / "jpwr").is_dir() and "Olympic score" in result.stdout
