"""A disk that fails under a run (issue 32, item 3): final files are written whole or not at all, and a run whose
record its output directory cannot take keeps its figures, says where they went and exits 74.

The disk is real (tests/failing_disk.py): a small tmpfs the test mounts and fills as root, as CI runs; a
read-only directory otherwise. The driver is real too: the tiny GPT on the CPU, its disk failing while it trains.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from joulebench.lifecycle import fallback_paths
from joulebench.record import RECORD_NOT_WRITTEN, RunRecord, read_run_record, summary_line
from joulebench.requests_table import FILE_NAME
from jpwr.output import atomic_path, write_atomic, write_json_atomic
from tests.driver_helpers import parse_summary
from tests.failing_disk import FailingDisk, failing_disk

ITERATIONS = 6  # measured, after one warm-up iteration
TRAIN = ["train", "--model", "tiny", "--device", "cpu", "--iterations", str(ITERATIONS), "--warmup-iterations", "1",
         "--log-interval", "1", "--no-idle-baseline"]
STARTED = "[llm_training] step 1/"  # its data cache is written: the disk fails while it trains


@pytest.fixture
def disk(tmp_path: Path, request: pytest.FixtureRequest):
    with failing_disk(tmp_path / "disk", request) as failing:
        yield failing


def _driver_on_a_disk_that_fails(disk: FailingDisk, out: Path, env: dict[str, str], cwd: Path,
                                  extra: list[str]) -> subprocess.CompletedProcess:
    """Start the run, stop it (SIGSTOP) once its first step is logged, make the disk fail, let it finish: the
    steps left take more than a second, the stop comes within milliseconds."""
    cmd = [sys.executable, "-m", "llm_training", *TRAIN, *extra, "--out-dir", str(out)]
    proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if line.startswith(STARTED):
            break
    assert seen and seen[-1].startswith(STARTED), "".join(seen)[-3000:]
    proc.send_signal(signal.SIGSTOP)
    try:
        disk.fail()
    finally:
        proc.send_signal(signal.SIGCONT)
    stdout, stderr = proc.communicate(timeout=300)
    return subprocess.CompletedProcess(cmd, proc.returncode, "".join(seen) + stdout, stderr)


@pytest.mark.parametrize("metered", [False, True], ids=["unmetered", "in-process sampler"])
def test_a_run_whose_disk_fails_keeps_its_figures_elsewhere_and_exits_74(disk, fake_env, h100_trace_dir, tmp_path,
                                                                          metered):
    """Metered: the in-process sampler writes its trace and summary under <out-dir>/jpwr, on the failing disk too;
    its failing last writes are a warning of the record, which is still written (elsewhere) with its energy."""
    elsewhere = tmp_path / "elsewhere"  # $TMPDIR: another file system than the failing one
    elsewhere.mkdir()
    env = fake_env(TMPDIR=str(elsewhere), JPWR_FAKE_NVML_TRACE=str(h100_trace_dir))
    env.pop("JPWR_ADDR", None)
    out = disk.path / "run"
    result = _driver_on_a_disk_that_fails(disk, out, env, tmp_path, ["--energy-methods", "nvml"] if metered else [])

    assert result.returncode == RECORD_NOT_WRITTEN == 74, result.stderr[-3000:]
    last = result.stdout.strip().splitlines()[-1]
    assert last.startswith("JOULEBENCH_RESULT ") and " status=OK " in last
    fallback = elsewhere / fallback_paths(parse_summary(result.stdout)["run_id"], out)[0].name
    assert f"cannot write the run record {out / 'run_record.json'}" in result.stderr
    assert f"wrote it to {fallback} instead" in result.stderr
    record = read_run_record(fallback)
    assert summary_line(record) == last  # the record is the one the summary line was printed from
    assert record.status == "OK" and record.metrics["iterations"] == ITERATIONS and record.finished_at
    assert not [p.name for p in out.iterdir() if "run_record" in p.name]  # no record, no temporary one
    if metered:
        assert record.metrics["energy_wh"] > 0
        assert any(w.startswith("the in-process sampler could not finish its files: ") for w in record.warnings)


# A run's life with nothing in it, whose output directory and every fallback are full: /dev/shm is a full tmpfs of
# a private mount namespace, $TMPDIR is /proc (no files can be made there).
NOWHERE_LEFT = """
import sys
from joulebench.launch import LaunchEnv
from joulebench.lifecycle import Lifecycle
with Lifecycle("llm_training", LaunchEnv.from_env()) as life:
    with life.run("r-1", "/dev/shm/run", {}, metrics=lambda record: {"work_unit": "tokens"}):
        pass
sys.exit(life.exit_code())
"""


def test_with_no_file_system_left_the_record_goes_to_stderr_only(fake_env, tmp_path):
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("needs root and unshare: /dev/shm is made full in a private mount namespace")
    shell = 'mount -t tmpfs -o size=64k tmpfs /dev/shm && { head -c 1M /dev/zero > /dev/shm/filler; exec "$@"; }'
    result = subprocess.run(["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", shell, "sh",
                             sys.executable, "-c", NOWHERE_LEFT], env=fake_env(TMPDIR="/proc"), cwd=tmp_path,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == RECORD_NOT_WRITTEN, result.stderr[-3000:]
    said = ("cannot write the run record /dev/shm/run/run_record.json (No space left on device), nor to /proc or "
            "/dev/shm: the record follows on stderr only\n")
    assert said in result.stderr
    record = RunRecord.from_dict(json.loads(result.stderr.split(said, 1)[1]))
    assert summary_line(record) == result.stdout.strip().splitlines()[-1]
    assert record.status == "OK" and record.run_id == "r-1"


def _json(path: Path) -> None:
    write_json_atomic(path, {"figures": list(range(100_000))})


def _text(path: Path) -> None:
    write_atomic(path, "n/a\n" * 100_000)


def _streamed(path: Path) -> None:
    """A writer that opens the file itself (as h5py and savefig do), through the context-manager form."""
    with atomic_path(path) as tmp, open(tmp, "wb") as handle:
        for _ in range(64):
            handle.write(os.urandom(1 << 15))


WRITERS: dict[str, Callable[[Path], None]] = {"json": _json, "text": _text, "streamed": _streamed}


def test_a_temporary_file_is_hidden_and_no_reader_pattern_matches_it(tmp_path):
    """A temporary file a killed writer leaves (SIGKILL skips the clean-up) must not be read as a final one: it is
    hidden and ends in .tmp, so *.json, *.h5 and the readers' dotfile checks pass it by; it has the umask's mode."""
    target = tmp_path / "n1.json"
    with atomic_path(target) as tmp:
        assert tmp.parent == tmp_path and tmp.name.startswith(".n1.json.") and tmp.suffix == ".tmp"
        assert list(tmp_path.glob("*.json")) == []
        mode = tmp.stat().st_mode & 0o777
    umask = os.umask(0o022)
    os.umask(umask)
    assert mode == 0o666 & ~umask and (target.stat().st_mode & 0o777) == mode


@pytest.mark.parametrize("writer", list(WRITERS))
def test_a_failing_write_keeps_the_previous_file_and_leaves_no_temporary_file(disk, writer):
    target = disk.path / "result.json"
    write_json_atomic(target, {"previous": True})
    disk.fail()
    with pytest.raises(OSError) as failed:
        WRITERS[writer](target)
    assert failed.value.errno == disk.expected_errno()
    assert failed.value.filename == str(target)  # the message names the file, never "No space left on device:."
    assert json.loads(target.read_text()) == {"previous": True}
    assert sorted(p.name for p in disk.path.iterdir() if p.name != ".filler") == ["result.json"]


def test_a_failing_preprocess_leaves_no_half_written_dataset_and_keeps_the_earlier_one(disk, tmp_path):
    from llm_training.preprocess import preprocess
    from tests.llm_training.test_preprocess import DOCUMENTS, _train_tokenizer

    tokenizer = _train_tokenizer(tmp_path)
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": doc}) + "\n" for doc in DOCUMENTS * 20))
    prefix = disk.path / "data" / "corpus"
    preprocess(str(corpus), str(prefix), tokenizer)  # the earlier pair, under the same prefix
    earlier = {path.name: path.read_bytes() for path in (disk.path / "data").iterdir()}
    assert sorted(earlier) == ["corpus.bin", "corpus.idx"]
    corpus.write_text("".join(json.dumps({"text": doc}) + "\n" for doc in DOCUMENTS * 40))
    disk.fail()
    with pytest.raises(OSError) as failed:
        preprocess(str(corpus), str(prefix), tokenizer)
    assert failed.value.errno == disk.expected_errno()
    assert {path.name: path.read_bytes() for path in (disk.path / "data").iterdir()} == earlier


def test_a_load_run_whose_request_table_cannot_be_written_keeps_its_figures(tmp_path, capsys):
    """The table is written at the end of the load and again with its energy columns; a write the OS refuses there
    (here a directory in the table's place: the rename onto it fails) is a warning, the measurement stays OK."""
    from llm_inference.cli import main

    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps({"arrival_s": 0.02 * i, "prompt_ids": [3 + i, 4, 5], "output_tokens": 2})
                             + "\n" for i in range(8)))
    out = tmp_path / "load"
    (out / FILE_NAME).mkdir(parents=True)
    assert main(["load", "--preset", "tiny", "--device", "cpu", "--trace", str(trace), "--max-concurrency", "2",
                 "--steady-seconds", "0.1", "--out-dir", str(out)]) == 0
    record = read_run_record(out / "run_record.json")
    assert record.status == "OK" and record.metrics["output_tokens_per_s"] > 0 and record.metrics["ttft_p90_s"] > 0
    assert record.requests["file"] is None and record.requests["rows"] == 8 and "energy" in record.requests
    assert record.requests["file_unavailable_reason"].startswith("not written: ")
    assert f"the per-request table {out / FILE_NAME} was not written: " in " ".join(record.warnings)
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("JOULEBENCH_RESULT ") and " status=OK " in last


# A sweep of two points: the first fails, the second's output directory cannot be made (a file is in the way).
SWEEP = """
import sys
from joulebench.launch import LaunchEnv
from joulebench.lifecycle import Lifecycle
with Lifecycle("llm_training", LaunchEnv.from_env()) as life:
    with life.run("r-1", "ok", {}, metrics=lambda record: {"work_unit": "tokens"}):
        raise RuntimeError("the first point fails")
    with life.run("r-2", "blocked/run", {}, metrics=lambda record: {"work_unit": "tokens"}):
        pass
sys.exit(life.exit_code())
"""


def test_a_sweep_with_a_record_written_elsewhere_exits_74_whatever_failed_first(fake_env, tmp_path):
    """74 tells a wrapper to look for a record elsewhere; the first point's FAILED (exit 1) is in its own record."""
    (tmp_path / "blocked").write_text("a file, not a directory")
    result = subprocess.run([sys.executable, "-c", SWEEP], env=fake_env(TMPDIR=str(tmp_path)), cwd=tmp_path,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == RECORD_NOT_WRITTEN, result.stderr[-3000:]
    assert read_run_record(tmp_path / "ok" / "run_record.json").status == "FAILED"
    assert read_run_record(tmp_path / fallback_paths("r-2", tmp_path / "blocked" / "run")[0].name).status == "OK"


def test_a_full_disk_before_the_load_starts_is_refused_naming_the_path(disk, fake_env, h100_trace_dir, tmp_path):
    """Issue 61: a full disk before `load` started ended in a traceback naming no path (an empty probe file is still
    created on a full disk; the sampler's first write then failed on a flush, which names no file). The driver's
    output directory and jpwr's are refused at once (exit 73), each naming the directory."""
    out = disk.path / "run"
    out.mkdir()
    disk.fail()
    env = fake_env(JPWR_FAKE_NVML_TRACE=str(h100_trace_dir))
    load = subprocess.run([sys.executable, "-m", "llm_inference", "load", "--preset", "tiny", "--task", "tiny",
                           "--device", "cpu", "--rate", "max", "--requests", "2", "--max-concurrency", "2",
                           "--no-idle-baseline", "--energy-methods", "nvml", "--out-dir", str(out)],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert load.returncode == 73 and "Traceback" not in load.stderr, load.stderr[-3000:]
    assert f"llm_inference: error: --out-dir {out} cannot be written (" in load.stderr
    meter = subprocess.run([sys.executable, "-m", "jpwr", "--methods", "nvml", "--out", str(out / "jpwr"), "--",
                            "true"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert meter.returncode == 73 and "Traceback" not in meter.stderr, meter.stderr[-3000:]
    assert f"{out / 'jpwr'}" in meter.stderr and "Fix:" in meter.stderr
