"""Issue 61: one typed reader for the job settings (job.env) and for the recommend step's inputs.

A job.env that is missing, empty, not UTF-8, not KEY=value, with an unclosed quote, or cut short (inside a value or at
a line's end) stops `jbprofile.py submit` with one line naming the file, the line and the fix (exit 64), never a
traceback. The recommend step (documented never to fail the workflow) given a target with an unclosed quote, a point
whose record is truncated or a JSON list, or recommend's own output in another shape says so in one line and exits 0.
The scripts run as the workflow runs them: the login node's python3, as subprocesses.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.jube.conftest import JUBE_DIR

sys.path.insert(0, str(JUBE_DIR))
import jbrecommend
import jbsettings

SETTINGS = {"JB_STATUS": "OK", "JB_REASON": "", "JB_SYSTEM": "local", "JB_SETUP": "module load x\nsource 'a b'",
            "JB_LAUNCHER": "local", "JB_RUN_ID": "llm-000001", "JB_NOTE": "one; two"}


def jbprofile(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["python3", str(JUBE_DIR / "jbprofile.py"), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=60, check=False)


def written(tmp_path: Path) -> bytes:
    path = tmp_path / "good.env"
    jbsettings.write_settings(path, SETTINGS)
    return path.read_bytes()


def test_the_reader_reads_back_what_the_writer_wrote(tmp_path) -> None:
    path = tmp_path / "job.env"
    jbsettings.write_settings(path, SETTINGS)
    assert jbsettings.read_settings(path) == SETTINGS


DAMAGED = {  # name -> (the file's bytes from a good one, words the error must say)
    "missing": (lambda good: None, "cannot be read (No such file or directory)"),
    "empty": (lambda good: b"", "is empty (no KEY=value line)"),
    "comment only": (lambda good: good.splitlines(keepends=True)[0], "is empty (no KEY=value line)"),
    "not UTF-8": (lambda good: good.replace(b"one; two", b"one\xff two"), "line 9 is not UTF-8 text"),
    "cut inside a quoted value": (lambda good: good[:good.index(b"source '")], "line 5: no closing quotation"),
    "cut at a line's end": (lambda good: b"".join(good.splitlines(keepends=True)[:4]),
                            "holds 3 settings, its header counts 7 (truncated after line 4?)"),
    "cut inside a key": (lambda good: good[:good.index(b"JB_RUN_ID") + 4], "line 8: 'JB_R' is not KEY=value"),
    "not KEY=value": (lambda good: good + b"echo hello\n", "line 10: 'echo' is not KEY=value"),
    "an unclosed quote": (lambda good: good.replace(b"'one; two'", b"'one; two"), "line 9: no closing quotation"),
    "a key set twice": (lambda good: good + b"JB_STATUS=INVALID\n", "line 10: JB_STATUS is set twice"),
}


@pytest.mark.parametrize("case", DAMAGED)
def test_a_damaged_job_env_stops_submit_with_one_line_naming_file_line_and_fix(tmp_path, case) -> None:
    damage, words = DAMAGED[case]
    content = damage(written(tmp_path))
    path = tmp_path / "job.env"
    if content is not None:
        path.write_bytes(content)
    result = jbprofile("submit", "--settings", "job.env", cwd=tmp_path)
    assert result.returncode == 64, result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert result.stderr.startswith("jbprofile: error: job settings job.env ") and words in result.stderr, \
        result.stderr
    assert ". Fix: " in result.stderr and "jube run" in result.stderr
    assert not (tmp_path / "job.done").exists()  # nothing submitted, nothing recorded as done


def _point(rundir: Path, name: str, record: str | None) -> None:
    work = rundir / f"000001_{name}_submit" / "work"
    (work / "run").mkdir(parents=True)
    jbsettings.write_settings(work / "job.env", {**SETTINGS, "JB_OUT_DIR": str(work / "run")})
    if record is not None:
        (work / "run" / "run_record.json").write_text(record)


def test_the_recommend_step_leaves_out_unreadable_points_and_never_fails(tmp_path) -> None:
    rundir = tmp_path / "run"
    _point(rundir, "truncated", '{"kind": "joulebench.run_record", "run_id": "a", "launch": {"node_na')
    _point(rundir, "list", json.dumps([{"run_id": "b"}]))
    _point(rundir, "no-run-id", json.dumps({"run_id": None, "launch": {}}))
    _point(rundir, "damaged-env", None)
    env = rundir / "000001_damaged-env_submit" / "work" / "job.env"
    env.write_bytes(b"".join(env.read_bytes().splitlines(keepends=True)[:-1]))  # its last line lost
    result = jbprofile("recommend", "--rundir", str(rundir), "--target", "--max-slowdown 5%", cwd=tmp_path)
    assert result.returncode == 0 and "Traceback" not in result.stdout + result.stderr, result.stderr
    said = result.stdout
    assert "000001_truncated_submit/work: " in said and "is not readable JSON" in said
    assert "000001_list_submit/work: " in said and "holds a JSON list, not an object" in said
    assert "000001_no-run-id_submit/work: " in said and "run_id is None, not a text" in said
    assert "000001_damaged-env_submit/work: job settings " in said and "its header counts 8 (truncated" in said
    assert "no point left a run record" in said


def test_the_recommend_step_given_a_target_with_an_unclosed_quote_says_so_in_one_line(tmp_path) -> None:
    result = jbprofile("recommend", "--rundir", str(tmp_path), "--target", "--default 'batch_size=1", cwd=tmp_path)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    assert result.stdout.startswith("jbprofile: recommend: the target \"--default 'batch_size=1\" "
                                    "(JOULEBENCH_RECOMMEND) cannot be split into options (No closing quotation). "
                                    "Fix: close its quotes")


@pytest.mark.parametrize(("content", "words"), [
    ("[1, 2]", "holds a JSON list, not an object"),
    ('{"recommended": {"runs": []}, "default": {"runs": ["r1"]}}', "recommended.runs is [], not a list of run ids"),
    ('{"recommended": {"runs": ["r2"]}, "default": "r1"}', "default.runs is None, not a list of run ids"),
])
def test_recommends_own_output_in_another_shape_is_unreadable_naming_the_field(tmp_path, content, words) -> None:
    path = tmp_path / "predicted.json"
    path.write_text(content)
    with pytest.raises(jbrecommend.Unreadable, match=words.replace("[", r"\[").replace("]", r"\]")):
        jbrecommend.chosen_runs(jbrecommend.json_object(path), path)
    good = {"recommended": {"runs": ["r2", "r3"]}, "default": {"runs": ["r1"]}, "is_default": False}
    path.write_text(json.dumps(good))
    assert jbrecommend.chosen_runs(jbrecommend.json_object(path), path) == ("r1", "r2")
