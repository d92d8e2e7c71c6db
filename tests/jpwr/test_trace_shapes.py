"""Issue 47 item 3, traces: a jpwr trace is read once into types (jpwr.trace_io); a segment line or a trace file in the
wrong shape is a FormatError naming the file and the line (exit 65 from every verb), never an internal error.

The trace: a shipped node trace (one serving rate on an H100), written back as segments by the sampler's own
SegmentWriter, so that the lines are the ones a sampler writes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import h5py
import pytest

from joulebench.analysis.cli import main as joulebench_main
from jpwr.errors import FormatError
from jpwr.trace_io import SegmentWriter, load_trace, read_segments

REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "benchmarks" / "results" / "2026-11-25-session10" / "serving-final" / "sweep" / "rate_4" / "jpwr"
KEPT_READINGS = 400  # per sensor: enough lines of every kind, fast to write and read


@pytest.fixture(scope="module")
def segments(tmp_path_factory) -> Path:
    """The shipped trace as a node directory of segments (no trace.h5), readings cut to KEPT_READINGS a sensor."""
    trace = load_trace(next(SHIPPED.iterdir()))
    node = tmp_path_factory.mktemp("trace") / "node"
    writer = SegmentWriter(node)
    writer.header(trace.domains, trace.sensors, trace.info)
    for readings in trace.readings.values():
        for reading in readings[:KEPT_READINGS]:
            writer.reading(reading)
    for metric in trace.metrics[:KEPT_READINGS]:
        writer.metric(metric)
    for mark in trace.marks:
        writer.mark(mark)
    for batch in trace.phases:
        writer.phases(batch)
    writer.close()
    return node


def test_the_sampler_s_own_segments_read_back(segments) -> None:
    trace = read_segments(segments)
    assert trace.sensors and trace.marks and all(0 < len(r) <= KEPT_READINGS for r in trace.readings.values())


def _lines(node: Path) -> tuple[Path, list[dict]]:
    (path,) = sorted((node / "segments").glob("seg-*.jsonl"))[:1]
    return path, [json.loads(line) for line in path.read_text().splitlines()]


def _first(lines: list[dict], kind: str) -> int:
    return next(i for i, line in enumerate(lines) if line["k"] == kind)


SHAPES = {  # change of one line -> what the error names
    "list where the header's sensors belong": (
        "header", lambda rec: rec.update(sensors={"0": rec["sensors"][0]}), "is not a jpwr segment record"),
    "text where a reading's stamp belongs": ("r", lambda rec: rec.update(a="12 ns"), "a is '12 ns', not an integer"),
    "text where a reading's value belongs": ("r", lambda rec: rec.update(v="3.5 W"), "v is '3.5 W', not a number"),
    "reading without its sensor": ("r", lambda rec: rec.pop("s"), "missing field 's'"),
    "object where a metric's time belongs": ("m", lambda rec: rec.update(t={"ns": 1}), "t is {'ns': 1}, not an"),
    "mark without its name": ("mark", lambda rec: rec.pop("name"), "missing field 'name'"),
}


@pytest.mark.parametrize("case", sorted(SHAPES))
def test_a_segment_line_in_another_shape_is_refused_naming_file_and_line(segments, tmp_path, case) -> None:
    kind, change, named = SHAPES[case]
    node = tmp_path / "node"
    shutil.copytree(segments, node)
    path, lines = _lines(node)
    index = _first(lines, kind)
    change(lines[index])
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    with pytest.raises(FormatError, match=f"line {index + 1} ") as refused:
        read_segments(node)
    assert str(path) in refused.value.problem and named in refused.value.problem


def test_plot_refuses_a_broken_segment_with_exit_65_naming_the_line(segments, tmp_path, capsys) -> None:
    node = tmp_path / "jpwr" / "node"
    shutil.copytree(segments, node)
    path, lines = _lines(node)
    lines[_first(lines, "r")]["b"] = None
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    code = joulebench_main(["plot", str(tmp_path / "jpwr"), "-o", str(tmp_path / "plot.png")])
    err = capsys.readouterr().err
    assert code == 65 and f"{path} line " in err and "b is None, not an integer" in err and "Traceback" not in err


def test_a_trace_file_whose_info_is_not_an_object_is_refused_naming_it(tmp_path) -> None:
    trace = tmp_path / "trace.h5"
    shutil.copyfile(next(SHIPPED.iterdir()) / "trace.h5", trace)
    with h5py.File(trace, "r+") as h5:
        h5.attrs["info"] = json.dumps(["run_id", "x"])
    with pytest.raises(FormatError, match=f"{trace} is not a readable jpwr trace .*info is a list, not an object"):
        load_trace(trace)
