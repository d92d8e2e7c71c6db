"""Issue 42: the shipped run records give the same output in every analysis verb before and after the wave.

Each case runs one `joulebench VERB ...` in-process over shipped data (benchmarks/results, tests/reports/data) and
compares what it prints and the text files it writes with goldens written by the tree of 26b2573, the commit before
the wave (tests/analysis/golden/README.md says how). Charts are compared by what they are drawn from (titles, labels,
each line's and scatter's points, bars, spans and texts), not by PNG bytes, which carry matplotlib's own encoding.

Normalised, because they belong to the run of the test and not to the analysis: the repository and temporary
directory paths, the wall clock (`utc_now` fixed in the verbs' modules), the PNGs embedded in the HTML page.

Not covered: `joulebench demo` (it runs a CPU driver afresh: its throughput is this machine's, never the same
twice), and tests/data/h100_trace, which is the raw NVML sample stream the fake pynvml replays, not a run record or
a jpwr trace that a verb reads (demo is its only reader).

Run as a script to write the goldens, with a baseline tree first on the path (never with this tree):
    PYTHONPATH=/tmp/base26 python tests/analysis/test_verbs_unchanged.py
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import io
import itertools
import json
import re
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).resolve().parent / "golden"
RESULTS = REPO / "benchmarks" / "results"
# The results folders 26b2573 shipped (`git ls-tree 26b2573 benchmarks/results/`); later ones are not in the goldens
BASELINE_FOLDERS = (
    "2026-11-22-h100-inference", "2026-11-22-h100-jpwr", "2026-11-22-h100-llm800M", "2026-11-22-h100-perf",
    "2026-11-22-h100-resnet50", "2026-11-22-h200-jpwr", "2026-11-22-h200x2-scaling", "2026-11-22-session2",
    "2026-11-23-inference-engine", "2026-11-23-session3", "2026-11-23-session4", "2026-11-24-inference",
    "2026-11-24-session5", "2026-11-25-session10", "2026-11-25-session7", "2026-11-25-session9",
    "2026-11-26-session11", "2026-11-26-session12", "2026-11-26-session13",
)
CPU_REPLAY = REPO / "tests" / "reports" / "data" / "resnet50_cpu_replay"
SERVING_SWEEP = RESULTS / "2026-11-25-session10" / "serving-final" / "sweep"
SESSION9 = RESULTS / "2026-11-25-session9" / "lifecycle"
FIXED_NOW = "2000-01-01T00:00:00+00:00"  # the wall clock of every verb's run
DIFF_LINES = 40  # of each differing file, in the failure message
SUMMARY_OVER = 12  # arrays longer than this are compared by count, extremes, ends and sum


@dataclasses.dataclass(frozen=True)
class Case:
    """One verb over shipped data: its argv, given a scratch directory, and what to lay out there first."""

    name: str
    argv: Callable[[Path], list[str]]
    prepare: Callable[[Path], object] | None = None


# ---- scratch layouts ------------------------------------------------------------------------------------------
def _session9_run(scratch: Path, variant: str, driver: str) -> Path:
    """A session-9 run as `joulebench attribute` expects it (record and jpwr/ in one directory; the shipped folder
    keeps the record in run/ beside jpwr/). A copy, so that attribute may write its block."""
    source, target = SESSION9 / variant / driver, scratch / variant / driver
    target.mkdir(parents=True)
    shutil.copy(source / "run" / "run_record.json", target)
    shutil.copytree(source / "jpwr", target / "jpwr")
    return target


def _attributed(scratch: Path) -> None:
    """Session 9's training runs attributed (what `joulebench plan` reads), beside its inference run, which is not."""
    from joulebench.analysis import cli

    with _captured():
        for variant in ("base", "new"):
            for driver in ("llm_training", "resnet50"):
                assert cli.main(["attribute", str(_session9_run(scratch, variant, driver))]) == 0
    _session9_run(scratch, "new", "llm_inference")


def _records(*folders: str) -> list[str]:
    return [str(RESULTS / folder / "run_record.json") for folder in folders]


def _all_records() -> list[str]:
    """Every run record shipped at 26b2573: its results folders, the session-5 record kept under its own name, the
    CPU replay."""
    session5 = RESULTS / "2026-11-24-session5" / "inference-compiled-decode" / "llama8b_bs448_run_record.json"
    return [*(str(RESULTS / folder) for folder in BASELINE_FOLDERS), str(session5), str(CPU_REPLAY)]


CASES = [
    Case("usage", lambda s: ["--help"]),
    Case("report_all", lambda s: ["report", *_all_records(), "-o", str(s / "report")]),
    Case("report_attributed", lambda s: ["report", str(s), "-o", str(s / "report")], _attributed),
    Case("report_cpu_replay_partial", lambda s: ["report", str(CPU_REPLAY), "--allow-partial", "-o", str(s / "r")]),
    Case("compare_cpu_replay_b2_b8", lambda s: ["report", "--compare", str(CPU_REPLAY / "b2" / "run_record.json"),
                                                str(CPU_REPLAY / "b8" / "run_record.json")]),
    Case("compare_llama8b_bs1_bs64", lambda s: ["report", "--compare", *_records(
        "2026-11-22-h100-inference/llama-8b/chat_bs1", "2026-11-22-h100-inference/llama-8b/chat_bs64")]),
    Case("compare_resnet_compile_cudagraphs", lambda s: ["report", "--compare", *_records(
        "2026-11-22-session2/h100-call4/rn/compile", "2026-11-22-session2/h100-call4/rn/compile-cudagraphs")]),
    Case("compare_lifecycle_base_new", lambda s: ["report", "--compare", *_records(
        "2026-11-25-session9/lifecycle/base/llm_training/run", "2026-11-25-session9/lifecycle/new/llm_training/run")]),
    Case("compare_scaling_1_2", lambda s: ["report", "--compare", *_records(
        "2026-11-22-h200x2-scaling/llm1", "2026-11-22-h200x2-scaling/llm2")]),
    Case("compare_serving_c1_max256", lambda s: ["report", "--compare", *_records(
        "2026-11-25-session10/serving-call2/c1", "2026-11-25-session10/serving-call2/max256")]),
    Case("compare_failed", lambda s: ["report", "--compare", *_records(
        "2026-11-22-h100-perf/call1/llm/bf16-mbs16", "2026-11-22-h100-perf/call1/llm/bf16-mbs8")]),
    Case("pareto_llm_variants", lambda s: ["report", "--pareto", *_records(
        *(f"2026-11-22-session2/h100-call1/llm/bf16-mbs8{v}" for v in
          ("", "-flash", "-foreach-adam", "-noce-fusion", "-nodropout", "-unfused"))), "-o", str(s / "pareto")]),
    Case("pareto_serving_rates", lambda s: ["report", "--pareto", str(SERVING_SWEEP), "--min-coverage", "0"]),
    Case("pareto_mixed_workloads", lambda s: ["report", "--pareto", str(RESULTS / "2026-11-22-h100-inference")]),
    *(Case(f"attribute_{variant}_{driver}", lambda s, v=variant, d=driver: ["attribute", str(s / v / d)],
           lambda s, v=variant, d=driver: _session9_run(s, v, d))
      for variant in ("base", "new") for driver in ("llm_training", "resnet50", "llm_inference")),
    Case("plan_fit", lambda s: ["plan", str(s), "--json", str(s / "plan.json")], _attributed),
    Case("plan_replay", lambda s: ["plan", "--method", "replay", str(s)], _attributed),
    Case("plot_lifecycle_llm", lambda s: ["plot", str(SESSION9 / "new" / "llm_training" / "jpwr"),
                                          "-o", str(s / "trace.png")]),
    Case("plot_resnet_compile", lambda s: ["plot", str(RESULTS / "2026-11-22-session2" / "h100-call4" / "rn" /
                                                       "compile" / "jpwr"), "-o", str(s / "trace.png")]),
]


# ---- running a verb -------------------------------------------------------------------------------------------
@contextlib.contextmanager
def _captured() -> Iterator[io.StringIO]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        yield out


def _numbers(values: Any) -> str:
    """Points as 6 significant digits (masked and infinite ones as NaN / null); a long array as a summary."""
    array = np.ma.filled(np.ma.masked_invalid(np.ma.asarray(values, dtype=float)), np.nan).reshape(len(values), -1)
    if len(array) <= SUMMARY_OVER:
        return json.dumps([[float(f"{x:.6g}") if np.isfinite(x) else None for x in row] for row in array])
    parts = {"n": len(array), "nan": int(np.isnan(array).sum()), "first": array[0], "last": array[-1],
             "min": np.nanmin(array, axis=0), "max": np.nanmax(array, axis=0), "sum": np.nansum(array, axis=0)}
    return ", ".join(f"{k} {v}" if isinstance(v, int) else f"{k} {[f'{x:.6g}' for x in v]}" for k, v in parts.items())


def chart_data(fig: Any) -> str:
    """What a figure is drawn from: per axes its labels, scales, lines, point sets, bars and spans, texts, legend."""
    lines = [f"figure {fig.get_suptitle()!r}"]
    for number, ax in enumerate(fig.axes):
        lines.append(f"axes {number}: title {ax.get_title()!r}; x {ax.get_xlabel()!r} ({ax.get_xscale()}); "
                     f"y {ax.get_ylabel()!r} ({ax.get_yscale()})")
        lines += [f"  line {line.get_label()!r}: {_numbers(line.get_xydata())}" for line in ax.get_lines()]
        lines += [f"  points {c.get_label()!r}: {_numbers(c.get_offsets())}" for c in ax.collections
                  if len(c.get_offsets())]
        lines += [f"  patch {p.get_label()!r}: {_numbers(p.get_patch_transform().transform(p.get_path().vertices))}"
                  for p in ax.patches]
        lines += [f"  text {t.get_text()!r} at {_numbers([t.get_position()])}" for t in ax.texts]
        legend = ax.get_legend()
        if legend is not None:
            lines.append(f"  legend {[t.get_text() for t in legend.get_texts()]}")
    return "\n".join(lines)


def _fixed_clock_and_charts(charts: list[str]) -> contextlib.ExitStack:
    """The verbs' modules with the wall clock fixed and every saved figure's data kept (the PNG is still written)."""
    import importlib

    stack = contextlib.ExitStack()
    plot = importlib.import_module("joulebench.analysis.plot")
    original = plot.save_figure

    def save_figure(fig: Any, path: Path) -> Path:
        charts.append(f"## {path.name}\n{chart_data(fig)}")
        return original(fig, path)

    for name in ("plot", "report", "attribute", "pareto", "serving"):
        module = importlib.import_module(f"joulebench.analysis.{name}")
        for attribute, value in (("utc_now", lambda: FIXED_NOW), ("save_figure", save_figure)):
            if hasattr(module, attribute):
                stack.enter_context(_patched(module, attribute, value))
    return stack


@contextlib.contextmanager
def _patched(module: Any, attribute: str, value: Any) -> Iterator[None]:
    saved = getattr(module, attribute)
    setattr(module, attribute, value)
    try:
        yield
    finally:
        setattr(module, attribute, saved)


def _normalised(text: str, scratch: Path) -> str:
    text = text.replace(str(scratch), "<TMP>").replace(str(REPO), "<REPO>")
    return re.sub(r"data:image/png;base64,[A-Za-z0-9+/=]*", "data:image/png;base64,<PNG>", text)


def _ten_digits(text: str) -> str:
    """Long decimals to 10 significant digits: a fit's least-squares arithmetic differs in its last bits between CPUs
    (OpenBLAS picks its kernels by the machine: 495.6760625997935 here, ...945 there), the analysis does not."""
    return re.sub(r"-?\d+\.\d{7,}(?:e[+-]?\d+)?", lambda m: format(float(m.group()), ".10g"), text)


def run_case(case: Case, scratch: Path) -> dict[str, str]:
    """The case's outputs by file name: exit code and printed text, the text files the verb wrote, chart data."""
    from joulebench.analysis import cli

    scratch.mkdir(parents=True, exist_ok=True)
    if case.prepare is not None:
        case.prepare(scratch)
    before = {p: p.stat().st_mtime_ns for p in scratch.rglob("*") if p.is_file()}
    charts: list[str] = []
    with _fixed_clock_and_charts(charts), _captured() as out:
        code = cli.main(case.argv(scratch))
    outputs = {"stdout.txt": f"exit {code}\n{out.getvalue()}"}
    for path in sorted(scratch.rglob("*")):
        if (path.is_file() and path.suffix != ".png" and not path.name.startswith(".")  # a writer's lock is no output
                and before.get(path) != path.stat().st_mtime_ns):
            outputs[str(path.relative_to(scratch)).replace("/", "__")] = path.read_text()
    if charts:
        outputs["charts.txt"] = "\n".join(charts) + "\n"
    return {name: _normalised(text, scratch) for name, text in outputs.items()}


# ---- the test and the golden writer ---------------------------------------------------------------------------
def _golden(case: Case) -> dict[str, str]:
    folder = GOLDEN / case.name
    return {p.name: p.read_text() for p in sorted(folder.iterdir())} if folder.is_dir() else {}


@pytest.mark.parametrize("case", [pytest.param(case, id=case.name) for case in CASES])
def test_verb_output_is_the_baselines(case: Case, tmp_path: Path) -> None:
    golden = _golden(case)
    assert golden, f"no goldens for {case.name} under {GOLDEN} (write them from the baseline tree, see the module)"
    actual = run_case(case, tmp_path / "scratch")
    assert sorted(actual) == sorted(golden), "the verb wrote other files than the baseline"
    actual, golden = ({name: _ten_digits(text) for name, text in side.items()} for side in (actual, golden))
    differing = [name for name in golden if actual[name] != golden[name]]
    assert not differing, "\n".join(line for name in differing for line in itertools.islice(difflib.unified_diff(
        golden[name].splitlines(), actual[name].splitlines(), f"baseline {name}", f"this tree {name}", lineterm=""),
        DIFF_LINES))


def write_goldens(scratch_root: Path) -> None:
    import joulebench

    if Path(joulebench.__file__).resolve().is_relative_to(REPO):
        raise SystemExit(f"joulebench comes from {joulebench.__file__}, this tree: the goldens must be the baseline's "
                         "output; put a baseline tree first, e.g. PYTHONPATH=/tmp/base26")
    for case in CASES:
        outputs = run_case(case, scratch_root / case.name)
        folder = GOLDEN / case.name
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        for name, text in outputs.items():
            (folder / name).write_text(text)
        print(f"{case.name}: {', '.join(outputs)}")


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as scratch_dir:
        write_goldens(Path(scratch_dir))
