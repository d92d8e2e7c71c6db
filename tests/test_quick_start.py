"""The README's quick start runs as written on a CPU, each command finding what the previous one wrote.

The sequence is the one code block of README.md's "Quick start" section. Its line commented `# GPU only` is the GPU
alternative to the line before it and must differ from it only in the model; every other line runs, in order, in a
fresh directory. Nothing is substituted but the interpreter: `python` is this test's, `jpwr` and `joulebench` are
`python -m jpwr` / `python -m joulebench` (the console scripts exist only after `pip install`; as_run). The
sensor is the fake pynvml replaying the trace recorded on an H100 (tests/fakes on PYTHONPATH, as on a GPU machine).
Last, the repository's .gitignore covers everything the sequence created.
"""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path

from benchmarks.doc_lines import code_lines
from tests.driver_helpers import read_record, run_cmd
from tests.test_documented_commands import REPO, as_run

SECTION = "## Quick start"


def quick_start_lines() -> list[tuple[str, str]]:
    """(command, comment) of each line of the README's quick-start block, in order."""
    text = (REPO / "README.md").read_text()
    section = text[text.index(SECTION) + len(SECTION):]
    section = section[:section.index("\n## ")]
    lines = []
    for _, line in code_lines(section):
        command, _, comment = line.partition(" # ")
        lines.append((command.strip(), comment.strip()))
    return lines


def _option(words: list[str], name: str) -> str:
    return words[words.index(name) + 1]


def test_the_gpu_line_differs_from_the_cpu_line_only_in_the_model() -> None:
    lines = quick_start_lines()
    gpu = [i for i, (_, comment) in enumerate(lines) if comment.startswith("GPU")]
    assert len(gpu) == 1 and gpu[0] > 0, lines
    cpu_line, gpu_line = lines[gpu[0] - 1][0], lines[gpu[0]][0]
    assert "--model tiny" in cpu_line and cpu_line.replace("--model tiny", "--model 800M") == gpu_line


def test_the_cpu_quick_start_runs_as_written(fake_env, h100_trace_dir, tmp_path: Path) -> None:
    env = fake_env(JPWR_FAKE_NVML_TRACE=str(h100_trace_dir), OMP_NUM_THREADS="1")
    commands = [shlex.split(command) for command, comment in quick_start_lines() if not comment.startswith("GPU")]
    assert [words[0] for words in commands] == ["jpwr", "joulebench", "joulebench", "joulebench"]
    trace_dir = record_dir = None
    for words in commands:
        result = run_cmd(as_run(words, tmp_path), env, tmp_path, timeout=300)
        assert result.returncode == 0, f"{shlex.join(words)}:\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}"
        if words[0] == "jpwr":  # the training under the meter: record and trace where the next commands look
            trace_dir, record_dir = tmp_path / _option(words, "--out"), tmp_path / _option(words, "--out-dir")
            out = _option(words, "--out-dir")
            # a line before the imports (5 s idle, more on a busy machine), one per replayed phase (3 s each), and
            # last the command to run next (the README's, on the driver's own directory)
            said = [line for line in result.stdout.splitlines() if line.startswith("[llm_training] ")]
            assert said[0] == "[llm_training] loading torch and Megatron-Core", said
            assert [line for line in said if " alone for >= " in line] == [
                f"[llm_training] replay {n}/4: {phase} alone for >= 3 s"
                for n, phase in enumerate(("forward", "forward+backward", "optimizer", "step"), start=1)]
            assert result.stdout.splitlines()[-2] == (
                f"next: joulebench plot {out} -o {out}/trace.png, then joulebench report runs -o report/ and "
                f"joulebench attribute {out}")
            assert list(trace_dir.glob("*/trace.h5")), f"no trace under {trace_dir}"
            steady = {w["name"]: w for w in read_record(record_dir)["windows"]}["steady"]
            assert steady["energy"]["energy_j"] > 0
            assert not (tmp_path / "jpwr_out").exists()
        elif words[1] == "plot":
            assert tmp_path / words[2] == trace_dir
            assert (tmp_path / _option(words, "-o")).stat().st_size > 0
        elif words[1] == "report":
            assert record_dir.is_relative_to(tmp_path / words[2])
            assert result.stdout.splitlines()[-1] == f"next: joulebench attribute {record_dir.relative_to(tmp_path)} " \
                                                      "(its energy per phase)"
            page = (tmp_path / _option(words, "-o") / "index.html").read_text()
            assert read_record(record_dir)["run_id"] in page
        elif words[1] == "attribute":
            assert tmp_path / words[2] == record_dir
            block = read_record(record_dir)["attribution"]
            assert block["window"] == "steady"
            assert {row["status"] for row in block["estimators"]["replay"]["rows"]} <= {"measured", "derived"}
            fit = block["estimators"]["fit"]  # the README: n/a where the window is shorter than 20 counter periods
            assert "rows" in fit or "the fit needs 20" in fit["unavailable_reason"]
    created = [f"{entry.name}/" if entry.is_dir() else entry.name for entry in tmp_path.iterdir()]
    ignored = subprocess.run(["git", "check-ignore", "--no-index", "--stdin"], cwd=REPO, text=True,
                             input="\n".join(created), capture_output=True).stdout.split()
    assert sorted(ignored) == sorted(created), f"not in .gitignore: {json.dumps(sorted(set(created) - set(ignored)))}"
