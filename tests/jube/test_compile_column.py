"""The training workflows' Compile(s) column (issue 58): the record's `metrics.compile_s` in the row and the full
table, n/a (never 0) where nothing compiled; and the job's node-local compile cache (jube/job.sh)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from joulebench.record import read_run_record
from tests.jube.conftest import JUBE_DIR, REPO
from tests.jube.test_profile import jbworkloads
from tests.jube.test_record_fields import jbrecord
from tests.jube.test_shipped_tables import SHIPPED, point_settings

jbtable = sys.modules["jbtable"]  # loaded by jbprofile from the same directory


@pytest.mark.parametrize("driver", ["llm_training", "resnet50"])
def test_a_compiled_run_s_seconds_reach_its_row(driver: str) -> None:
    path = next(p for p in SHIPPED if read_run_record(p).benchmark == driver)
    record = read_run_record(path)
    settings = point_settings(driver)
    assert jbrecord.table_fields(record, settings)["compile_s"] == "n/a"  # older records: no figure, never 0
    compiled = dataclasses.replace(record, metrics={**record.metrics, "compile_s": 254.9})
    assert jbrecord.table_fields(compiled, settings)["compile_s"] == "254.9"


def test_the_full_tables_of_the_training_workflows_have_the_column_and_inference_s_not() -> None:
    columns = {name: jbtable.columns(workload) for name, workload in jbworkloads.WORKLOADS.items()}
    assert ("Compile(s)", "compile_s") in columns["llm"] and ("Compile(s)", "compile_s") in columns["resnet50"]
    assert all(key != "compile_s" for _, key in columns["inference"])


def test_the_job_exports_a_node_local_cache_that_the_site_s_setup_lines_may_replace(tmp_path: Path) -> None:
    """The line of job.sh that sets the directory, run by bash as the job runs it: the default under /tmp per user,
    and a value set before it (the profile's setup lines run earlier) kept."""
    line = next(text for text in (JUBE_DIR / "job.sh").read_text().splitlines()
                if text.startswith("export JOULEBENCH_COMPILE_CACHE="))
    show = f'{line}; printf %s "$JOULEBENCH_COMPILE_CACHE"'
    uid = subprocess.run(["id", "-u"], capture_output=True, text=True, check=True).stdout.strip()
    default = subprocess.run(["bash", "-c", show], capture_output=True, text=True, check=True, cwd=REPO,
                             env={"PATH": "/usr/bin:/bin"})
    assert default.stdout == f"/tmp/joulebench-compile-{uid}"
    site = subprocess.run(["bash", "-c", f"JOULEBENCH_COMPILE_CACHE={tmp_path}/lasting; {show}"],
                          capture_output=True, text=True, check=True, env={"PATH": "/usr/bin:/bin"})
    assert site.stdout == f"{tmp_path}/lasting"
