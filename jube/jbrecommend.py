"""The workflows' `recommend` step (issue 46): over a finished sweep, the cheapest setting that meets a target, and that
setting and the default re-measured as jobs of the same workflow on the node where the sweep's default point ran.

Called through jbprofile.py (`recommend`) once every point has its row. JOULEBENCH_RECOMMEND holds `joulebench
recommend`'s target options (e.g. `--max-p90-tpot-ms 50`, `--max-slowdown 5% --default batch_size=1`); empty: the
step says so and does nothing. Both it and JOULEBENCH_RECOMMEND_REPEATS are checked and recorded at `jube run` (each
point's job.env, as the sweep values are): on Slurm the step runs at `jube continue`, where they may be unset. Then:
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
from typing import Any

from jbsettings import SETTINGS_FILE, SettingsError, bound_env, job_python, read_settings, write_settings
from jbsystems import ConfigError

REPEATS = range(2, 101)  # re-runs per setting: a spread needs two
DEFAULT_REPEATS = 2

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


class Unreadable(ValueError):
    """An input of the step (a point's job.env or run record, recommend's JSON) that cannot be read as it must be:
    the step leaves it out and says why (it never fails the workflow)."""


def json_object(path: Path) -> dict[str, Any]:
    """A JSON file that must hold an object (a run record, recommend's --json output); Unreadable naming the file."""
    try:
        data = json.loads(path.read_bytes())
    except OSError as exc:
        raise Unreadable(f"{path} cannot be read ({exc.strerror or exc})") from None
    except ValueError as exc:  # not UTF-8, not JSON (truncated)
        raise Unreadable(f"{path} is not readable JSON ({exc})") from None
    if not isinstance(data, dict):
        raise Unreadable(f"{path} holds a JSON {type(data).__name__}, not an object")
    return data


def text_at(data: dict[str, Any], path: Path, *keys: str, optional: bool = False) -> str | None:
    """The text at data[keys[0]][keys[1]]...; None where `optional` and missing; else Unreadable naming the field."""
    value: Any = data
    for key in keys:
        value = value.get(key) if isinstance(value, dict) else None
    if isinstance(value, str) and value:
        return value
    if value is None and optional:
        return None
    raise Unreadable(f"{path}: {'.'.join(keys)} is {value!r}, not a text")


def finished_points(rundir: Path) -> list[Point]:
    """The points that ran and left a readable run record; a point whose job.env or record cannot be read is left
    out with a line saying why."""
    found = []
    for env_path in sorted(rundir.glob("*_submit/work/job.env")):
        try:
            settings = read_settings(env_path)
            record = Path(settings.get("JB_OUT_DIR", "")) / "run_record.json"
            if settings.get("JB_STATUS") == "INVALID" or not record.is_file():
                continue
            data = json_object(record)
            found.append(Point(settings, record, str(text_at(data, record, "run_id")),
                               text_at(data, record, "launch", "node_name", optional=True)))
        except (SettingsError, Unreadable) as exc:
            print(f"jbprofile: recommend: left out {env_path.parent}: {exc}", flush=True)
    return found


def target_options(target: str) -> list[str]:
    """JOULEBENCH_RECOMMEND's words as the shell splits them; ConfigError for an unclosed quote."""
    try:
        return shlex.split(target)
    except ValueError as exc:
        raise ConfigError(f"the target {target!r} (JOULEBENCH_RECOMMEND) cannot be split into options ({exc})",
                          "close its quotes, e.g. JOULEBENCH_RECOMMEND=\"--max-slowdown 5%\"") from None


def repeats_count(text: str) -> int:
    """JOULEBENCH_RECOMMEND_REPEATS as re-runs per setting (empty: the default); ConfigError where it is not one."""
    text = text.strip()
    if not text:
        return DEFAULT_REPEATS
    if not (text.isdigit() and int(text) in REPEATS):
        raise ConfigError(f"JOULEBENCH_RECOMMEND_REPEATS={text!r} is not a whole number from {REPEATS[0]} to "
                          f"{REPEATS[-1]}", f"set the re-runs of each setting, e.g. {DEFAULT_REPEATS} (the default), "
                          "or unset it")
    return int(text)


def run_settings(env: dict[str, str]) -> dict[str, str]:
    """The step's target and re-runs as `jube run` has them, for each point's job.env; ConfigError (the validate step
    stops, nothing is submitted) for one the step could not use."""
    target, repeats = env.get("JOULEBENCH_RECOMMEND", ""), env.get("JOULEBENCH_RECOMMEND_REPEATS", "").strip()
    target_options(target)
    repeats_count(repeats)
    return {"JB_RECOMMEND": target, "JB_RECOMMEND_REPEATS": repeats}


def chosen_runs(predicted: dict[str, Any], path: Path) -> tuple[str, str] | None:
    """From recommend's --json: None where nothing is to be re-measured (the default, or nothing meets the target),
    else (the default's first run, the recommended setting's first run); Unreadable where it has another shape."""
    if predicted.get("recommended") is None or predicted.get("is_default"):
        return None
    first = []
    for side in ("default", "recommended"):
        block = predicted.get(side)
        runs = block.get("runs") if isinstance(block, dict) else None
        if not isinstance(runs, list | dict) or not runs or not isinstance(next(iter(runs)), str):
            raise Unreadable(f"{path}: {side}.runs is {runs!r}, not a list of run ids")
        first.append(next(iter(runs)))
    return first[0], first[1]


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
    """The step; never fails the workflow: an input that cannot be read is said in one line, and nothing more done
    with it."""
    try:
        return recommend_step(args)
    except (Unreadable, ConfigError) as exc:
        print(f"jbprofile: recommend: {exc}", flush=True)
        return 0


def recorded(rundir: Path, key: str) -> str:
    """A value `jube run` recorded in the points' job.env (JB_RECOMMEND, JB_RECOMMEND_REPEATS) as the sweep values
    are; empty where no point recorded one."""
    for env_path in sorted(rundir.glob("*_submit/work/job.env")):
        try:
            return read_settings(env_path).get(key, "")
        except SettingsError:
            continue
    return ""


def step_value(given: str, rundir: Path, key: str, variable: str) -> str:
    """A setting of the step: the variable where the step runs (`jube continue` on Slurm), else the one `jube run`
    recorded under `key`; where both are set and differ, the later one, said in a line."""
    at_run = recorded(rundir, key)
    if given and at_run and given != at_run:
        print(f"jbprofile: recommend: {variable}={given!r} now, {at_run!r} at `jube run`: the one now counts",
              flush=True)
    return given or at_run


def recommend_step(args: argparse.Namespace) -> int:
    rundir = Path(args.rundir).resolve()
    target = target_options(step_value(args.target, rundir, "JB_RECOMMEND", "JOULEBENCH_RECOMMEND"))
    repeats = repeats_count(step_value(args.repeats.strip(), rundir, "JB_RECOMMEND_REPEATS",
                                       "JOULEBENCH_RECOMMEND_REPEATS"))  # stripped as run_settings recorded it
    if not target:
        print("jbprofile: recommend: no target (JOULEBENCH_RECOMMEND was empty at `jube run` and is now): nothing to "
              "recommend")
        return 0
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
    runs = chosen_runs(json_object(predicted_json), predicted_json)
    if runs is None:
        return 0  # the default, or nothing meets the target: nothing to re-measure
    by_run_id = {point.run_id: point for point in points}
    default, chosen = by_run_id.get(runs[0]), by_run_id.get(runs[1])  # each setting's first run
    if default is None or chosen is None:
        print("jbprofile: recommend: no point of this run directory holds the runs recommend named; nothing re-run")
        return 0
    node = default.node
    reruns = []
    for repeat in range(1, repeats + 1):
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
