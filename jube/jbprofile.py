#!/usr/bin/env python3
"""Login-node side of the JUBE workflows: resolve tags and the system profile, validate, submit.

    jbprofile.py prepare --benchmark llm --config RUNDIR/configuration.xml --run-id ID [--sweep NAMES] [--set K=V]
    jbprofile.py submit --settings validate/job.env [--wait]
    jbprofile.py verdict --settings validate/job.env   # exit 64 for a sweep point that validate refused
    jbprofile.py summary --rundir RUNDIR               # how many sweep points validate refused
    jbprofile.py compare --rundir RUNDIR               # each row against its default row; the full table
    jbprofile.py show SYSTEM                           # the resolved profile, after environment overrides

Why a script and not JUBE parameters: JUBE ignores unknown tags and lets the last of two system
tags win silently (and Debian's JUBE 2.5.1 has no <check_tags>), so the tags JUBE recorded in the
run's configuration.xml are checked here, and every site/vendor value comes from one data file
(systems.ini) instead of tag-conditional parameters spread over the XML. Runs on the login node's
`python3` (standard library only, Python >= 3.10); the drivers run with the profile's Python.

Two kinds of refusal. A mistake of the whole workflow (a tag, a profile key, a system that cannot run the
driver) stops the validate step (exit 64, "<problem>. Fix: <fix>"): nothing is submitted. A sweep point that
cannot run (its values, the partition's limits, its time limit, a duplicate) becomes a row with status INVALID
and the reason; the other points run, and the `verdict` step fails afterwards so that `jube run -e` and
`jube status` say that points were refused.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from types import ModuleType

sys.path.insert(0, str(Path(__file__).resolve().parent))  # also when loaded by file path (tests, jbrecord.py)
import jbfootprint
import jbrecommend
import jbslurm
import jbsubmit
import jbtable
from jbarguments import cli_args, one_node_layout, serving_mode
from jbchecks import (
    NUMBERS,
    batch_scaling,
    check_local_layout,
    check_site_names,
    check_time_limit,
    device_settings_policy,
    devices_per_node,
    local_node_devices,
    number,
    stop_margin_s,
    yes_or_no,
)
from jbsettings import SETUP_FAILED, bound_env, job_python, read_settings, write_settings
from jbshell import check_command_values
from jbsystems import (
    FLAG_TAGS,
    REPO,
    ConfigError,
    PointRefused,
    check_name,
    closest,
    load_profile,
    override_variable,
    resolve_python,
    system_names,
)
from jbworkloads import WORKLOADS, Workload

EX_USAGE = 64
EX_CANTCREAT = 73  # the settings file (--out) cannot be written
ARGPARSE_USAGE = 2  # argparse's exit code for an option the driver does not know or a value it cannot parse
CANNOT_EXECUTE = (126, 127)  # a shell's exit code for a program that is not executable or not found

DEFAULT_SYSTEM = "local"
EX_REFUSED = 77  # python -m joulebench.device_settings: the site or this process may not change the setting
SCALED_KEYS = ("nodes", "devices_per_node")  # the sweep dimensions a scaling table compares


# ---------------------------------------------------------------------------------------------------
# Profile values


def jpwr_methods(profile: dict[str, str]) -> str:
    """The samplers' --methods: `auto` or names jpwr knows (checked here, not when every node's sampler starts)."""
    from jpwr import ValidationError  # the repository root is on sys.path (jbsettings)
    from jpwr.arguments import parse_methods

    value = profile["jpwr_methods"] or "auto"
    try:
        parse_methods(value)
    except ValidationError as exc:
        raise ConfigError(f"profile key jpwr_methods = {value!r}: {exc.problem}",
                          f"{exc.fix} ({override_variable(profile['system'], 'jpwr_methods')})") from None
    return value


# ---------------------------------------------------------------------------------------------------
# Tags


def recorded_tags(configuration_xml: Path) -> list[str]:
    """Tags JUBE recorded for this run (<selection><tag>); JUBE itself never rejects a tag. A file that is missing or
    not XML (truncated) is a ConfigError naming it and the line."""
    try:
        root = ET.parse(configuration_xml).getroot()
    except OSError as exc:
        raise ConfigError(f"the run's configuration {configuration_xml} cannot be read ({exc.strerror or exc})",
                          "run the step inside the JUBE run directory it belongs to (--config RUNDIR/configuration.xml "
                          "as the workflow passes it), or rerun `jube run`") from None
    except ET.ParseError as exc:
        line, column = exc.position
        raise ConfigError(f"the run's configuration {configuration_xml} is not well-formed XML at line {line}, column "
                          f"{column} (truncated or edited)", "rerun `jube run` for a fresh run directory (JUBE writes "
                                                             "the file; it is not edited by hand)") from None
    return sorted({(t.text or "").strip() for sel in root.findall("selection") for t in sel.findall("tag")})


def classify_tags(benchmark: str, tags: list[str], systems: list[str]) -> dict[str, list[str]]:
    """Split tags into system/model/framework/flag; unknown, duplicate or misplaced tags are errors."""
    workload = WORKLOADS[benchmark]
    by_lower = {s.lower(): s for s in systems}
    kinds: dict[str, list[str]] = {"system": [], "model": [], "framework": [], "flag": []}
    for tag in tags:
        if tag.lower() in by_lower:
            kinds["system"].append(by_lower[tag.lower()])
        elif tag in workload.model_tags:
            kinds["model"].append(tag)
        elif tag in workload.framework_tags:
            kinds["framework"].append(tag)
        elif tag in FLAG_TAGS:
            kinds["flag"].append(tag)
        else:
            known = [*systems, *workload.model_tags, *workload.framework_tags, *FLAG_TAGS]
            raise ConfigError(f"unknown tag '{tag}' for the {benchmark} workflow (JUBE accepts any tag silently)",
                              f"use only these tags: {' '.join(known)}")
    for kind in ("system", "model"):
        if len(kinds[kind]) > 1:
            raise ConfigError(f"{len(kinds[kind])} {kind} tags given ({', '.join(kinds[kind])}): JUBE would "
                              f"silently use one of them", f"pass exactly one {kind} tag (or none for the default)")
    return kinds


# ---------------------------------------------------------------------------------------------------
# Settings


def base_settings(workload: Workload, kinds: dict[str, list[str]], profile: dict[str, str], run_id: str,
                  sweep: dict[str, str]) -> dict[str, str]:
    """What every row needs, also an INVALID one: who runs it, where, and the sweep point as given."""
    settings = {
        "JB_STATUS": "OK", "JB_REASON": "", "JB_BENCHMARK": workload.name, "JB_DRIVER": workload.driver,
        "JB_SYSTEM": profile["system"], "JB_MODEL": workload.model_of(kinds["model"], profile, sweep),
        "JB_LAUNCHER": profile["launcher"], "JB_RUN_ID": run_id,
        "JB_PYTHON": resolve_python(profile), "JB_SETUP": profile["setup"], "JB_CONTAINER": profile["container"],
        "JB_REPO": str(REPO), "JB_NOTE": profile["selection"], "JB_SWEEP": ",".join(workload.sweep_keys),
        "JB_PARTITION": profile["partition"], "JB_ACCOUNT": profile["account"],
    }
    settings.update({f"JB_COORD_{key.upper()}": sweep.get(key, "") for key in workload.sweep_keys})
    return settings


def build_settings(benchmark: str, tags: list[str], overrides: dict[str, str], run_id: str,
                   environ: dict[str, str] | None = None) -> dict[str, str]:
    """Everything the job needs, as JB_* variables. Raises ConfigError for a mistake of the whole workflow,
    PointRefused (with `.settings`, the row's coordinates) for a sweep point that cannot run."""
    env = dict(os.environ if environ is None else environ)
    workload = WORKLOADS[benchmark]
    unknown = sorted(set(overrides) - set(workload.sweep_keys))
    if unknown:
        raise ConfigError(f"unknown workflow parameter '{unknown[0]}' for the {benchmark} workflow"
                          f"{closest(unknown[0], set(workload.sweep_keys))}",
                          f"use one of {', '.join(workload.sweep_keys)}")
    check_name(run_id, "run id")
    kinds = classify_tags(benchmark, tags, system_names(env))
    profile = load_profile(kinds["system"][0] if kinds["system"] else DEFAULT_SYSTEM, env)
    system = profile["system"]
    if profile["unsupported"]:
        raise ConfigError(f"system {system} cannot run the {workload.driver} driver: {profile['unsupported']}",
                          "pick a GPU or CPU system tag")
    if profile["launcher"] not in ("slurm", "local"):
        raise ConfigError(f"launcher={profile['launcher']!r} for system {system}", "set launcher to slurm or local")
    if profile["launcher"] == "slurm" and not shutil.which("sbatch", path=env.get("PATH", os.defpath)):
        raise ConfigError(f"system {system} submits with Slurm, but sbatch is not on PATH",
                          "run on the cluster's login node, or use the local system (no system tag)")
    profile.update(check_command_values(profile, env))  # before anything runs one of them (validate, submit, job)
    check_site_names(profile)
    value = {k: v.strip() for k, v in overrides.items() if v.strip() != ""}
    settings = base_settings(workload, kinds, profile, run_id, value)
    # what `jube run` was given, kept as the sweep values are: the apply line's tags, the recommend step's target and
    # re-runs (on Slurm that step runs at `jube continue`, whose environment may lack them), checked here
    settings.update(JB_TAGS=" ".join(tags), **jbrecommend.run_settings(env))
    settings.update(jbfootprint.site_footprint(profile).settings())  # a bad CSV is the site's: stops validate
    try:
        point_settings(settings, workload, kinds, profile, value)
    except PointRefused as exc:
        exc.settings = settings
        raise
    if "container" in kinds["flag"]:
        settings.update(container_settings(profile, value.get("framework", "pytorch"), env))
    return settings


def point_settings(settings: dict[str, str], workload: Workload, kinds: dict[str, list[str]],
                   profile: dict[str, str], value: dict[str, str]) -> None:
    """The sweep point's own settings and driver arguments, into `settings`; PointRefused when it cannot run."""
    for key, text in value.items():
        if key in NUMBERS:
            number(text, key, key)
    model = settings["JB_MODEL"]
    sized_like = model if workload.nodes_by_model else profile["default_model"]
    nodes_text = value.get("nodes") or profile["nodes"] or profile.get(f"nodes_{sized_like.lower()}", "1")
    nodes = int(number(nodes_text, "nodes", "nodes"))
    if workload.one_device:  # one node; one process per tensor-parallel rank
        nodes, per_node = 1, int(value.get("tensor_parallel") or "1")  # a number: checked above (NUMBERS)
    else:
        per_node = devices_per_node(profile, value, nodes)
    if profile["launcher"] == "local":
        check_local_layout(nodes, per_node, profile)
    limit_s = jbslurm.duration_s(profile["time_limit"])
    if limit_s is None:
        raise PointRefused(f"time_limit={profile['time_limit']!r} is not a Slurm time", "write it as H:MM:SS")
    threads = int(number(profile["cpu_threads_per_node"] or "0", "cpu_threads_per_node", "cpu_threads_per_node"))
    settings.update({
        "JB_NODES": str(nodes), "JB_TASKS_PER_NODE": str(per_node), "JB_WORLD_SIZE": str(nodes * per_node),
        "JB_GRES": profile["gres"], "JB_CPUS_PER_TASK": str(max(1, threads // per_node)) if threads else "",
        "JB_TIME_LIMIT": profile["time_limit"], "JB_TIME_LIMIT_S": str(limit_s),
        "JB_STOP_MARGIN_S": str(stop_margin_s(limit_s)), "JB_STOP_BUDGET_S": str(limit_s - stop_margin_s(limit_s)),
        "JB_SBATCH_ARGS": profile["sbatch_args"], "JB_FINALIZER_SBATCH_ARGS": profile["finalizer_sbatch_args"],
        "JB_SRUN_ARGS": profile["srun_args"], "JB_JPWR_METHODS": jpwr_methods(profile),
        "JB_VENDOR": profile["vendor"], "JB_LOCAL_NODE_DEVICES": local_node_devices(profile),
        "JB_METER_WHOLE_NODE": yes_or_no(profile["meter_whole_node"], "meter_whole_node"),
        "JB_ALLOW_PARTIAL": yes_or_no(profile["allow_partial"], "allow_partial"),
        "JB_DEVICE_SETTINGS": device_settings_policy(profile), "JB_ZEUSD_SOCKET": profile["zeusd_socket"],
        "JB_POWER_LIMIT": value.get("power_limit", ""), "JB_SM_CLOCK": value.get("sm_clock", ""),
        "JB_DRIVER_COMMAND": workload.command_of(value),
        "JB_SELF_STOP": "yes" if workload.self_stop else "no",  # --exit-duration-mins, set by job.sh
    })
    batch_key = workload.batch_key.format(model=model.lower())
    reference_nodes = int(number(profile["nodes"] or profile.get(f"nodes_{sized_like.lower()}", "1"), "nodes", "nodes"))
    scaling, batch = batch_scaling(profile, value, nodes * per_node, reference_nodes, batch_key) if batch_key else (
        "", "")
    settings.update(scaling_settings(settings, scaling, value))
    point_profile = {**profile, **one_node_layout(profile, model, nodes), **({batch_key: batch} if batch_key else {})}
    args = workload.arguments(point_profile, value, model, kinds["flag"], workload.profile_prefix)
    for key, text in args.items():
        if key in NUMBERS and text != "":
            number(text, key, key)
    resolved = {"nodes": str(nodes), "devices_per_node": str(per_node)}
    settings.update({f"JB_COORD_{key.upper()}": resolved.get(key) or args.get(key, value.get(key, ""))
                     for key in workload.sweep_keys})
    if workload.serving_command:
        serving = settings["JB_DRIVER_COMMAND"] == workload.serving_command
        settings["JB_NOTE"] = "; ".join(n for n in (settings["JB_NOTE"], serving_mode(settings, value, serving)) if n)
    startup_key = workload.startup_key.format(model=model.lower())
    startup = number(profile[startup_key], startup_key, "startup_s")
    steady_key = next((key for key in ("steady_seconds", "min_window_s") if args.get(key)), "min_steady_s")
    steady = number(args.get(steady_key) or profile["min_steady_s"], steady_key, "min_steady_s")
    warning = check_time_limit(limit_s, startup, steady, f"{model} on {profile['system']}", profile["system"])
    settings["JB_NOTE"] = "; ".join(n for n in (settings["JB_NOTE"], warning) if n)
    # the run as validated: on a GPU system's nodes the GPU, so a job that lands where none is visible fails naming it
    # (with `auto` it ran on the CPUs and read OK)
    args = {**args, "device": validated_device(profile, args.get("device", ""))}
    shared = checked = cli_args(args)
    settings["JB_VALIDATE_ARGS"] = shlex.join(checked if workload.one_device else [
        *checked, "--world-size", str(nodes * per_node), "--nodes", str(nodes), "--devices-per-node", str(per_node)])
    settings["JB_TRAIN_ARGS"] = shlex.join([*shared, "--run-id", settings["JB_RUN_ID"]])


def validated_device(profile: dict[str, str], device: str) -> str:
    """The --device the driver's validate and the job's run are given: the profile's (validate resolves `auto` on
    this host, as the run does), except on Slurm, where validate runs on the login node and the run on the nodes:
    there `auto` is the nodes' device (the profile's vendor), never the login node's, for validate and run alike (a
    job of a GPU profile on nodes without a visible GPU fails naming it, not OK on the CPUs)."""
    if profile["launcher"] != "slurm" or device != "auto" or profile["vendor"] not in ("nvidia", "amd", "cpu"):
        return device
    return "cpu" if profile["vendor"] == "cpu" else "cuda"


def scaling_settings(settings: dict[str, str], scaling: str, value: dict[str, str]) -> dict[str, str]:
    """The point's scaling rule, and its scaling group: the points of a run that differ only in their nodes and
    devices as asked (the compare step's efficiency is against the group's one-device point)."""
    asked = [f"{key}={text}" for key, text in sorted(value.items()) if key not in SCALED_KEYS]
    return {"JB_SCALING": scaling,
            "JB_SCALING_GROUP": ";".join([settings["JB_SYSTEM"], settings["JB_MODEL"], scaling, *asked])}


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


def run_module(settings: dict[str, str], module: str, args: list[str], refused: tuple[int, ...]) -> None:
    """`python -m module args` where the job will run it (profile shell, container); an exit code in `refused` is
    this point's refusal (its last "error: <problem>. Fix: <fix>" line), any other failure a broken interpreter."""
    argv = job_python(settings, ["-m", module, *args])
    print("validate:", shlex.join(argv), flush=True)
    try:
        proc = subprocess.run(argv, capture_output=True, text=True)
    except OSError as exc:
        raise ConfigError(f"cannot run {settings['JB_PYTHON']}: {exc}", _python_fix(settings)) from None
    sys.stdout.write(proc.stdout)
    sys.stderr.write(proc.stderr)
    what = f"{module} {args[0]}"
    if proc.returncode in refused:
        errors = [line.split(": error: ", 1)[1] for line in proc.stderr.splitlines() if ": error: " in line]
        problem, _, fix = (errors[-1] if errors else proc.stderr.strip() or "rejected").partition(". Fix: ")
        raise PointRefused(f"{what}: {problem}", fix or "see the validate step's stderr")
    if proc.returncode == SETUP_FAILED:
        raise ConfigError(f"profile key setup failed on the login node before {what} (its lines returned non-zero "
                          "or ended the shell: `exit`, `set -e`); the job would fail the same way",
                          f"make the setup lines succeed in bash ({override_variable(settings['JB_SYSTEM'], 'setup')}"
                          " or the profile file); see the validate step's stderr")
    if proc.returncode in CANNOT_EXECUTE and settings.get("JB_CONTAINER"):
        raise ConfigError(f"{what} could not run (exit {proc.returncode}): the container prefix "
                          f"{settings['JB_CONTAINER']!r} or {settings['JB_PYTHON']} inside it was not found or is not "
                          "executable", "fix profile key container (a launcher on PATH after setup, e.g. `apptainer "
                          f"exec --nv IMAGE`: {override_variable(settings['JB_SYSTEM'], 'container')}) or python")
    if proc.returncode != 0:
        raise ConfigError(f"{what} could not run (exit {proc.returncode}) with {settings['JB_PYTHON']}",
                          _python_fix(settings))


def _python_fix(settings: dict[str, str]) -> str:
    return (f"set {override_variable(settings['JB_SYSTEM'], 'python')} (it wins over JOULEBENCH_PYTHON and python in "
            "the profile files) to an interpreter with joulebench installed (jube/setup.sh makes .venv)")


def driver_validate(settings: dict[str, str]) -> None:
    """The driver's own `validate` (no device touched): parallel layout, batch divisibility, memory fit."""
    command = "validate-load" if settings.get("JB_DRIVER_COMMAND") == "load" else "validate"
    # the job meters every point with `jpwr serve` (job.sh): the inference run's --objective energy may rely on it
    flag = WORKLOADS[settings["JB_BENCHMARK"]].validate_external_sampler
    sampler = [flag] if flag and command == "validate" else []
    run_module(settings, settings["JB_DRIVER"], [command, *shlex.split(settings["JB_VALIDATE_ARGS"]), *sampler],
               (EX_USAGE, ARGPARSE_USAGE))


def probe_device_settings(settings: dict[str, str]) -> None:
    """A point asking for a power limit or clock: may this system apply it? Reads only, before anything is submitted.
    On a Slurm login node the GPUs are elsewhere: the site's policy and the route are checked here, the devices
    themselves by the job's apply step on every node."""
    if not (settings["JB_POWER_LIMIT"] or settings["JB_SM_CLOCK"]):
        return
    if settings["JB_VENDOR"] not in ("nvidia", "amd"):
        raise PointRefused(f"power_limit/sm_clock asked for on {settings['JB_SYSTEM']}, whose devices are "
                           f"{settings['JB_VENDOR']}: there is no GPU setting to change",
                           "leave power_limit and sm_clock empty on this system")
    args = ["probe", "--device-settings", settings["JB_DEVICE_SETTINGS"], "--vendor", settings["JB_VENDOR"],
            "--power-limit", settings["JB_POWER_LIMIT"], "--sm-clock", settings["JB_SM_CLOCK"]]
    args += ["--zeusd-socket", settings["JB_ZEUSD_SOCKET"]] if settings["JB_ZEUSD_SOCKET"] else []
    args += ["--login-node"] if settings["JB_LAUNCHER"] == "slurm" else []
    run_module(settings, "joulebench.device_settings", args, (EX_USAGE, ARGPARSE_USAGE, EX_REFUSED))


def check_partition(settings: dict[str, str]) -> None:
    """Slurm systems: refuse a point that its partition could never start (nodes, GPUs, CPUs, time limit)."""
    if settings["JB_LAUNCHER"] != "slurm":
        return
    problem, unchecked = jbslurm.job_fit(settings)
    if unchecked:
        print(f"jbprofile: warning: partition limits not checked: {unchecked}", file=sys.stderr)
    if problem:
        raise PointRefused(f"Slurm would never start this job: {problem}",
                           "request fewer nodes or devices per node, a shorter time limit, or another partition "
                           f"({override_variable(settings['JB_SYSTEM'], 'partition')}, which wins over "
                           "JOULEBENCH_PARTITION and the profile files)")


def claim_point(rundir: Path, settings: dict[str, str]) -> None:
    """Refuse a sweep point whose resolved configuration another point of this run already has."""
    identity = "\n".join(settings.get(k, "") for k in (
        "JB_SYSTEM", "JB_DRIVER", "JB_MODEL", "JB_VALIDATE_ARGS", "JB_PARTITION", "JB_ACCOUNT", "JB_TIME_LIMIT",
        "JB_SBATCH_ARGS", "JB_SRUN_ARGS", "JB_CONTAINER", "JB_POWER_LIMIT", "JB_SM_CLOCK"))
    marker = rundir / "points" / hashlib.sha256(identity.encode()).hexdigest()[:16]
    marker.parent.mkdir(exist_ok=True)
    try:
        with open(marker, "x") as handle:
            handle.write(settings["JB_RUN_ID"] + "\n")
    except FileExistsError:
        first = marker.read_text().strip()
        raise PointRefused(f"duplicate sweep point: the same configuration as {first}",
                           "list each value of a swept parameter once") from None


# ---------------------------------------------------------------------------------------------------
# Commands


def sweep_values(args: argparse.Namespace) -> dict[str, str]:
    """The point's workflow parameters: JUBE exports them (their names in --sweep), --set adds or overrides."""
    names = [n for n in (args.sweep or "").split(",") if n]
    values = {name: os.environ.get(name, "") for name in names}
    given: dict[str, str] = {}
    for item in args.set:
        key, sep, val = item.partition("=")
        if not sep:
            raise ConfigError(f"--set {item!r} has no '='", "write --set KEY=VALUE")
        if given.get(key, val) != val:
            raise ConfigError(f"--set {key}={given[key]} and --set {key}={val} both given: only the last would count",
                              f"give {key} once")
        given[key] = values[key] = val
    return values


def cmd_prepare(args: argparse.Namespace) -> int:
    tags = recorded_tags(Path(args.config)) if args.config else list(args.tag)
    settings: dict[str, str] = {}
    try:
        settings = build_settings(args.benchmark, tags, sweep_values(args), args.run_id)
        for key in ("JB_SYSTEM", "JB_MODEL", "JB_LAUNCHER", "JB_NODES", "JB_TASKS_PER_NODE", "JB_PARTITION"):
            print(f"JOULEBENCH_SETTING {key[3:].lower()}={settings[key] or 'n/a'}")
        if settings["JB_NOTE"]:
            print(f"jbprofile: note: {settings['JB_NOTE']}")
        check_partition(settings)
        if args.config:
            claim_point(Path(args.config).parent, settings)
        if settings.get("JB_CONTAINER_IMAGE"):
            ensure_container_image(settings)
        driver_validate(settings)
        probe_device_settings(settings)
    except PointRefused as exc:
        settings = {**(exc.settings or settings), "JB_STATUS": "INVALID", "JB_REASON": str(exc)}
        print(f"jbprofile: sweep point refused, nothing submitted for it: {exc}", file=sys.stderr)
    try:
        write_settings(Path(args.out), settings)
    except OSError as exc:
        print(f"jbprofile: error: cannot write --out {args.out} ({exc.strerror or exc}). Fix: pass a writable path",
              file=sys.stderr)
        return EX_CANTCREAT
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    """The compare step, once every point has its row: jbrecord.py compare with the profile's Python, then the full
    table (jbtable.py, with this Python: also where the comparison failed). Never fails the step (the rows exist
    already); a failure leaves the comparison n/a, or the full table unwritten, and says why on stderr."""
    points = sorted(Path(args.rundir).glob("*_submit/work/job.env"))
    if not points:
        print("jbprofile: compare: no submitted points")
        return 0
    try:
        settings = read_settings(points[0])
    except ConfigError as exc:  # the comparison needs the job's Python: n/a, and the rows stay
        print(f"jbprofile: warning: compare: {exc}; the comparison is n/a", file=sys.stderr)
        return 0
    rundir = str(Path(args.rundir).resolve())
    argv = job_python(settings, [str(REPO / "jube" / "jbrecord.py"), "compare", "--rundir", rundir])
    code = subprocess.call(argv, env=bound_env(settings, Path(rundir)))  # the image reads records, writes compare/
    if code != 0:
        print(f"jbprofile: warning: the comparison with the default rows failed (exit {code}); the rows say n/a",
              file=sys.stderr)
    try:
        print(f"jbprofile: wrote {jbtable.write_full_table(Path(rundir), settings['JB_BENCHMARK'])}")
    except (OSError, ValueError, KeyError, ConfigError) as exc:  # a full disk; a point's job.env damaged or foreign
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else f"{type(exc).__name__}: {exc}"
        print(f"jbprofile: warning: cannot write the full table ({why}); JUBE's tables hold every row. Fix: mend "
              f"that, then: python3 {REPO / 'jube' / 'jbprofile.py'} compare --rundir {rundir}", file=sys.stderr)
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    for key, value in sorted(load_profile(args.system).items()):
        print(f"{key} = {value}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="jbprofile.py", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    prepare = sub.add_parser("prepare", help="resolve tags + profile, check the point, write job.env")
    prepare.add_argument("--benchmark", choices=sorted(WORKLOADS), required=True)
    prepare.add_argument("--config", help="the run's configuration.xml (JUBE records the tags there)")
    prepare.add_argument("--tag", action="append", default=[], help="tags, when not read from --config")
    prepare.add_argument("--run-id", required=True)
    prepare.add_argument("--sweep", help="comma list of workflow parameters JUBE exported ($jube_wp_envlist)")
    prepare.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                         help="workflow parameter (empty values mean: profile or driver default)")
    prepare.add_argument("--out", default="job.env")
    submit = sub.add_parser("submit", help="run the job script locally or sbatch it")
    submit.add_argument("--settings", required=True)
    submit.add_argument("--wait", action="store_true", help="return only after the job finished")
    verdict = sub.add_parser("verdict", help="fail for a sweep point that validate refused")
    verdict.add_argument("--settings", required=True)
    summary = sub.add_parser("summary", help="count the sweep points validate refused")
    summary.add_argument("--rundir", required=True)
    compare = sub.add_parser("compare", help="slowdown and saving of every point against its default-setting row")
    compare.add_argument("--rundir", required=True)
    recommend = sub.add_parser("recommend", help="the cheapest setting meeting a target, re-measured on one node")
    recommend.add_argument("--rundir", required=True)
    recommend.add_argument("--target", default="", help="joulebench recommend's target options (empty: skip)")
    recommend.add_argument("--repeats", default="", metavar="N",
                           help="re-runs of the default and the recommended setting each (2-100; empty: the one "
                           "`jube run` had, else 2)")
    show = sub.add_parser("show", help="print a system's resolved profile")
    show.add_argument("system")
    args = parser.parse_args(argv)
    handler = {"prepare": cmd_prepare, "submit": jbsubmit.cmd_submit, "verdict": jbsubmit.cmd_verdict,
               "summary": jbsubmit.cmd_summary, "compare": cmd_compare, "recommend": jbrecommend.cmd_recommend,
               "show": cmd_show}[args.command]
    try:
        return handler(args)
    except ConfigError as exc:
        print(f"jbprofile: error: {exc}", file=sys.stderr)
        return EX_USAGE


if __name__ == "__main__":
    sys.exit(main())
