"""The workflows' `recommend` step (issue 46): over a finished sweep, the cheapest setting that meets a target, and that
setting and the default re-measured as jobs of the same workflow on the node where the sweep's default point ran.

Called through jbprofile.py (`recommend`) once every point has its row. JOULEBENCH_RECOMMEND holds `joulebench
recommend`'s target options (e.g. `--max-p90-tpot-ms 50`, `--max-slowdown 5% --default batch_size=1`); empty: the
step says so and does nothing. Then:
  1. `joulebench recommend` over the points' run records (the job's Python): PREDICTED, into recommend/predicted.json;
  2. where it recommends another setting than the default, the default point and the recommended point run again,
     alternating (default, recommended, default, ...; JOULEBENCH_RECOMMEND_REPEATS each, default 2), each a copy of
     that point's job.env submitted as the point was (`jbprofile submit --wait`: locally, or sbatch with
     `--nodelist=` the node the default point's record names, so both settings are re-measured on one node);
  3. `joulebench recommend --remeasured` over the re-runs: predicted against measured saving, and the target held by
     the re-runs; recommend/recommend.txt keeps all of it, and the step prints it.
Never fails the workflow: a refusal (too few trustworthy runs, no default) is printed with its reason.
Standard library only, as jbsubmit.py.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from jbsettings import SETTINGS_FILE, bound_env, job_python, read_settings, write_settings

JUBE_DIR = Path(__file__).resolve().parent
REPO = JUBE_DIR.parent
OUTPUT_DIR = "recommend"  # in the JUBE run directory


@dataclass(frozen=True)
class Point:
    """A sweep point that ran and left a run record."""

    settings: dict[str, str]
    record: Path
    run_id: str
    node: str | None  # the node the record names (launch.node_name)


def finished_points(rundir: Path) -> list[Point]:
    found = []
    for env_path in sorted(rundir.glob("*_submit/work/job.env")):
        settings = read_settings(env_path)
        record = Path(settings.get("JB_OUT_DIR", "")) / "run_record.json"
        if settings.get("JB_STATUS") != "INVALID" and record.is_file():
            data = json.loads(record.read_text())
            found.append(Point(settings, record, data.get("run_id", ""), data.get("launch", {}).get("node_name")))
    return found


def run_joulebench(settings: dict[str, str], args: list[str], rundir: Path, transcript: Path) -> int:
    """`joulebench recommend ...` with the job's Python (as the compare step runs jbrecord.py); its output printed
    and appended to the transcript."""
    done = subprocess.run(job_python(settings, ["-m", "joulebench", "recommend", *args]), cwd=REPO,
                          env=bound_env(settings, rundir, REPO),  # the image reads the records, writes recommend/
                          capture_output=True, text=True, check=False)
    text = done.stdout + done.stderr
    print(text, end="", flush=True)
    with open(transcript, "a") as sink:
        sink.write(f"$ joulebench recommend {shlex.join(args)}\n{text}\n")
    return done.returncode


def rerun_settings(settings: dict[str, str], run_id: str, node: str | None) -> dict[str, str]:
    """A copy of a point's job settings for a re-run: its own run id (the job's and the driver's); on Slurm pinned to
    `node`."""
    words = shlex.split(settings.get("JB_TRAIN_ARGS", ""))
    if "--run-id" in words:
        words[words.index("--run-id") + 1] = run_id
    again = {**settings, "JB_RUN_ID": run_id, "JB_TRAIN_ARGS": shlex.join(words)}
    if settings.get("JB_LAUNCHER") == "slurm" and node:
        again["JB_SBATCH_ARGS"] = f"{settings.get('JB_SBATCH_ARGS', '')} --nodelist={node}".strip()
    return again


def rerun(settings: dict[str, str], workdir: Path) -> Path:
    """Submit one re-run as the sweep's points are submitted (jbprofile submit --wait); its run record's path."""
    workdir.mkdir(parents=True, exist_ok=True)
    write_settings(workdir / SETTINGS_FILE, settings)
    subprocess.call([sys.executable, str(JUBE_DIR / "jbprofile.py"), "submit", "--settings", SETTINGS_FILE, "--wait"],
                    cwd=workdir)
    return workdir / "run" / "run_record.json"


def cmd_recommend(args: argparse.Namespace) -> int:
    target = shlex.split(args.target)
    if not target:
        print("jbprofile: recommend: no target (JOULEBENCH_RECOMMEND is empty): nothing to recommend")
        return 0
    rundir = Path(args.rundir).resolve()
    points = finished_points(rundir)
    if not points:
        print("jbprofile: recommend: no point left a run record")
        return 0
    out = rundir / OUTPUT_DIR
    out.mkdir(exist_ok=True)
    transcript = out / "recommend.txt"
    transcript.write_text("")
    settings = points[0].settings
    records = [str(point.record) for point in points]
    predicted_json = out / "predicted.json"
    run_joulebench(settings, [*records, *target, "--json", str(predicted_json)], rundir, transcript)
    if not predicted_json.is_file():
        return 0  # refused: its reason is printed above
    predicted = json.loads(predicted_json.read_text())
    if predicted.get("recommended") is None or predicted.get("is_default"):
        return 0  # the default, or nothing meets the target: nothing to re-measure
    by_run_id = {point.run_id: point for point in points}
    default, chosen = (by_run_id.get(next(iter(predicted[side]["runs"]), ""))  # a setting's first run
                       for side in ("default", "recommended"))
    if default is None or chosen is None:
        print("jbprofile: recommend: no point of this run directory holds the runs recommend named; nothing re-run")
        return 0
    node = default.node
    reruns = []
    for repeat in range(1, args.repeats + 1):
        for side, point in (("default", default), ("recommended", chosen)):
            run_id = f"{point.settings['JB_RUN_ID']}-{side}-{repeat}"
            print(f"jbprofile: recommend: re-run {repeat} of the {side} setting ({run_id}"
                  f"{', node ' + node if node else ''})", flush=True)
            reruns.append(rerun(rerun_settings(point.settings, run_id, node), out / f"{side}-{repeat}"))
    missing = [r for r in reruns if not r.is_file()]
    for record in missing:
        say(f"re-run {record.parent.parent.name} left no run record: see {record.parent.parent / 'job.err'}",
            transcript)
    left = [str(r) for r in reruns if r.is_file()]
    if not left:
        say("no re-run left a run record: the recommendation stays PREDICTED", transcript)
        return 0
    run_joulebench(settings, [*records, *target, "--remeasured", *left, "--json", str(out / "remeasured.json")],
                   rundir, transcript)
    return 0


def say(line: str, transcript: Path) -> None:
    """A line of the step's own, on its output and in the transcript."""
    print(f"jbprofile: recommend: {line}", flush=True)
    with open(transcript, "a") as sink:
        sink.write(line + "\n")
