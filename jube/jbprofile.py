#!/usr/bin/env python3
"""Login-node side of the JUBE workflows: resolve tags and the system profile, validate, submit.

    jbprofile.py prepare --benchmark llm --config RUNDIR/configuration.xml --run-id ID [--set key=value ...]
    jbprofile.py submit --settings ../validate/job.env [--wait]
    jbprofile.py show SYSTEM            # the resolved profile, after environment overrides

Why a script and not JUBE parameters: JUBE ignores unknown tags and lets the last of two system
tags win silently (and Debian's JUBE 2.5.1 has no <check_tags>), so the tags JUBE recorded in the
run's configuration.xml are checked here, and every site/vendor value comes from one data file
(systems.ini) instead of tag-conditional parameters spread over the XML. Runs on the login node's
`python3` (standard library only, Python >= 3.8); the drivers run with the profile's Python.
Errors print "<problem>. Fix: <fix>" (the project's ValidationError form) and exit 64.
"""

from __future__ import annotations

import argparse
import configparser
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from types import ModuleType

JUBE_DIR = Path(__file__).resolve().parent
REPO = JUBE_DIR.parent
PROFILE_FILE = JUBE_DIR / "systems.ini"
JOB_SCRIPT = JUBE_DIR / "job.sh"
EX_USAGE = 64

BENCHMARKS = {"llm": "llm_training", "resnet50": "resnet50", "inference": "llm_inference"}
MODEL_TAGS = ("tiny", "117M", "800M", "13B", "175B")
INFERENCE_MODEL_TAGS = ("tiny", "gpt2", "llama-1b", "llama-8b")  # llm_inference presets
MODEL_TAGS_OF = {"llm": MODEL_TAGS, "inference": INFERENCE_MODEL_TAGS}
FRAMEWORK_TAGS = ("pytorch", "tensorflow")
FLAG_TAGS = ("wait", "synthetic", "container")
DEFAULT_SYSTEM = "local"
SIGNAL_MARGIN_S = 60  # USR1 this long before the time limit: the job records TIMEOUT and cleans up


class ConfigError(Exception):
    """A configuration that cannot work: the value, and what to do instead."""

    def __init__(self, problem: str, fix: str) -> None:
        super().__init__(f"{problem.rstrip('.')}. Fix: {fix}")


# ---------------------------------------------------------------------------------------------------
# Profile


def _read_profiles(environ: dict[str, str]) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None)
    parser.optionxform = str.lower  # type: ignore[assignment,method-assign]
    files = [PROFILE_FILE]
    if environ.get("JOULEBENCH_PROFILE"):
        extra = Path(environ["JOULEBENCH_PROFILE"])
        if not extra.is_file():
            raise ConfigError(f"JOULEBENCH_PROFILE={extra} does not exist",
                              "point it to an .ini file of the form of jube/systems.ini")
        files.append(extra)
    for path in files:
        parser.read(path)
    return parser


def system_names(environ: dict[str, str] | None = None) -> list[str]:
    return _read_profiles(dict(os.environ if environ is None else environ)).sections()


def load_profile(system: str, environ: dict[str, str] | None = None) -> dict[str, str]:
    """The system's settings: [DEFAULT] < [SYSTEM] < JOULEBENCH_<KEY> < JOULEBENCH_<SYSTEM>_<KEY>."""
    env = dict(os.environ if environ is None else environ)
    parser = _read_profiles(env)
    section = next((s for s in parser.sections() if s.lower() == system.lower()), None)
    if section is None:
        raise ConfigError(f"system '{system}' has no profile in {PROFILE_FILE}",
                          f"use one of {', '.join(parser.sections())} or add a section (docs/jube.md)")
    profile = {key: value.strip() for key, value in parser.items(section)}
    profile["system"] = section
    overridable = set(profile) | {"nodes"}
    upper_env = {key.upper(): value for key, value in env.items() if key.upper().startswith("JOULEBENCH_")}
    for prefix in ("JOULEBENCH_", f"JOULEBENCH_{section.upper()}_"):
        for key in sorted(overridable - {"system"}):
            if prefix + key.upper() in upper_env:
                profile[key] = upper_env[prefix + key.upper()].strip()
    return profile


def resolve_python(profile: dict[str, str]) -> str:
    """`auto`: the repository's .venv (made by jube/setup.sh) if present, else python3 on PATH."""
    python = profile.get("python", "auto") or "auto"
    if python != "auto":
        return python
    venv = REPO / ".venv" / "bin" / "python"
    return str(venv) if venv.exists() else "python3"


# ---------------------------------------------------------------------------------------------------
# Tags


def recorded_tags(configuration_xml: Path) -> list[str]:
    """Tags JUBE recorded for this run (<selection><tag>); JUBE itself never rejects a tag."""
    root = ET.parse(configuration_xml).getroot()
    return sorted({(t.text or "").strip() for sel in root.findall("selection") for t in sel.findall("tag")})


def classify_tags(benchmark: str, tags: list[str], systems: list[str]) -> dict[str, list[str]]:
    """Split tags into system/model/framework/flag; unknown, duplicate or misplaced tags are errors."""
    by_lower = {s.lower(): s for s in systems}
    kinds: dict[str, list[str]] = {"system": [], "model": [], "framework": [], "flag": []}
    for tag in tags:
        if tag.lower() in by_lower:
            kinds["system"].append(by_lower[tag.lower()])
        elif tag in MODEL_TAGS_OF.get(benchmark, ()):
            kinds["model"].append(tag)
        elif tag in FRAMEWORK_TAGS and benchmark == "resnet50":
            kinds["framework"].append(tag)
        elif tag in FLAG_TAGS:
            kinds["flag"].append(tag)
        else:
            known = [*systems, *MODEL_TAGS_OF.get(benchmark, FRAMEWORK_TAGS), *FLAG_TAGS]
            raise ConfigError(f"unknown tag '{tag}' for the {benchmark} workflow (JUBE accepts any tag silently)",
                              f"use only these tags: {' '.join(known)}")
    for kind in ("system", "model"):
        if len(kinds[kind]) > 1:
            raise ConfigError(f"{len(kinds[kind])} {kind} tags given ({', '.join(kinds[kind])}): JUBE would "
                              f"silently use one of them", f"pass exactly one {kind} tag (or none for the default)")
    return kinds


# ---------------------------------------------------------------------------------------------------
# Settings


def _int(value: str, what: str, minimum: int = 1) -> int:
    try:
        number = int(value)
    except ValueError:
        raise ConfigError(f"{what}={value!r} is not a whole number", f"set {what} to an integer >= {minimum}") from None
    if number < minimum:
        raise ConfigError(f"{what}={number} is below {minimum}", f"set {what} to an integer >= {minimum}")
    return number


def time_limit_seconds(value: str) -> int:
    """Slurm's [D-]H:MM:SS / MM:SS / MM forms, as seconds."""
    match = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", value.strip())
    if not match:
        raise ConfigError(f"time_limit={value!r} is not a Slurm time", "write it as H:MM:SS, e.g. 0:20:00")
    days, a, b, c = (int(g) if g else None for g in match.groups())
    if c is not None:
        seconds = a * 3600 + b * 60 + c
    elif b is not None:
        seconds = a * 3600 + b * 60 if days is not None else a * 60 + b
    else:
        seconds = a * 3600 if days is not None else a * 60
    return seconds + (days or 0) * 86400


def exit_duration_mins(limit_s: int) -> float:
    """Training stops itself this long after start: the limit minus a margin for start-up and the record."""
    margin = max(120.0, 0.15 * limit_s)
    return round(max(1.0, (limit_s - margin) / 60.0), 1)


def build_settings(benchmark: str, tags: list[str], overrides: dict[str, str], run_id: str,
                   environ: dict[str, str] | None = None) -> dict[str, str]:
    """Everything the job needs, as JB_* variables; raises ConfigError before anything is submitted."""
    env = dict(os.environ if environ is None else environ)
    kinds = classify_tags(benchmark, tags, system_names(env))
    system = kinds["system"][0] if kinds["system"] else DEFAULT_SYSTEM
    profile = load_profile(system, env)
    if profile["unsupported"]:
        raise ConfigError(f"system {system} cannot run the {BENCHMARKS[benchmark]} driver: {profile['unsupported']}",
                          "pick a GPU or CPU system tag")
    launcher = profile["launcher"]
    if launcher not in ("slurm", "local"):
        raise ConfigError(f"launcher={launcher!r} for system {system}", "set launcher to slurm or local")
    if launcher == "slurm" and not shutil.which("sbatch"):
        raise ConfigError(f"system {system} submits with Slurm, but sbatch is not on PATH",
                          "run on the cluster's login node, or use the local system (no system tag)")
    value = {k: v for k, v in overrides.items() if v != ""}
    model = kinds["model"][0] if kinds["model"] else profile["default_model"]
    nodes = _int(value.get("nodes") or profile.get("nodes") or profile.get(f"nodes_{model.lower()}", "1"), "nodes")
    per_node = _int(value.get("devices_per_node") or profile["devices_per_node"], "devices_per_node")
    if benchmark == "inference":  # one process on one device per job; sweep points are separate jobs
        model = kinds["model"][0] if kinds["model"] else profile["inference_preset"]
        nodes, per_node = 1, 1
    if launcher == "local" and nodes * per_node != 1:
        raise ConfigError(f"the local system runs one process, not {nodes} nodes x {per_node} devices",
                          "use a Slurm system tag for more than one device")
    limit_s = time_limit_seconds(profile["time_limit"])
    threads = _int(profile["cpu_threads_per_node"] or "0", "cpu_threads_per_node", 0)
    python = resolve_python(profile)
    settings = {
        "JB_BENCHMARK": benchmark, "JB_DRIVER": BENCHMARKS[benchmark], "JB_SYSTEM": system,
        "JB_LAUNCHER": launcher, "JB_NODES": str(nodes), "JB_TASKS_PER_NODE": str(per_node),
        "JB_WORLD_SIZE": str(nodes * per_node), "JB_GRES": profile["gres"],
        "JB_CPUS_PER_TASK": str(max(1, threads // per_node)) if threads else "",
        "JB_PARTITION": profile["partition"], "JB_ACCOUNT": profile["account"],
        "JB_TIME_LIMIT": profile["time_limit"], "JB_TIME_LIMIT_S": str(limit_s),
        "JB_SETUP": profile["setup"], "JB_PYTHON": python, "JB_SBATCH_ARGS": profile["sbatch_args"],
        "JB_SRUN_ARGS": profile["srun_args"], "JB_CONTAINER": profile["container"],
        "JB_JPWR_METHODS": profile["jpwr_methods"] or "auto", "JB_RUN_ID": run_id, "JB_REPO": str(REPO),
        "JB_VENDOR": profile["vendor"], "JB_DRIVER_COMMAND": "run" if benchmark == "inference" else "train",
    }
    synthetic = "synthetic" in kinds["flag"]
    prefix = "llm" if benchmark == "llm" else "resnet"
    common = {
        "precision": value.get("precision") or profile["precision"],
        "iterations": value.get("iterations") or profile[f"{prefix}_iterations"],
        "warmup_iterations": value.get("warmup_iterations") or profile[f"{prefix}_warmup_iterations"],
        "device": value.get("device") or profile["driver_device"],
    }
    if benchmark == "llm":
        args = {
            "model": model,
            "tensor_parallel": value.get("tensor_parallel") or profile.get(f"tp_{model.lower()}", ""),
            "pipeline_parallel": value.get("pipeline_parallel") or profile.get(f"pp_{model.lower()}", ""),
            "micro_batch_size": value.get("micro_batch_size", ""),
            "global_batch_size": value.get("global_batch_size") or profile.get(f"gbs_{model.lower()}", ""),
            "data_path": "" if synthetic else profile["llm_data_path"],
            **common,
        }
        settings["JB_MODEL"] = model
    elif benchmark == "inference":
        args = {
            "preset": model, "task": value.get("task") or profile["inference_task"],
            "batch_size": value.get("batch_size") or profile["inference_batch_size"],
            "min_window_s": value.get("min_window_s") or profile["inference_min_window_s"],
            "precision": common["precision"], "device": common["device"],
        }
        settings["JB_MODEL"] = model
    else:
        framework = value.get("framework", "pytorch")
        if framework not in FRAMEWORK_TAGS:
            raise ConfigError(f"framework={framework!r}", f"use one of {', '.join(FRAMEWORK_TAGS)}")
        args = {
            "framework": framework, "global_batch_size": value.get("global_batch_size") or profile["resnet_gbs"],
            "image_size": value.get("image_size") or profile["resnet_image_size"],
            "data": "synthetic" if synthetic or not profile["resnet_data_dir"] else profile["resnet_data_dir"],
            **common,
        }
        settings["JB_MODEL"] = f"resnet50-{framework}"
    if "container" in kinds["flag"]:
        settings.update(container_settings(profile, args.get("framework", "pytorch"), env))
    shared = _cli_args(args)
    if benchmark == "inference":  # one device, no run-length budget: the driver's windows are seconds long
        settings["JB_VALIDATE_ARGS"] = shlex.join(shared)
        settings["JB_TRAIN_ARGS"] = shlex.join([*shared, "--run-id", run_id])
        return settings
    settings["JB_VALIDATE_ARGS"] = shlex.join(
        [*shared, "--world-size", str(nodes * per_node), "--nodes", str(nodes), "--devices-per-node", str(per_node)])
    settings["JB_TRAIN_ARGS"] = shlex.join([*shared, "--exit-duration-mins", str(exit_duration_mins(limit_s)),
                                            "--run-id", run_id])
    return settings


def _jbcontainer() -> ModuleType:
    """container/jbcontainer.py, imported on demand: only the `container` tag needs it."""
    sys.path.insert(0, str(REPO / "container"))
    import jbcontainer

    return jbcontainer


def container_settings(profile: dict[str, str], framework: str, environ: dict[str, str]) -> dict[str, str]:
    """The `container` tag: the job runs the drivers in the system's pinned image (docs/container.md)."""
    jbcontainer = _jbcontainer()
    try:
        return jbcontainer.job_settings(profile, framework, environ)
    except jbcontainer.ValidationError as exc:
        raise ConfigError(exc.problem, exc.fix) from None


def ensure_container_image(settings: dict[str, str]) -> None:
    """Build or pull the image once, on the login node, before anything is validated or submitted."""
    jbcontainer = _jbcontainer()
    framework = settings["JB_CONTAINER_NAME"].split("-", 1)[1]  # <vendor>-<framework>
    try:
        image = jbcontainer.ensure_image(load_profile(settings["JB_SYSTEM"]), framework)
    except jbcontainer.ValidationError as exc:
        raise ConfigError(exc.problem, exc.fix) from None
    print(f"JOULEBENCH_SETTING container={image}", flush=True)


def _cli_args(values: dict[str, str]) -> list[str]:
    args: list[str] = []
    for key, val in values.items():
        if val != "":
            args += [f"--{key.replace('_', '-')}", str(val)]
    return args


def write_settings(path: Path, settings: dict[str, str]) -> None:
    text = "# joulebench job settings (written by jube/jbprofile.py; sourced by jube/job.sh)\n"
    text += "".join(f"{key}={shlex.quote(val)}\n" for key, val in settings.items())
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def read_settings(path: Path) -> dict[str, str]:
    """The inverse of write_settings (values may span lines: a profile's setup can)."""
    words = shlex.split(path.read_text(), comments=True)
    return dict(word.split("=", 1) for word in words)


def in_profile_shell(settings: dict[str, str], argv: list[str]) -> list[str]:
    """Run argv after the profile's setup lines (module loads, venv), as the job script does."""
    setup = settings["JB_SETUP"].strip()
    script = (setup + "\n" if setup else "") + 'exec "$@"'
    return ["/bin/sh", "-c", script, "jb-setup", *argv]


def driver_validate(settings: dict[str, str]) -> int:
    """The driver's own `validate` (no device touched): parallel layout, batch divisibility, memory fit."""
    container = shlex.split(settings.get("JB_CONTAINER", ""))  # validate where the job will run the driver
    argv = [*container, settings["JB_PYTHON"], "-m", settings["JB_DRIVER"], "validate",
            *shlex.split(settings["JB_VALIDATE_ARGS"])]
    print("validate:", shlex.join(argv), flush=True)
    try:
        return subprocess.call(in_profile_shell(settings, argv))
    except OSError as exc:
        raise ConfigError(f"cannot run {settings['JB_PYTHON']}: {exc}",
                          "set python in jube/systems.ini or JOULEBENCH_PYTHON to an interpreter with joulebench "
                          "installed (jube/setup.sh makes .venv)") from None


# ---------------------------------------------------------------------------------------------------
# Commands


def cmd_prepare(args: argparse.Namespace) -> int:
    tags = recorded_tags(Path(args.config)) if args.config else list(args.tag)
    overrides = dict(item.split("=", 1) for item in args.set)
    settings = build_settings(args.benchmark, tags, overrides, args.run_id)
    for key in ("JB_SYSTEM", "JB_MODEL", "JB_LAUNCHER", "JB_NODES", "JB_TASKS_PER_NODE", "JB_PARTITION"):
        print(f"JOULEBENCH_SETTING {key[3:].lower()}={settings[key] or 'n/a'}")
    if settings.get("JB_CONTAINER_IMAGE"):
        ensure_container_image(settings)
    rc = driver_validate(settings)
    if rc == EX_USAGE:
        print(f"jbprofile: {settings['JB_DRIVER']} validate rejected this configuration; nothing was submitted",
              file=sys.stderr)
        return EX_USAGE
    if rc != 0:
        print(f"jbprofile: {settings['JB_DRIVER']} validate could not run (exit {rc}) with {settings['JB_PYTHON']}; "
              "nothing was submitted. Fix: set python in jube/systems.ini or JOULEBENCH_PYTHON to an interpreter "
              "with joulebench installed (jube/setup.sh makes .venv)", file=sys.stderr)
        return EX_USAGE
    write_settings(Path(args.out), settings)
    return 0


def _finalize_without_job(settings_path: Path, reason: str) -> None:
    """The job never ran to its end (sbatch refused it, or it was killed): record FAILED, mark it done."""
    settings = read_settings(settings_path)
    container = shlex.split(settings.get("JB_CONTAINER", ""))
    argv = [*container, settings["JB_PYTHON"], str(JUBE_DIR / "jbrecord.py"), "finalize", "--settings",
            str(settings_path), "--status", "FAILED", "--reason", reason]
    subprocess.call(in_profile_shell(settings, argv))
    Path(settings["JB_DONE_FILE"]).touch()


def sbatch_command(settings: dict[str, str], settings_path: Path) -> list[str]:
    workdir = Path(settings["JB_WORKDIR"])
    argv = ["sbatch", "--parsable", f"--job-name=jb-{settings['JB_MODEL']}", f"--nodes={settings['JB_NODES']}",
            f"--ntasks-per-node={settings['JB_TASKS_PER_NODE']}", f"--time={settings['JB_TIME_LIMIT']}",
            f"--output={workdir / 'job.out'}", f"--error={workdir / 'job.err'}", f"--chdir={workdir}",
            f"--signal=B:USR1@{SIGNAL_MARGIN_S}"]
    if settings["JB_GRES"].lower() in ("yes", "true", "1"):
        argv.append(f"--gpus-per-node={settings['JB_TASKS_PER_NODE']}")
    if settings["JB_CPUS_PER_TASK"]:
        argv.append(f"--cpus-per-task={settings['JB_CPUS_PER_TASK']}")
    if settings["JB_PARTITION"]:
        argv.append(f"--partition={settings['JB_PARTITION']}")
    if settings["JB_ACCOUNT"]:
        argv.append(f"--account={settings['JB_ACCOUNT']}")
    return [*argv, *shlex.split(settings["JB_SBATCH_ARGS"]), str(JOB_SCRIPT), str(settings_path)]


def wait_for_done(settings: dict[str, str], job_id: str | None) -> None:
    """Block until the job touched its done file (the `wait` tag); give up once Slurm forgot the job."""
    done = Path(settings["JB_DONE_FILE"])
    gone_since = None
    while not done.exists():
        time.sleep(1.0)
        if job_id is None:
            continue
        probe = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True, timeout=30)
        if probe.stdout.strip():
            gone_since = None
        elif gone_since is None:
            gone_since = time.monotonic()
        elif time.monotonic() - gone_since > 30:
            print(f"jbprofile: job {job_id} left the queue without touching {done}", file=sys.stderr)
            return


def cmd_submit(args: argparse.Namespace) -> int:
    """Never fails the JUBE step: a refused submission becomes a FAILED run record and a done file."""
    workdir = Path.cwd().resolve()
    settings = read_settings(Path(args.settings))
    settings["JB_WORKDIR"] = str(workdir)
    settings["JB_OUT_DIR"] = str(workdir / "run")
    settings["JB_DONE_FILE"] = str(workdir / "job.done")
    settings_path = workdir / "job.env"
    write_settings(settings_path, settings)
    if settings["JB_LAUNCHER"] == "local":
        print(f"running locally: bash {JOB_SCRIPT} {settings_path}", flush=True)
        with open(workdir / "job.out", "ab") as out, open(workdir / "job.err", "ab") as err:
            rc = subprocess.call(["bash", str(JOB_SCRIPT), str(settings_path)], stdout=out, stderr=err)
        print(f"local job finished with exit code {rc}")
        if not Path(settings["JB_DONE_FILE"]).exists():  # killed before its traps could run
            _finalize_without_job(settings_path, f"the job script was killed (exit code {rc}) before it finished")
        return 0
    argv = sbatch_command(settings, settings_path)
    print("submit:", shlex.join(argv), flush=True)
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        reason = f"sbatch refused the job: {proc.stderr.strip() or proc.stdout.strip()}"
        print(reason, file=sys.stderr)
        _finalize_without_job(settings_path, reason)
        return 0
    job_id = proc.stdout.strip().split(";")[0]
    (workdir / "job.id").write_text(job_id + "\n")
    print(f"Submitted batch job {job_id}", flush=True)
    if args.wait:
        wait_for_done(settings, job_id)
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    for key, value in sorted(load_profile(args.system).items()):
        print(f"{key} = {value}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="jbprofile.py", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    prepare = sub.add_parser("prepare", help="resolve tags + profile, run the driver's validate, write job.env")
    prepare.add_argument("--benchmark", choices=sorted(BENCHMARKS), required=True)
    prepare.add_argument("--config", help="the run's configuration.xml (JUBE records the tags there)")
    prepare.add_argument("--tag", action="append", default=[], help="tags, when not read from --config")
    prepare.add_argument("--run-id", required=True)
    prepare.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                         help="workflow parameter (empty values mean: profile or driver default)")
    prepare.add_argument("--out", default="job.env")
    submit = sub.add_parser("submit", help="run the job script locally or sbatch it")
    submit.add_argument("--settings", required=True)
    submit.add_argument("--wait", action="store_true", help="return only after the job finished")
    show = sub.add_parser("show", help="print a system's resolved profile")
    show.add_argument("system")
    args = parser.parse_args(argv)
    handler = {"prepare": cmd_prepare, "submit": cmd_submit, "show": cmd_show}[args.command]
    try:
        return handler(args)
    except ConfigError as exc:
        print(f"jbprofile: error: {exc}", file=sys.stderr)
        return EX_USAGE


if __name__ == "__main__":
    sys.exit(main())
