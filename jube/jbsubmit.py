"""Submission side of the JUBE workflows: run or sbatch the job, make sure every sweep point ends as a row.

Called through jbprofile.py (`submit`, `verdict`, `summary`). Why: JUBE's `continue` only looks for each
job's done file, so every path here ends with one: a point validate refused (INVALID), a job sbatch refuses
(FAILED), a job whose finalizer cannot be queued (cancelled before it starts, FAILED), a job Slurm would never
start (cancelled, CANCELLED), and a job that ends without recording itself (its finalizer job records what Slurm
says). Standard library only, plus jpwr's stdlib-only atomic writer (as jbsettings.py).
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import jbslurm
from jbsettings import (
    JOB_ID_FILE,
    RESULT_FILE,
    SETTINGS_FILE,
    SETUP_FAILED,
    failed_result,
    job_python,
    provisional_result,
    read_settings,
    write_atomic,
    write_settings,
)

JUBE_DIR = Path(__file__).resolve().parent
JOB_SCRIPT = JUBE_DIR / "job.sh"
RECORD_TOOL = JUBE_DIR / "jbrecord.py"
EX_USAGE = 64
PENDING_CHECK_S = 3.0  # after sbatch: how long to look for a pending reason that will never clear


def _finalize_here(settings_path: Path, *record_args: str) -> None:
    """Record an outcome on this (login) node with the job's Python: a job that never ran or never reported.
    Where the recorder cannot run (its setup lines fail, a broken interpreter), a FAILED result.txt says so.

    `record_args`: jbrecord.py's command and options, e.g. ("finalize", "--status", "INVALID", "--reason", why)."""
    settings = read_settings(settings_path)
    command, *options = record_args
    try:
        code: int | str = subprocess.call(job_python(settings, [str(RECORD_TOOL), command, "--settings",
                                                                 str(settings_path), *options]))
    except OSError as exc:
        code = str(exc)
    done = Path(settings["JB_DONE_FILE"])
    if not done.exists():
        given = options[options.index("--reason") + 1] if "--reason" in options else ""
        why = f"jbrecord.py {command} could not record this point on the login node ({_exit_said(code)})"
        write_atomic(Path(settings["JB_WORKDIR"]) / RESULT_FILE, failed_result(why + (f"; {given}" if given else "")))
        done.touch()


def _exit_said(code: int | str) -> str:
    return "profile key setup failed there" if code == SETUP_FAILED else f"exit {code}"


def sbatch_command(settings: dict[str, str], settings_path: Path) -> list[str]:
    workdir = Path(settings["JB_WORKDIR"])
    argv = ["sbatch", "--parsable", f"--job-name=jb-{settings['JB_MODEL']}", f"--nodes={settings['JB_NODES']}",
            f"--ntasks-per-node={settings['JB_TASKS_PER_NODE']}", f"--time={settings['JB_TIME_LIMIT']}",
            f"--output={workdir / 'job.out'}", f"--error={workdir / 'job.err'}", f"--chdir={workdir}",
            f"--signal=B:USR1@{settings['JB_STOP_MARGIN_S']}",  # a fallback: the job's own timer stops it first
            "--hold"]  # released once its finalizer is queued (submit_with_finalizer)
    if settings["JB_GRES"].lower() in ("yes", "true", "1"):
        argv.append(f"--gpus-per-node={settings['JB_TASKS_PER_NODE']}")
    if settings["JB_CPUS_PER_TASK"]:
        argv.append(f"--cpus-per-task={settings['JB_CPUS_PER_TASK']}")
    return [*argv, *_site_args(settings), *shlex.split(settings["JB_SBATCH_ARGS"]), str(JOB_SCRIPT),
            str(settings_path)]


def _site_args(settings: dict[str, str]) -> list[str]:
    site = [f"--partition={settings['JB_PARTITION']}"] if settings["JB_PARTITION"] else []
    return site + ([f"--account={settings['JB_ACCOUNT']}"] if settings["JB_ACCOUNT"] else [])


# sbatch_args options the finalizer needs as much as its job: without the job's reservation or QOS it pends until the
# reservation ends (under a partition QOS, for ever), and a point cancelled meanwhile stays PENDING
FINALIZER_NEEDS = ("--reservation", "--qos", "-q", "--account", "-A")


def finalizer_site_options(sbatch_args: str) -> list[str]:
    """The options of the profile's sbatch_args (words as prepare split them) that the finalizer job takes too: its
    reservation, QOS and account (FINALIZER_NEEDS), as `--opt=value` or `--opt value`; finalizer_sbatch_args,
    placed after them, overrides any (sbatch takes an option's last value)."""
    words, taken = shlex.split(sbatch_args), []
    for n, word in enumerate(words):
        name = word.split("=", 1)[0]
        if name in FINALIZER_NEEDS:
            taken += [word] if "=" in word or n + 1 == len(words) else [word, words[n + 1]]
        elif word[:2] in ("-q", "-A") and len(word) > 2 and not word.startswith("--"):
            taken.append(word)  # -qnormal, -Aproject
    return taken


def finalizer_command(settings: dict[str, str], settings_path: Path, job_id: str) -> list[str]:
    """A one-core job that runs once the benchmark job ended, however it ended, and records it if it could not.
    Where its recorder cannot run (setup lines that fail on that partition, a broken interpreter), a plain-sh line
    writes a FAILED result.txt and the done file, so that JUBE never waits for a row that no one writes."""
    workdir = Path(settings["JB_WORKDIR"])
    record = job_python(settings, [str(RECORD_TOOL), "finalize-job", "--settings", str(settings_path),
                                   "--job-id", job_id])
    text = failed_result(f"the finalizer job could not record job {job_id}: its recorder exited with code @RC@ "
                         f"({SETUP_FAILED}: profile key setup failed there); see finalize.out")
    done, result = shlex.quote(settings["JB_DONE_FILE"]), shlex.quote(str(workdir / RESULT_FILE))
    lines = '"$rc"'.join(shlex.quote(part) for part in text.split("@RC@"))
    fallback = f"[ -e {done} ] || {{ printf %s {lines} > {result}; touch {done}; }}"
    limit = jbslurm.hms(min(300, int(settings["JB_TIME_LIMIT_S"])))
    return ["sbatch", "--parsable", "--job-name=jb-finalize", f"--dependency=afterany:{job_id}",
            "--kill-on-invalid-dep=yes", "--nodes=1", "--ntasks=1", f"--time={limit}",
            f"--output={workdir / 'finalize.out'}", f"--chdir={workdir}", *_site_args(settings),
            *finalizer_site_options(settings["JB_SBATCH_ARGS"]), *shlex.split(settings["JB_FINALIZER_SBATCH_ARGS"]),
            "--wrap", f"{shlex.join(record)}; rc=$?; {fallback}; exit $rc"]


class SubmitFailed(Exception):
    """A submission step failed: nothing of this point runs (what was queued is cancelled); the message says why."""


def _sbatch(argv: list[str], what: str, env: dict[str, str]) -> str:
    """`sbatch --parsable`: the new job's id (its answer's last line, `ID` or `ID;CLUSTER`; site plugins may print
    lines before it), or SubmitFailed with sbatch's own words."""
    print("submit:", shlex.join(argv), flush=True)
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, env=env)
    except OSError as exc:
        raise SubmitFailed(f"sbatch could not run for {what}: {exc}") from None
    if proc.returncode != 0:
        raise SubmitFailed(f"sbatch refused {what}: {proc.stderr.strip() or proc.stdout.strip()}")
    lines = proc.stdout.strip().splitlines()
    match = re.fullmatch(r"(\d+)(;.*)?", lines[-1].strip()) if lines else None
    if match is None:
        raise SubmitFailed(f"sbatch's answer for {what} does not end in a job id: {proc.stdout.strip()!r}")
    return match.group(1)


def _cancelled(job_id: str, finalizer_id: str) -> str:
    """Cancel a held job and its finalizer; what became of them, for the row's reason."""
    return _not_cancelled(jbslurm.cancel(finalizer_id, job_id)) or (
        f"job {job_id} was cancelled before it started (a job without its finalizer could end without a row)")


def _not_cancelled(job_ids: list[str]) -> str:
    return "; ".join(f"could not cancel job {j}: run `scancel {j}`" for j in job_ids)


def submit_with_finalizer(settings: dict[str, str], settings_path: Path, env: dict[str, str]) -> tuple[str, str]:
    """(job id, finalizer id). The job is queued held (its id into job.id at once), its finalizer after it, then the
    job is released: it never runs without the finalizer that records it if it cannot. A failing step cancels both
    and raises SubmitFailed; an interruption (Ctrl-C, SystemExit) cancels both and is raised again."""
    try:
        job_argv = sbatch_command(settings, settings_path)
    except ValueError as exc:  # a word list that prepare did not check: a job.env written by other means
        raise SubmitFailed(f"the job's sbatch options cannot be split into words ({exc})") from None
    job_id = _sbatch(job_argv, "the job", env)
    finalizer_id = ""
    try:
        write_atomic(Path(settings["JB_WORKDIR"]) / JOB_ID_FILE, job_id + "\n")
        # while held: the job cannot have recorded itself yet, so this never replaces its own result
        write_atomic(Path(settings["JB_WORKDIR"]) / RESULT_FILE, provisional_result(
            "PENDING", f"queued as Slurm job {job_id}; jube continue once it ended",
            "queued: jube continue once it ended", job_id))
        try:
            finalizer_argv = finalizer_command(settings, settings_path, job_id)
        except ValueError as exc:
            raise SubmitFailed(f"its finalizer's sbatch options cannot be split into words ({exc})") from None
        finalizer_id = _sbatch(finalizer_argv, "its finalizer job", env)
        refused = jbslurm.release(job_id)
        if refused:
            raise SubmitFailed(f"{refused} after its finalizer job {finalizer_id} was queued")
    except SubmitFailed as exc:
        raise SubmitFailed(f"{exc}; {_cancelled(job_id, finalizer_id)}") from None
    except BaseException:
        said = _cancelled(job_id, finalizer_id)
        print(said, file=sys.stderr)  # the provisional PENDING row must not outlive the job it names
        write_atomic(Path(settings["JB_WORKDIR"]) / RESULT_FILE, failed_result(f"submission interrupted; {said}"))
        raise
    return job_id, finalizer_id


def wait_for_done(settings_path: Path, settings: dict[str, str], job_ids: list[str]) -> None:
    """Block until the done file appears (the `wait` tag); once Slurm forgot the job and its finalizer
    without one, record the job from here."""
    done = Path(settings["JB_DONE_FILE"])
    gone_since = None
    while not done.exists():
        time.sleep(1.0)
        if any(jbslurm.job_state(j) for j in job_ids):
            gone_since = None
        elif gone_since is None:
            gone_since = time.monotonic()
        elif time.monotonic() - gone_since > 30 and not done.exists():
            print(f"jbprofile: job {job_ids[0]} left the queue without touching {done}; recording it", file=sys.stderr)
            _finalize_here(settings_path, "finalize-job", "--job-id", job_ids[0])
            return


def cmd_submit(args: argparse.Namespace) -> int:
    """Never fails the JUBE step: every point ends as a row (INVALID, a refused submission, a job's outcome)."""
    workdir = Path.cwd().resolve()
    settings = read_settings(Path(args.settings))
    settings.update(JB_WORKDIR=str(workdir), JB_OUT_DIR=str(workdir / "run"), JB_DONE_FILE=str(workdir / "job.done"))
    settings_path = workdir / SETTINGS_FILE
    write_settings(settings_path, settings)
    print(f"job log: {workdir / 'job.out'} and {workdir / 'job.err'}", flush=True)
    if settings["JB_STATUS"] == "INVALID":
        print(f"not submitted (INVALID): {settings['JB_REASON']}", flush=True)
        _finalize_here(settings_path, "finalize", "--status", "INVALID", "--reason", settings["JB_REASON"])
        return 0
    env = {k: v for k, v in os.environ.items() if k not in settings["JB_SWEEP"].split(",")}  # JUBE's exports
    if settings["JB_LAUNCHER"] == "local":
        print(f"running locally: bash {JOB_SCRIPT} {settings_path}", flush=True)
        with open(workdir / "job.out", "ab") as out, open(workdir / "job.err", "ab") as err:
            rc = subprocess.call(["bash", str(JOB_SCRIPT), str(settings_path)], stdout=out, stderr=err, env=env)
        print(f"local job finished with exit code {rc}")
        if not Path(settings["JB_DONE_FILE"]).exists():  # killed before its traps could run
            _finalize_here(settings_path, "finalize", "--status", "FAILED", "--reason",
                           f"the job script was killed (exit code {rc}) before it finished", "--finished-by",
                           "the submit step, after the job script was killed")
        return 0
    try:
        job_id, finalizer_id = submit_with_finalizer(settings, settings_path, env)
    except SubmitFailed as exc:
        print(exc, file=sys.stderr)
        _finalize_here(settings_path, "finalize", "--status", "FAILED", "--reason", str(exc))
        return 0
    print(f"Submitted batch job {job_id}; finalizer job {finalizer_id} records it if it ends without recording "
          "itself", flush=True)
    blocker = jbslurm.pending_blocker(job_id, PENDING_CHECK_S, jbslurm.job_fit(settings)[0])
    if blocker:
        left = _not_cancelled(jbslurm.cancel(finalizer_id, job_id))
        reason = f"Slurm would never start job {job_id} ({blocker}); {left or 'cancelled by joulebench'}"
        print(reason, file=sys.stderr)
        _finalize_here(settings_path, "finalize", "--status", "CANCELLED", "--reason", reason)
        return 0
    if args.wait:
        wait_for_done(settings_path, settings, [job_id, finalizer_id])
    return 0


def cmd_verdict(args: argparse.Namespace) -> int:
    """Runs after every point was submitted (JUBE's barrier): fails for a refused point, so that `jube run -e`
    exits non-zero and `jube status` says ERROR, without keeping the other points from running."""
    settings = read_settings(Path(args.settings))
    if settings["JB_STATUS"] == "INVALID":
        point = ", ".join(f"{k}={settings.get('JB_COORD_' + k.upper()) or 'default'}"
                          for k in settings["JB_SWEEP"].split(","))
        print(f"jbprofile: sweep point refused ({point}): {settings['JB_REASON']}", file=sys.stderr)
        return EX_USAGE
    return 0


def cmd_summary(args: argparse.Namespace) -> int:
    points = sorted(Path(args.rundir).glob("*_validate/work/job.env"))
    refused = [p for p in points if read_settings(p).get("JB_STATUS") == "INVALID"]
    print(f"{len(refused)} of {len(points)} sweep point(s) refused by validate" +
          "".join(f"\n  {p.parent}: {read_settings(p)['JB_REASON']}" for p in refused))
    return 0
