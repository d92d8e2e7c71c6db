"""Records of every schema still load in every analysis verb: the shipped H100 results (schema 1 and 2, written
before the lifecycle's schema 3, and 3, written before the engine detail's words of schema 4) go through report,
compare, pareto, plan, plot and attribute unchanged."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from joulebench.analysis.cli import main
from joulebench.record import READABLE_SCHEMA_VERSIONS, SCHEMA_VERSION, read_run_record

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
# (schema version, run directory): a ResNet-50 pair with traces (schema 1), an inference pair (schema 2) and a
# serving pair with traces (schema 3)
OLD_RUNS = {
    1: ("2026-11-22-session2/h100-call4/rn/compile", "2026-11-22-session2/h100-call4/rn/compile-cudagraphs"),
    2: ("2026-11-25-session7/inference-accuracy", "2026-11-25-session7/jube-inference"),
    3: ("2026-12-06-slurm-gpu/call3-inference/inference-in-process",
        "2026-12-06-slurm-gpu/call4-inference-per-request/inference-in-process"),
}
UNREADABLE = ("is not a readable joulebench run record", "schema_version")


@pytest.fixture(scope="module")
def old_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[int, tuple[Path, Path]]:
    """Copies (attribute writes into its record) of the shipped runs, each pair checked to be of its version."""
    root = tmp_path_factory.mktemp("old-runs")
    runs = {}
    for version, pair in OLD_RUNS.items():
        copies = []
        for source in pair:
            target = root / source.replace("/", "_")
            shutil.copytree(RESULTS / source, target)
            assert json.loads((target / "run_record.json").read_text())["schema_version"] == version
            copies.append(target)
        runs[version] = (copies[0], copies[1])
    return runs


def _verb(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    err = capsys.readouterr().err
    assert not any(words in err for words in UNREADABLE), err  # the record was read, whatever the verb concluded
    return code, err


def test_every_shipped_record_version_is_readable() -> None:
    assert set(OLD_RUNS) | {SCHEMA_VERSION} == set(READABLE_SCHEMA_VERSIONS) and SCHEMA_VERSION == 4


def test_a_schema_3_engine_detail_reads_in_schema_4_words() -> None:
    """The serving engine's detail said `slot_bucket`, `request_slots` and `cache_slots`; read, it has no slot key and
    the same values under `position_bucket`, `rows` and `cache_positions`, in their places."""
    path = RESULTS / OLD_RUNS[3][0] / "run_record.json"
    shipped = json.loads(path.read_text())["config"]["engine_detail"]
    detail = read_run_record(path).config["engine_detail"]
    renamed = {"slot_bucket": "position_bucket", "request_slots": "rows", "cache_slots": "cache_positions"}
    assert list(detail.items()) == [(renamed.get(key, key), value) for key, value in shipped.items()]
    assert set(renamed) <= set(shipped) and not any("slot" in key for key in detail)


@pytest.mark.parametrize("version", sorted(OLD_RUNS))
def test_old_records_go_through_every_analysis_verb(version, old_runs, capsys, tmp_path) -> None:
    first, second = old_runs[version]
    assert _verb(capsys, "report", str(first), str(second), "-o", str(tmp_path / "report"))[0] == 0
    assert (tmp_path / "report" / "index.html").is_file()
    assert _verb(capsys, "report", "--compare", str(first), str(second))[0] == 0
    _verb(capsys, "report", "--pareto", str(first), str(second))  # not a sweep: refused or answered, never unread
    _verb(capsys, "plan", str(first), str(second))
    traced = next(first.glob("jpwr/*/trace.h5"), None)
    if traced is not None:
        assert _verb(capsys, "plot", str(first / "jpwr"), "-o", str(tmp_path / "trace.png"))[0] == 0
        code, _ = _verb(capsys, "attribute", str(first))
        if code == 0:  # the attribution block is written back: as the current schema, with everything it had kept
            rewritten = read_run_record(first / "run_record.json")
            assert rewritten.attribution is not None and rewritten.windows
            assert json.loads((first / "run_record.json").read_text())["schema_version"] == SCHEMA_VERSION
