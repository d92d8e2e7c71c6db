"""One run lifecycle for every driver (joulebench.lifecycle): the same failure gives the same status and exit code
in llm_training, resnet50 and llm_inference, and the pieces of a run's life are called from that module only.

The failures are real: a configuration refused on this machine (a GPU asked for where torch sees none), SIGTERM
as Slurm sends it, the run's own deadline (--exit-duration-mins), and a crash in the run caused by broken input
data (a truncated Megatron .bin, JPEG files that are not images, a checkpoint whose weight file is cut short).
"""

from __future__ import annotations

import ast
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from joulebench.record import EXIT_CODES, SCHEMA_VERSION
from tests.driver_helpers import read_record, summaries

REPO = Path(__file__).resolve().parents[1]
DRIVERS = ("llm_training", "resnet50", "llm_inference")
# Each driver at its smallest on the CPU; log every step so that a stop is seen at once.
BASE = {
    "llm_training": ["train", "--model", "tiny", "--device", "cpu", "--log-interval", "1", "--no-idle-baseline"],
    "resnet50": ["train", "--framework", "pytorch", "--image-size", "64", "--global-batch-size", "8", "--device",
                 "cpu", "--log-interval", "1", "--data-workers", "0", "--no-idle-baseline"],
    "llm_inference": ["run", "--preset", "tiny", "--task", "tiny", "--device", "cpu", "--num-batches", "2",
                      "--no-idle-baseline"],
}
LONG = {"llm_training": ["--iterations", "100000", "--warmup-iterations", "1"],
        "resnet50": ["--iterations", "100000", "--warmup-iterations", "1"],
        "llm_inference": ["--min-window-s", "600"]}
# A line each driver prints once its run's life has begun (signal handlers in place).
STARTED = {"llm_training": "[llm_training] model built", "resnet50": "[resnet50] step 1/",
           "llm_inference": "[llm_inference] model tiny"}


def _llm_broken_data(tmp: Path) -> list[str]:
    """A real Megatron dataset whose index points every sequence past the end of its .bin (the counts, sizes and
    tokens intact, so the corpus reader admits it): megatron-core's reads fail inside the run. (Tokens beyond the
    vocabulary, once the crash here, are refused before megatron reads them, issue 61.)"""
    import numpy

    from llm_training.corpus import INDEX_HEADER, read_corpus_index
    from tests.llm_training.test_preprocess import preprocessed_dataset

    prefix = preprocessed_dataset(tmp)
    corpus = read_corpus_index(str(prefix))
    index = bytearray(Path(f"{prefix}.idx").read_bytes())
    pointers = len(INDEX_HEADER) + 8 + 1 + 8 + 8 + 4 * corpus.sequences  # after the header and the lengths
    index[pointers:pointers + 8 * corpus.sequences] = numpy.full(corpus.sequences, 1 << 40, "<i8").tobytes()
    Path(f"{prefix}.idx").write_bytes(bytes(index))
    return ["--vocab-size", "400", "--data-path", str(prefix), "--iterations", "3", "--warmup-iterations", "1"]


def _resnet_broken_images(tmp: Path) -> list[str]:
    """An ImageFolder tree whose files are not images: decoding the first batch fails inside a step."""
    from resnet50.cli import main as resnet

    assert resnet(["make-data", str(tmp / "images"), "--format", "jpeg", "--images", "16"]) == 0
    for image in (tmp / "images").rglob("*.jpg"):
        image.write_text("not a jpeg")
    return ["--data", str(tmp / "images"), "--iterations", "3", "--warmup-iterations", "1"]


def _inference_broken_checkpoint(tmp: Path) -> list[str]:
    """A saved tiny checkpoint whose weight file is cut short: loading it fails inside the first point's run."""
    import torch

    from llm_inference.engine import build_model
    from llm_inference.presets import PRESETS

    checkpoint = tmp / "checkpoint"
    build_model(PRESETS["tiny"], None, "fp32", "sdpa", torch.device("cpu"), seed=1).save_pretrained(checkpoint)
    for weights in checkpoint.glob("*.safetensors"):
        weights.write_bytes(weights.read_bytes()[:64])
    return ["--checkpoint", str(checkpoint), "--min-window-s", "0.3"]


BROKEN_INPUT: dict[str, Callable[[Path], list[str]]] = {
    "llm_training": _llm_broken_data, "resnet50": _resnet_broken_images, "llm_inference": _inference_broken_checkpoint,
}


def _command(driver: str, extra: list[str], out: Path) -> list[str]:
    """The driver's base command with `extra`; an option of the base that `extra` gives again is taken from `extra`
    (a command line giving one option twice with different values is refused)."""
    base = BASE[driver]
    again = {word for word in extra if word.startswith("--")}
    kept = [word for i, word in enumerate(base) if word not in again and (i == 0 or base[i - 1] not in again)]
    return [sys.executable, "-m", driver, *kept, *extra, "--out-dir", str(out)]


def _sigterm(driver: str, cmd: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    """Start the run, wait until its life has begun, then send SIGTERM as Slurm does at its time limit."""
    proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if line.startswith(STARTED[driver]):
            break
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=300)
    return subprocess.CompletedProcess(cmd, proc.returncode, "".join(seen) + out, err)


# failure -> (status, exit code, words of the reason); None: no run record (refused before the run began)
EXPECTED = {
    "bad config": (None, 64, "--device cuda but no CUDA/ROCm device is visible"),
    "SIGTERM": ("TIMEOUT", EXIT_CODES["TIMEOUT"], "SIGTERM received"),
    "out of time": ("TIMEOUT", EXIT_CODES["TIMEOUT"], "--exit-duration-mins reached"),
    "crash in the run": ("FAILED", EXIT_CODES["FAILED"], "Error"),
}


@pytest.mark.slow
@pytest.mark.parametrize("failure", list(EXPECTED))
@pytest.mark.parametrize("driver", DRIVERS)
def test_the_same_failure_gives_the_same_status_and_exit_code(driver, failure, fake_env, tmp_path):
    out = tmp_path / "run"
    env = fake_env()
    env.pop("JPWR_ADDR", None)
    if failure == "bad config":
        result = subprocess.run(_command(driver, ["--device", "cuda"], out), env=env, cwd=tmp_path,
                                capture_output=True, text=True, timeout=300)
    elif failure == "SIGTERM":
        result = _sigterm(driver, _command(driver, LONG[driver], out), env, tmp_path)
    elif failure == "out of time":
        result = subprocess.run(_command(driver, [*LONG[driver], "--exit-duration-mins", "0.001"], out), env=env,
                                cwd=tmp_path, capture_output=True, text=True, timeout=300)
    else:
        result = subprocess.run(_command(driver, BROKEN_INPUT[driver](tmp_path), out), env=env, cwd=tmp_path,
                                capture_output=True, text=True, timeout=300)
    status, code, words = EXPECTED[failure]
    assert result.returncode == code, result.stderr[-3000:]
    if status is None:
        assert not (out / "run_record.json").exists()
        assert f"{driver}: error: {words}. Fix: " in result.stderr
        return
    record = read_record(out)
    assert record["status"] == status and words in record["status_reason"], record["status_reason"]
    assert record["schema_version"] == SCHEMA_VERSION
    assert summaries(result.stdout)[-1]["status"] == status  # the summary line is the last line, as always


# What only joulebench.lifecycle may call: the run's life, once, for every driver.
LIFECYCLE_ONLY = {
    "signal.signal": "signal handlers", "WindowMeter.open": "the meter", "take_idle_baseline": "the idle baseline",
    "measure_idle": "the idle baseline", "write_run_record": "the run record", "summary_line": "the summary line",
    "traceback.print_exc": "exception → status",
}


def _calls(path: Path) -> list[tuple[int, str]]:
    """(line, dotted name) of every call and every `<x>.status = ...` assignment in a Python file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call):
            found.append((node.lineno, ast.unparse(node.func)))
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for element in target.elts if isinstance(target, ast.Tuple) else [target]:
                    if isinstance(element, ast.Attribute) and element.attr == "status":
                        found.append((node.lineno, "status ="))
    return found


def _violations(root: Path) -> list[str]:
    bad = []
    for driver in DRIVERS:
        for path in sorted((root / driver).rglob("*.py")):
            for line, name in sorted(_calls(path)):
                if name == "status =" or any(name == f or name.endswith(f".{f}") for f in LIFECYCLE_ONLY):
                    bad.append(f"{path.relative_to(root)}:{line}: {name}")
    return bad


def test_drivers_leave_the_run_life_to_the_lifecycle_module():
    assert _violations(REPO) == []


def test_the_lifecycle_check_finds_a_planted_direct_call(tmp_path):
    for driver in DRIVERS:
        (tmp_path / driver).mkdir()
    (tmp_path / "resnet50" / "driver.py").write_text(
        "import signal\nfrom joulebench.record import write_run_record\n"
        "def run(record, stop):\n    signal.signal(signal.SIGTERM, stop)\n    record.status = 'FAILED'\n"
        "    write_run_record('x', record)\n")
    assert _violations(tmp_path) == ["resnet50/driver.py:4: signal.signal", "resnet50/driver.py:5: status =",
                                     "resnet50/driver.py:6: write_run_record"]


def test_a_figure_set_by_both_the_body_and_the_metrics_callback_is_refused_by_name():
    from joulebench.lifecycle import merged_metrics

    assert merged_metrics("llm_training", {"iterations": 1}, {"loss_curve": []}) == {"iterations": 1, "loss_curve": []}
    with pytest.raises(ValueError, match=r"metric\(s\) iterations, mfu set both"):
        merged_metrics("llm_training", {"iterations": 1, "mfu": 0.5}, {"mfu": 0.1, "iterations": 0})


def test_a_record_whose_body_and_callback_set_one_figure_says_so(tmp_path):
    from joulebench.launch import LaunchEnv
    from joulebench.lifecycle import Lifecycle

    life = Lifecycle("llm_inference", LaunchEnv.from_env({}))
    with life.run("r", tmp_path, {}, metrics=lambda record: {"work_unit": "tokens", "rate": 2}) as run:
        run.record.metrics["rate"] = 1
    record = read_record(tmp_path)
    assert record["metrics"].get("rate") == 1  # the body's figure is kept, the callback's is not merged over it
    assert any("metric(s) rate set both" in warning for warning in record["warnings"]), record["warnings"]


def test_one_sweep_loop_hands_the_idle_baseline_on_and_ends_at_a_stop(tmp_path):
    from joulebench.launch import LaunchEnv
    from joulebench.lifecycle import Lifecycle, StopRequested, sweep

    life = Lifecycle("llm_inference", LaunchEnv.from_env({}))
    seen: list[tuple[int, object]] = []
    lines: list[str] = []

    def point(n, idle, say):
        seen.append((n, idle))
        say(f"point {n} running")
        with life.run(f"p{n}", tmp_path / str(n), {}, metrics=lambda record: {"work_unit": "tokens"}) as run:
            if n == 2:
                raise StopRequested("SIGTERM received")
        return run.record, f"baseline of point {n}"

    code = sweep(life, [1, 2, 3], lambda n: f"n={n}", point, lambda record: f"done: {record.status}", lines.append)
    assert seen == [(1, None), (2, "baseline of point 1")]  # point 3 never ran: the job is being stopped
    assert code == EXIT_CODES["TIMEOUT"] and "done: TIMEOUT" in lines and "point 2 running" in lines
    ended: list[int] = []
    fresh = Lifecycle("llm_inference", LaunchEnv.from_env({}))

    def failing(n, idle, say):
        ended.append(n)
        with fresh.run(f"f{n}", tmp_path / f"f{n}", {}, metrics=lambda record: {}) as run:
            raise RuntimeError("the model could not be built")
        return run.record, None

    assert sweep(fresh, [1, 2], str, failing, str, lines.append, ends_sweep=lambda record: True) == EXIT_CODES["FAILED"]
    assert ended == [1]


def test_out_of_gpu_memory_is_recorded_as_such_with_the_device_s_figures_and_the_fix(tmp_path):
    """torch's own OutOfMemoryError (what a co-tenant holding most of the GPU causes, issue 56) in one line: the figures
    of the device up to its allocator statistics, and what to do; any other exception keeps its type and text."""
    import torch

    from joulebench.launch import LaunchEnv
    from joulebench.lifecycle import Lifecycle

    message = ("CUDA out of memory. Tried to allocate 1.50 GiB. GPU 0 has a total capacity of 79.19 GiB of which "
               "1.21 GiB is free. Process 4242 has 70.00 GiB memory in use. Including non-PyTorch memory, this process "
               "has 7.90 GiB memory in use. Of the allocated memory 7.10 GiB is allocated by PyTorch.")
    for name, error in (("oom", torch.OutOfMemoryError(message)), ("other", RuntimeError("a\n  broken   model"))):
        life = Lifecycle("llm_training", LaunchEnv.from_env({}))
        with life.run(name, tmp_path / name, {}, metrics=lambda record: {}):
            raise error
        record = read_record(tmp_path / name)
        assert record["status"] == "FAILED"
        if name == "other":
            assert record["status_reason"] == "RuntimeError: a broken model"
            continue
        assert record["status_reason"].startswith("out of GPU memory (OutOfMemoryError: CUDA out of memory. Tried to")
        assert "Process 4242 has 70.00 GiB memory in use." in record["status_reason"]
        assert "Including non-PyTorch" not in record["status_reason"]
        assert "Fix: free the device" in record["status_reason"] and "smaller micro-batch" in record["status_reason"]
