"""Every default JUBE table within 160 columns, its Point led by the swept coordinates, refused points included
(issue 62 item 4).

A serving sweep on `local` (rates 2, 4 and max at tensor_parallel 2, which a CPU node refuses before any driver
runs), then two of its points made points that ran, as prepare writes them (jbprofile.build_settings at
tensor_parallel 1, every static coordinate resolved from the profile) with rows of shipped serving records: the rows
mix refused and measured points, as a sweep with a refused point does. At f2ca47e the refused point's unresolved
coordinates read `default` beside the others' values, so every static coordinate looked swept and the table was
184-187 columns wide with the swept rate cut from the label.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from joulebench.record import read_run_record
from tests.jube.conftest import (
    JUBE_DIR,
    REPO,
    TABLE_WIDTH,
    default_table,
    jube,
    jube_run,
    requires_jube,
    submit_workdirs,
)
from tests.jube.test_profile import CLEAN_ENV, jbprofile
from tests.jube.test_record_fields import jbrecord, jbsettings

SERVING = sorted(path for path in REPO.glob("benchmarks/results/**/run_record.json")
                 if json.loads(path.read_text()).get("requests") and json.loads(path.read_text())["status"] == "OK")


def _as_run(workdir: Path, record_path: Path, env: dict[str, str]) -> None:
    """The point as prepare writes a point that runs (tensor_parallel 1, its own rate and run id), its row the
    shipped record's, as its job's recorder writes it."""
    refused = jbsettings.read_settings(workdir / "job.env")
    settings = {**refused, **jbprofile.build_settings("inference", ["local"], {"rate": refused["JB_COORD_RATE"]},
                                                      refused["JB_RUN_ID"], env)}  # the step's own paths kept
    jbsettings.write_settings(workdir / "job.env", settings)
    (workdir / "result.txt").write_text(jbrecord.render(jbrecord.table_fields(read_run_record(record_path),
                                                                              settings)))


@requires_jube
def test_a_serving_sweep_with_a_refused_point_fits_160_columns_led_by_its_rate(jube_env, tmp_path):
    env = {**jube_env, "JOULEBENCH_VENDOR": "cpu", "JOULEBENCH_SWEEP_TENSOR_PARALLEL": "2",
           "JOULEBENCH_SWEEP_RATE": "2,4,max"}
    out = tmp_path / "serving"
    jube_run(JUBE_DIR / "inference_benchmark.xml", ["local"], out, env)
    workdirs = sorted(submit_workdirs(out), key=lambda w: jbsettings.read_settings(w / "job.env")["JB_RUN_ID"])
    for workdir, record_path in zip(workdirs[:2], SERVING, strict=False):
        _as_run(workdir, record_path, {**CLEAN_ENV, "JOULEBENCH_VENDOR": "cpu"})
    rundir = out / "000000"
    jbrecord.write_comparison(rundir)  # the compare step's file of each point, then its copy in the step
    for work in rundir.glob("*_compare/work"):
        run_id = jbsettings.read_settings(work / "submit" / "job.env")["JB_RUN_ID"]
        shutil.copyfile(rundir / "compare" / f"{run_id}.txt", work / "compare.txt")
    shown = jube("result", str(out), "-a", env=env).stdout
    assert max(map(len, shown.splitlines())) <= TABLE_WIDTH, shown
    rows = default_table(shown, "inference")
    assert [r["Status"] for r in rows] == ["OK", "OK", "INVALID"], rows
    assert [r["Point"].split()[0] for r in rows] == ["rate=2", "rate=4", "rate=max"], rows  # the swept one leads
    assert [r["Point"] for r in rows][2] == "rate=max tp=2"  # the refused point: its swept coordinates only
    assert [r["Point"] for r in rows][:2] == ["rate=2 tp=default", "rate=4 tp=default"]  # no static coordinate


def test_point_and_reason_share_the_room_and_the_label_grows_only_to_keep_rows_apart(tmp_path):
    """Labels that would read alike at POINT_CHARS grow into what the widest Reason leaves of
    POINT_AND_REASON_CHARS (never past POINT_MAX_CHARS); the coordinate with the most values leads."""
    rundir = tmp_path / "rundir"
    grid = [(bs, rate) for bs in ("1", "2") for rate in ("0.5", "1", "max")]
    for n, (bs, rate) in enumerate(grid):
        work = rundir / f"00000{n}_submit" / "work"
        work.mkdir(parents=True)
        jbsettings.write_settings(work / "job.env", {
            "JB_RUN_ID": f"r{n}", "JB_STATUS": "OK", "JB_SWEEP": "batch_size,max_concurrency,slo_ttft_ms,rate",
            "JB_COORD_BATCH_SIZE": bs, "JB_COORD_MAX_CONCURRENCY": "64", "JB_COORD_SLO_TTFT_MS": f"{'9' * 15}{n}",
            "JB_COORD_RATE": rate})
        (work / "result.txt").write_text(f"JB short_note={'x' * (30 if n else 1)}\n")
    labels = jbrecord.point_labels(rundir)
    assert all(label.startswith("ttft_slo=999999999999999") for label in labels.values())  # six values: it leads
    assert len({label[:jbrecord.POINT_CHARS] for label in labels.values()}) == 1  # alike at POINT_CHARS ...
    assert len(set(labels.values())) == len(grid)  # ... so they grow until they read apart
    assert jbrecord.POINT_CHARS < max(map(len, labels.values())) <= jbrecord.POINT_AND_REASON_CHARS - 30
    assert "slots" not in " ".join(labels.values())  # one value: not swept
