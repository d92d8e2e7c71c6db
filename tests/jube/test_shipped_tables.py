"""The shipped run records give the same table fields and the same JUBE tables as at 26b2573 (issue 42 part 3).

Golden files (tests/jube/golden/) were written by the code of 26b2573, before the workload table, the included
workflow fragment and the typed patterns: `JOULEBENCH_WRITE_GOLDEN=1 pytest tests/jube/test_shipped_tables.py`
rewrites them, for a change that means to alter a table (say why in the commit).

Two levels. Every shipped record (benchmarks/results/**/*run_record.json) through jbrecord.py's fields, as a job
writes them into result.txt. And real JUBE run directories: each workflow run for real on `local` with sweep
points validate refuses at once (no driver starts), each point's result.txt then replaced by the fields of a
shipped record under the point's own job.env, `jube result -a` reading them with the workflow's real patterns
and tables, and the full table (jube/jbtable.py, the compare step's) written again from them; JUBE's analysis
(analyse.xml) holds each typed pattern as the number its printed twin shows. The full tables were JUBE's CSV tables
until they left JUBE (`jube result` printed them): their golden files are JUBE's, byte for byte but for a note with
double quotes, which the full table quotes as CSV does (JUBE's CSV did not).
"""

from __future__ import annotations

import json
import os
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from joulebench.record import read_run_record
from tests.jube.conftest import (
    JUBE_DIR,
    LLM_XML,
    REPO,
    RESNET_XML,
    TABLE_WIDTH,
    jube,
    jube_run,
    requires_jube,
    submit_workdirs,
)
from tests.jube.test_record_fields import jbrecord, jbsettings
from tests.jube.test_static import _is_number, _typed

GOLDEN = Path(__file__).resolve().parent / "golden"
WRITE = os.environ.get("JOULEBENCH_WRITE_GOLDEN") == "1"
SHIPPED = sorted(REPO.glob("benchmarks/results/**/*run_record.json"))
INFERENCE_XML = JUBE_DIR / "inference_benchmark.xml"
jbtable = sys.modules["jbtable"]  # loaded by jbprofile (through test_record_fields) from the same directory
# Per workflow: its XML, its tags (one framework for ResNet-50), JUBE's tables, a sweep parameter whose negative values
# validate refuses before any driver runs, and the driver whose shipped records fill its rows.
WORKFLOWS = {
    "llm": (LLM_XML, ["local"], ("llm",), "JOULEBENCH_SWEEP_NODES", "llm_training"),
    "resnet50": (RESNET_XML, ["local", "pytorch"], ("resnet50",), "JOULEBENCH_SWEEP_NODES", "resnet50"),
    "inference": (INFERENCE_XML, ["local"], ("inference",), "JOULEBENCH_SWEEP_BATCH_SIZE", "llm_inference"),
}
# job.env as jbprofile.py writes it for a point of each workflow on a Slurm system, sweep coordinates empty
SWEEPS = {
    "llm_training": ("llm", "nodes,global_batch_size,micro_batch_size,tensor_parallel,pipeline_parallel,seq_length,"
                            "precision,iterations,warmup_iterations,steady_seconds,power_limit,sm_clock"),
    "resnet50": ("resnet50", "framework,nodes,global_batch_size,image_size,precision,iterations,warmup_iterations,"
                             "steady_seconds,power_limit,sm_clock"),
    "llm_inference": ("inference", "task,batch_size,engine,rate,max_concurrency,slo_ttft_ms,slo_tpot_ms,"
                                   "min_window_s,precision,steady_seconds,power_limit,sm_clock"),
}


def point_settings(driver: str) -> dict[str, str]:
    benchmark, sweep = SWEEPS[driver]
    return {"JB_BENCHMARK": benchmark, "JB_DRIVER": driver, "JB_SYSTEM": "H100", "JB_MODEL": "preset",
            "JB_LAUNCHER": "slurm", "JB_SWEEP": sweep, "JB_NOTE": "", "JB_ALLOW_PARTIAL": "no",
            "JB_WORKDIR": "/nonexistent"}


def shipped_fields(path: Path) -> str:
    record = read_run_record(path)
    return jbrecord.render(jbrecord.table_fields(record, point_settings(record.benchmark)))


def check_golden(name: str, text: str) -> None:
    target = GOLDEN / name
    if WRITE:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    assert text == target.read_text(), f"{name} differs from the table of 26b2573"


def test_every_shipped_record_gives_the_fields_it_gave() -> None:
    fields = {str(path.relative_to(REPO)): shipped_fields(path) for path in SHIPPED}
    assert {read_run_record(path).benchmark for path in SHIPPED} == set(SWEEPS)  # all three drivers
    check_golden("shipped_fields.json", json.dumps(fields, indent=1, sort_keys=True) + "\n")


def records_of(driver: str) -> list[Path]:
    """The driver's first record of every kind: status, record version, serving (a requests block) or not."""
    first: dict[tuple[object, ...], Path] = {}
    for path in SHIPPED:
        document = json.loads(path.read_text())
        if document["benchmark"] == driver:
            first.setdefault((document["status"], document["schema_version"], bool(document.get("requests"))), path)
    return sorted(first.values())


@requires_jube
@pytest.mark.parametrize("workflow", sorted(WORKFLOWS))
def test_a_jube_run_directory_of_shipped_records_gives_the_tables_it_gave(workflow: str, tmp_path: Path,
                                                                          jube_env: dict[str, str]) -> None:
    xml, tags, tables, sweep_variable, driver = WORKFLOWS[workflow]
    records = records_of(driver)
    env = {**jube_env, "JOULEBENCH_VENDOR": "cpu", "JOULEBENCH_TOOL_PYTHON": sys.executable,
           sweep_variable: ",".join(str(-n) for n in range(1, len(records) + 1))}
    out = tmp_path / workflow
    jube_run(xml, tags, out, env)
    workdirs = sorted(submit_workdirs(out), key=lambda w: jbsettings.read_settings(w / "job.env")["JB_RUN_ID"])
    assert len(workdirs) == len(records)
    for workdir, record_path in zip(workdirs, records, strict=True):
        settings = jbsettings.read_settings(workdir / "job.env")
        assert settings["JB_STATUS"] == "INVALID"  # refused at once: the row is the shipped record's
        (workdir / "result.txt").write_text(jbrecord.render(jbrecord.table_fields(read_run_record(record_path),
                                                                                  settings)))
    shown = jube("result", str(out), "-a", env=env).stdout  # every table JUBE prints, the scaling ones too
    assert max(map(len, shown.splitlines())) <= TABLE_WIDTH, shown
    for table in tables:
        check_golden(f"{workflow}/{table}.dat", (out / "000000" / "result" / f"{table}.dat").read_text())
    check_golden(f"{workflow}/{workflow}.csv", jbtable.write_full_table(out / "000000", workflow).read_text())
    assert_typed_values(out / "000000" / "analyse.xml", _typed(xml))


def assert_typed_values(analyse_xml: Path, typed: dict[str, str]) -> None:
    """What JUBE analysed: each typed pattern holds its printed twin's number, as int or float, with the statistics
    JUBE reduces it to; where the row prints no number (n/a), the typed pattern has no value."""
    checked = 0
    for workpackage in ET.parse(analyse_xml).getroot().iter("workpackage"):
        found = {p.get("name"): p for p in workpackage.iter("pattern")}
        for name, printed in typed.items():
            if printed not in found:
                continue  # a pattern of the other step's file
            if not _is_number(found[printed].text or ""):
                assert name not in found, (name, found[printed].text)
                continue
            value, average = found[name], found[f"{name}_avg"]
            assert value.get("type") in ("int", "float") and average.get("type") == "float", name
            assert float(value.text) == float(average.text) == float(found[printed].text), name
            checked += 1
    assert checked > 0
