#!/usr/bin/env python3
"""Login-node side of the JUBE workflows: resolve tags and the system profile, validate, submit.

    jbprofile.py prepare --benchmark llm --config RUNDIR/configuration.xml --run-id ID [--sweep NAMES] [--set K=V]
    jbprofile.py submit --settings validate/job.env [--wait]
    jbprofile.py verdict --settings validate/job.env   # exit 64 for a sweep point that validate refused
    jbprofile.py summary --rundir RUNDIR               # how many sweep points validate refused
    jbprofile.py compare --rundir RUNDIR               # each row against its sweep's default-setting row
    jbprofile.py show SYSTEM                           # the resolved profile, after environment overrides

Why a script and not JUBE parameters: JUBE ignores unknown tags and lets the last of two system
tags win silently (and Debian's JUBE 2.5.1 has no <check_tags>), so the tags JUBE recorded in the
run's configuration.xml are checked here, and every site/vendor value comes from one data file
(systems.ini) instead of tag-conditional parameters spread over the XML. Runs on the login node's
`python3` (standard library only, Python >= 3.8); the drivers run with the profile's Python.

Two kinds of refusal. A mistake of the whole workflow (a tag, a profile key, a system that cannot run the
driver) stops the validate step (exit 64, "<problem>. Fix: <fix>"): nothing is submitted. A sweep point that
cannot run (its values, the partition's limits, its time limit, a duplicate) becomes a row with status INVALID
and the reason; the other points run, and the `verdict` step fails afterwards so that `jube run -e` and
`jube status` say that points were refused.
"""

from __future__ import annotations

import argparse
import hashlib
import math
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
import jbslurm
import jbsubmit
from jbsettings import SETUP_FAILED, job_python, read_settings, write_settings
from jbshell import SERVER_SETTINGS, check_command_values
from jbsystems import (
    FLAG_TAGS,
    FRAMEWORK_TAGS,
    INFERENCE_MODEL_TAGS,
    MODEL_TAGS,
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

EX_USAGE = 64
EX_CANTCREAT = 73  # the settings file (--out) cannot be written
ARGPARSE_USAGE = 2  # argparse's exit code for an option the driver does not know or a value it cannot parse
CANNOT_EXECUTE = (126, 127)  # a shell's exit code for a program that is not executable or not found

BENCHMARKS = {"llm": "llm_training", "resnet50": "resnet50", "inference": "llm_inference"}
MODEL_TAGS_OF = {"llm": MODEL_TAGS, "inference": INFERENCE_MODEL_TAGS}
DEFAULT_SYSTEM = "local"
# The workflow parameters (JUBE's `sweep` parameterset) each benchmark takes; a comma list is a sweep.
# power_limit (W) and sm_clock (MHz) are device settings, not driver options: the job applies them (docs/sweeps.md).
DEVICE_SETTING_KEYS = ("power_limit", "sm_clock")
SWEEP_KEYS = {
    "llm": ("nodes", "global_batch_size", "micro_batch_size", "tensor_parallel", "pipeline_parallel", "seq_length",
            "precision", "iterations", "warmup_iterations", "steady_seconds", *DEVICE_SETTING_KEYS),
    "resnet50": ("framework", "nodes", "global_batch_size", "image_size", "precision", "iterations",
                 "warmup_iterations", "steady_seconds", *DEVICE_SETTING_KEYS),
    "inference": ("task", "batch_size", "engine", "rate", "max_concurrency", "slo_ttft_ms", "slo_tpot_ms",
                  "min_window_s", "precision", "steady_seconds", *DEVICE_SETTING_KEYS),
}
# The inference workflow's two modes: `rate` empty is a static-batch point (`llm_inference run`), a rate or `max` a
# serving point (`llm_inference load`: open-loop arrivals, continuous batching). Each mode's own parameters; the
# other mode's are not driver options there and read `-` in the table.
STATIC_ONLY = ("batch_size",)
STATIC_ENGINES = ("static", "hf")  # engine of a static-batch point; a serving point's: continuous or a server
SERVING_ONLY = ("rate", "max_concurrency", "slo_ttft_ms", "slo_tpot_ms")
DEVICE_SETTINGS_POLICIES = ("off", "allowed")
EX_REFUSED = 77  # python -m joulebench.device_settings: the site or this process may not change the setting
# Valid numbers of the workflow parameters and profile keys the driver arguments come from:
# (kind, minimum, whether the minimum itself is allowed).
NUMBERS = {
    "nodes": (int, 1, True), "devices_per_node": (int, 1, True), "cpu_threads_per_node": (int, 0, True),
    "global_batch_size": (int, 1, True), "micro_batch_size": (int, 1, True), "tensor_parallel": (int, 1, True),
    "pipeline_parallel": (int, 1, True), "seq_length": (int, 1, True), "iterations": (int, 1, True),
    "warmup_iterations": (int, 0, True), "image_size": (int, 1, True), "batch_size": (int, 1, True),
    "log_interval": (int, 1, True), "steady_seconds": (float, 0.0, False), "min_window_s": (float, 0.0, False),
    "min_steady_s": (float, 0.0, True), "startup_s": (float, 0.0, True), "power_limit": (float, 0.0, False),
    "sm_clock": (int, 1, True), "max_concurrency": (int, 1, True), "slo_ttft_ms": (float, 0.0, False),
    "slo_tpot_ms": (float, 0.0, False),
}
STOP_MARGIN = (0.10, 10, 300)  # the job stops its run this share of the time limit early, within [10 s, 5 min]
TIGHT = 1.5  # a stop budget below this many times start-up + minimum steady window is worth a warning


# ---------------------------------------------------------------------------------------------------
# Names and numbers


def number(value: str, what: str, key: str) -> int | float:
    """`value` as the kind of number `key` takes, refusing NaN, infinity and values below its minimum."""
    kind, minimum, inclusive = NUMBERS[key]
    wanted = f"a {'whole ' if kind is int else 'finite '}number {'>=' if inclusive else '>'} {minimum}"
    try:
        parsed = kind(value)
    except ValueError:
        raise PointRefused(f"{what}={value!r} is not a number", f"set {what} to {wanted}") from None
    if not math.isfinite(parsed) or parsed < minimum or (parsed == minimum and not inclusive):
        raise PointRefused(f"{what}={value} is out of range", f"set {what} to {wanted}")
    return parsed


def check_local_layout(nodes: int, per_node: int, profile: dict[str, str]) -> None:
    """`local` runs one rank per node identity on this host (several identities: issue 21), each on its own GPU."""
    if per_node != 1:
        raise PointRefused(f"the local system runs one rank per node identity, not {per_node} devices per node",
                           "set devices_per_node = 1 for local, and nodes = N for N node identities on this host")
    gpus = profile.get("local_gpus")
    if profile["vendor"] != "cpu" and gpus is not None and nodes > int(gpus):
        raise PointRefused(f"the local system has {gpus} GPU(s), the point asks for {nodes} node identities of one GPU"
                           " each", f"use nodes <= {gpus} on this machine")


def local_node_devices(profile: dict[str, str]) -> str:
    value = profile["local_node_devices"].strip().lower()
    if value not in ("own", "all"):
        raise ConfigError(f"profile key local_node_devices = {value!r} is neither own nor all",
                          "set local_node_devices = own (each node identity's sampler meters its GPU) or all")
    return value


def device_settings_policy(profile: dict[str, str]) -> str:
    """The site's opt-in for power-limit and clock sweeps; a typo must not mean either."""
    value = profile["device_settings"].strip().lower()
    if value not in DEVICE_SETTINGS_POLICIES:
        raise ConfigError(f"profile key device_settings = {value!r} is neither off nor allowed",
                          "set device_settings = off (the default) or, where the admins allow sweeps, allowed "
                          "(docs/sweeps.md)")
    return value


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


def check_site_names(profile: dict[str, str]) -> None:
    """`partition` and `account` are one Slurm name each (sbatch --partition=NAME); whitespace is a typo."""
    for key in ("partition", "account"):
        if len(profile[key].split()) > 1:
            raise ConfigError(f"profile key {key} = {profile[key]!r} is not one Slurm name",
                              f"set {key} to one name, or a comma list without spaces for partitions "
                              f"({override_variable(profile['system'], key)})")


def yes_or_no(value: str, key: str) -> str:
    """A profile switch: yes or no, nothing else (a typo must not silently mean either)."""
    if value.strip().lower() not in ("yes", "no"):
        raise ConfigError(f"profile key {key} = {value!r} is neither yes nor no", f"set {key} = yes or {key} = no")
    return value.strip().lower()


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
# Time limits


def stop_margin_s(limit_s: int) -> int:
    """How long before its time limit a job stops its run, leaving time for the samplers and the record."""
    share, low, high = STOP_MARGIN
    return int(min(high, max(low, share * limit_s)))


def limit_for_budget(budget_s: float) -> int:
    """The shortest time limit whose stop budget (limit minus margin) is at least `budget_s`, in whole minutes."""
    share, low, high = STOP_MARGIN
    limit = max(budget_s + low, min(budget_s / (1 - share), budget_s + high))
    return int(math.ceil(limit / 60.0) * 60)


def check_time_limit(limit_s: int, startup_s: float, steady_s: float, what: str, system: str) -> str:
    """Refuse a limit that cannot hold start-up, warm-up and the minimum steady window; a warning when tight."""
    margin = stop_margin_s(limit_s)
    budget, needed = limit_s - margin, startup_s + steady_s
    detail = (f"time limit {jbslurm.hms(limit_s)} leaves {budget} s before the job stops its run ({margin} s are "
              f"kept for the record), for about {startup_s:g} s of start-up and warm-up of {what} and a {steady_s:g} s "
              "minimum steady window")
    if budget < needed:
        raise PointRefused(detail, f"set time_limit to at least {jbslurm.hms(limit_for_budget(needed))} "
                                   f"({override_variable(system, 'time_limit')}), or shorten the run (steady_seconds)")
    if budget < TIGHT * needed:
        return f"tight time limit: {detail}; it may stop before the steady window is long enough"
    return ""


# ---------------------------------------------------------------------------------------------------
# Settings


def base_settings(benchmark: str, kinds: dict[str, list[str]], profile: dict[str, str], run_id: str,
                  sweep: dict[str, str]) -> dict[str, str]:
    """What every row needs, also an INVALID one: who runs it, where, and the sweep point as given."""
    system = profile["system"]
    default_model = profile["inference_preset"] if benchmark == "inference" else profile["default_model"]
    model = kinds["model"][0] if kinds["model"] else default_model
    if benchmark == "resnet50":
        model = f"resnet50-{sweep.get('framework') or 'pytorch'}"
    settings = {
        "JB_STATUS": "OK", "JB_REASON": "", "JB_BENCHMARK": benchmark, "JB_DRIVER": BENCHMARKS[benchmark],
        "JB_SYSTEM": system, "JB_MODEL": model, "JB_LAUNCHER": profile["launcher"], "JB_RUN_ID": run_id,
        "JB_PYTHON": resolve_python(profile), "JB_SETUP": profile["setup"], "JB_CONTAINER": profile["container"],
        "JB_REPO": str(REPO), "JB_NOTE": profile["selection"], "JB_SWEEP": ",".join(SWEEP_KEYS[benchmark]),
        "JB_PARTITION": profile["partition"], "JB_ACCOUNT": profile["account"],
    }
    settings.update({f"JB_COORD_{key.upper()}": sweep.get(key, "") for key in SWEEP_KEYS[benchmark]})
    return settings


def build_settings(benchmark: str, tags: list[str], overrides: dict[str, str], run_id: str,
                   environ: dict[str, str] | None = None) -> dict[str, str]:
    """Everything the job needs, as JB_* variables. Raises ConfigError for a mistake of the whole workflow,
    PointRefused (with `.settings`, the row's coordinates) for a sweep point that cannot run."""
    env = dict(os.environ if environ is None else environ)
    unknown = sorted(set(overrides) - set(SWEEP_KEYS[benchmark]))
    if unknown:
        raise ConfigError(f"unknown workflow parameter '{unknown[0]}' for the {benchmark} workflow"
                          f"{closest(unknown[0], set(SWEEP_KEYS[benchmark]))}",
                          f"use one of {', '.join(SWEEP_KEYS[benchmark])}")
    check_name(run_id, "run id")
    kinds = classify_tags(benchmark, tags, system_names(env))
    profile = load_profile(kinds["system"][0] if kinds["system"] else DEFAULT_SYSTEM, env)
    system = profile["system"]
    if profile["unsupported"]:
        raise ConfigError(f"system {system} cannot run the {BENCHMARKS[benchmark]} driver: {profile['unsupported']}",
                          "pick a GPU or CPU system tag")
    if profile["launcher"] not in ("slurm", "local"):
        raise ConfigError(f"launcher={profile['launcher']!r} for system {system}", "set launcher to slurm or local")
    if profile["launcher"] == "slurm" and not shutil.which("sbatch", path=env.get("PATH", os.defpath)):
        raise ConfigError(f"system {system} submits with Slurm, but sbatch is not on PATH",
                          "run on the cluster's login node, or use the local system (no system tag)")
    profile.update(check_command_values(profile, env))  # before anything runs one of them (validate, submit, job)
    check_site_names(profile)
    value = {k: v.strip() for k, v in overrides.items() if v.strip() != ""}
    settings = base_settings(benchmark, kinds, profile, run_id, value)
    settings.update(jbfootprint.site_footprint(profile).settings())  # a bad CSV is the site's: stops validate
    try:
        point_settings(settings, benchmark, kinds, profile, value)
    except PointRefused as exc:
        exc.settings = settings  # type: ignore[attr-defined]
        raise
    if "container" in kinds["flag"]:
        settings.update(container_settings(profile, value.get("framework", "pytorch"), env))
    return settings


def point_settings(settings: dict[str, str], benchmark: str, kinds: dict[str, list[str]], profile: dict[str, str],
                   value: dict[str, str]) -> None:
    """The sweep point's own settings and driver arguments, into `settings`; PointRefused when it cannot run."""
    for key, text in value.items():
        if key in NUMBERS:
            number(text, key, key)
    model = settings["JB_MODEL"]
    per_node = int(number(profile["devices_per_node"], "devices_per_node", "devices_per_node"))
    sized_like = model if benchmark == "llm" else profile["default_model"]  # ResNet-50: the default model's nodes
    nodes_text = value.get("nodes") or profile["nodes"] or profile.get(f"nodes_{sized_like.lower()}", "1")
    nodes = int(number(nodes_text, "nodes", "nodes"))
    if benchmark == "inference":  # one process on one device per job; sweep points are separate jobs
        nodes, per_node = 1, 1
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
        "JB_ALLOW_PARTIAL": yes_or_no(profile["allow_partial"], "allow_partial"),
        "JB_DEVICE_SETTINGS": device_settings_policy(profile), "JB_ZEUSD_SOCKET": profile["zeusd_socket"],
        "JB_POWER_LIMIT": value.get("power_limit", ""), "JB_SM_CLOCK": value.get("sm_clock", ""),
        "JB_DRIVER_COMMAND": inference_command(value) if benchmark == "inference" else "train",
        "JB_SELF_STOP": "no" if benchmark == "inference" else "yes",  # --exit-duration-mins, set by job.sh
    })
    args = driver_arguments(benchmark, kinds, profile, value, model)
    for key, text in args.items():
        if key in NUMBERS and text != "":
            number(text, key, key)
    settings.update({f"JB_COORD_{key.upper()}": str(nodes) if key == "nodes" else args.get(key, value.get(key, ""))
                     for key in SWEEP_KEYS[benchmark]})
    if benchmark == "inference":
        settings["JB_NOTE"] = "; ".join(n for n in (settings["JB_NOTE"], inference_mode(settings, value)) if n)
    startup_key = {"llm": f"startup_s_{model.lower()}", "resnet50": "resnet_startup_s",
                   "inference": "inference_startup_s"}[benchmark]
    startup = number(profile[startup_key], startup_key, "startup_s")
    steady_key = next((key for key in ("steady_seconds", "min_window_s") if args.get(key)), "min_steady_s")
    steady = number(args.get(steady_key) or profile["min_steady_s"], steady_key, "min_steady_s")
    warning = check_time_limit(limit_s, startup, steady, f"{model} on {profile['system']}", profile["system"])
    settings["JB_NOTE"] = "; ".join(n for n in (settings["JB_NOTE"], warning) if n)
    shared = _cli_args(args)
    settings["JB_VALIDATE_ARGS"] = shlex.join(shared if benchmark == "inference" else [
        *shared, "--world-size", str(nodes * per_node), "--nodes", str(nodes), "--devices-per-node", str(per_node)])
    settings["JB_TRAIN_ARGS"] = shlex.join([*shared, "--run-id", settings["JB_RUN_ID"]])


def driver_arguments(benchmark: str, kinds: dict[str, list[str]], profile: dict[str, str], value: dict[str, str],
                     model: str) -> dict[str, str]:
    """The driver's options (name -> text, empty: the driver's default) from the point, the profile and the tags."""
    synthetic = "synthetic" in kinds["flag"]
    prefix = {"llm": "llm", "resnet50": "resnet", "inference": "inference"}[benchmark]
    common = {
        "precision": value.get("precision") or profile["precision"],
        "steady_seconds": value.get("steady_seconds") or profile["steady_seconds"],
        "device": profile["driver_device"],
    }
    if benchmark == "inference" and inference_command(value) == "load":
        return {"preset": model, "task": value.get("task") or profile["inference_task"], "rate": value["rate"],
                "max_concurrency": value.get("max_concurrency") or profile["inference_max_concurrency"],
                "slo_ttft_ms": value.get("slo_ttft_ms") or profile["inference_slo_ttft_ms"],
                "slo_tpot_ms": value.get("slo_tpot_ms") or profile["inference_slo_tpot_ms"],
                "min_window_s": value.get("min_window_s") or profile["inference_min_window_s"], **common,
                **server_arguments(profile, value.get("engine", ""))}
    if benchmark == "inference":
        return {"preset": model, "task": value.get("task") or profile["inference_task"],
                "batch_size": value.get("batch_size") or profile["inference_batch_size"],
                "engine": value.get("engine", ""),
                "min_window_s": value.get("min_window_s") or profile["inference_min_window_s"], **common}
    common.update({
        "iterations": value.get("iterations") or profile[f"{prefix}_iterations"],
        "warmup_iterations": value.get("warmup_iterations") or profile[f"{prefix}_warmup_iterations"],
        "log_interval": profile["log_interval"],
    })
    if benchmark == "llm":
        key = model.lower()
        return {
            "model": model,
            "tensor_parallel": value.get("tensor_parallel") or profile.get(f"tp_{key}", ""),
            "pipeline_parallel": value.get("pipeline_parallel") or profile.get(f"pp_{key}", ""),
            "micro_batch_size": value.get("micro_batch_size", ""),
            "global_batch_size": value.get("global_batch_size") or profile.get(f"gbs_{key}", ""),
            "seq_length": value.get("seq_length", ""),
            "data_path": "" if synthetic else profile["llm_data_path"],
            **common,
        }
    framework = value.get("framework", "pytorch")
    if framework not in FRAMEWORK_TAGS:
        raise PointRefused(f"framework={framework!r}", f"use one of {', '.join(FRAMEWORK_TAGS)}")
    return {
        "framework": framework, "global_batch_size": value.get("global_batch_size") or profile["resnet_gbs"],
        "image_size": value.get("image_size") or profile["resnet_image_size"],
        "data": "synthetic" if synthetic or not profile["resnet_data_dir"] else profile["resnet_data_dir"],
        **common,
    }


def server_arguments(profile: dict[str, str], engine: str) -> dict[str, str]:
    """A serving point's server: engine empty or `continuous` is the in-process engine (no server); any other name
    is the profile's `server_<engine>` template, started by the driver on the job's devices (docs/jube.md)."""
    if engine in ("", "continuous"):
        return {}
    key = f"server_{engine.lower()}"
    if engine in STATIC_ENGINES or not profile.get(key):
        known = sorted(k.removeprefix("server_") for k, v in profile.items()
                       if k.startswith("server_") and not k.startswith(SERVER_SETTINGS) and v)
        raise PointRefused(f"engine={engine} with rate set: serving points run the in-process engine (continuous) "
                           f"or a server named in the profile, and {profile['system']} has no {key}",
                           f"use engine=continuous or one of {', '.join(known) or '(none)'}, or add {key} = <command "
                           "template> to the profile (rate empty for a static-batch point)")
    if not profile["inference_checkpoint"]:
        raise PointRefused(f"engine={engine}: a server loads a checkpoint, and inference_checkpoint is empty",
                           "save one with `python -m llm_inference save-checkpoint --preset MODEL --out DIR` and set "
                           f"{override_variable(profile['system'], 'inference_checkpoint')}=DIR (or the profile key)")
    return {"checkpoint": profile["inference_checkpoint"], "server_command": profile[key],
            "server_version_command": profile.get(f"server_version_{engine.lower()}", ""), "engine_name": engine,
            "request_extra": profile.get(f"server_extra_{engine.lower()}", ""), "api": profile["server_api"],
            "server_ready_timeout": profile["server_ready_timeout_s"]}


def inference_command(value: dict[str, str]) -> str:
    """The inference point's driver command: `load` (serving) when it has a rate, else `run` (static batches)."""
    return "load" if value.get("rate") else "run"


def inference_mode(settings: dict[str, str], value: dict[str, str]) -> str:
    """Mark the other mode's parameters `-` in the point's coordinates; refuse an engine a serving point cannot use,
    and say which explicit values the point's mode ignores (the note)."""
    serving = settings["JB_DRIVER_COMMAND"] == "load"
    other = STATIC_ONLY if serving else SERVING_ONLY
    settings.update({f"JB_COORD_{key.upper()}": "-" for key in other})
    if serving:
        settings["JB_COORD_ENGINE"] = value.get("engine") or "continuous"
        settings["JB_SERVER"] = "" if settings["JB_COORD_ENGINE"] == "continuous" else "yes"
    ignored = [f"{key}={value[key]}" for key in other if value.get(key) and key != "engine"]
    mode = "a serving point (rate set)" if serving else "a static-batch point (rate empty)"
    return f"{', '.join(ignored)} ignored: {mode}" if ignored else ""


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
    run_module(settings, settings["JB_DRIVER"], [command, *shlex.split(settings["JB_VALIDATE_ARGS"])],
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
    for item in args.set:
        key, sep, val = item.partition("=")
        if not sep:
            raise ConfigError(f"--set {item!r} has no '='", "write --set KEY=VALUE")
        values[key] = val
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
        settings = {**getattr(exc, "settings", settings), "JB_STATUS": "INVALID", "JB_REASON": str(exc)}
        print(f"jbprofile: sweep point refused, nothing submitted for it: {exc}", file=sys.stderr)
    try:
        write_settings(Path(args.out), settings)
    except OSError as exc:
        print(f"jbprofile: error: cannot write --out {args.out} ({exc.strerror or exc}). Fix: pass a writable path",
              file=sys.stderr)
        return EX_CANTCREAT
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    """The compare step, once every point has its row: jbrecord.py compare with the profile's Python. Never fails
    the step (the rows exist already); a failure leaves the comparison n/a and says why on stderr."""
    points = sorted(Path(args.rundir).glob("*_submit/work/job.env"))
    if not points:
        print("jbprofile: compare: no submitted points")
        return 0
    settings = read_settings(points[0])
    rundir = str(Path(args.rundir).resolve())
    argv = job_python(settings, [str(REPO / "jube" / "jbrecord.py"), "compare", "--rundir", rundir])
    env = dict(os.environ)
    if bind_var := settings.get("JB_CONTAINER_BIND_VAR"):  # the image reads the points' records and writes compare/
        env[bind_var] = ",".join(filter(None, [env.get(bind_var), rundir]))
    code = subprocess.call(argv, env=env)
    if code != 0:
        print(f"jbprofile: warning: the comparison with the default rows failed (exit {code}); the rows say n/a",
              file=sys.stderr)
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    for key, value in sorted(load_profile(args.system).items()):
        print(f"{key} = {value}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="jbprofile.py", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    prepare = sub.add_parser("prepare", help="resolve tags + profile, check the point, write job.env")
    prepare.add_argument("--benchmark", choices=sorted(BENCHMARKS), required=True)
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
    show = sub.add_parser("show", help="print a system's resolved profile")
    show.add_argument("system")
    args = parser.parse_args(argv)
    handler = {"prepare": cmd_prepare, "submit": jbsubmit.cmd_submit, "verdict": jbsubmit.cmd_verdict,
               "summary": jbsubmit.cmd_summary, "compare": cmd_compare, "show": cmd_show}[args.command]
    try:
        return handler(args)
    except ConfigError as exc:
        print(f"jbprofile: error: {exc}", file=sys.stderr)
        return EX_USAGE


if __name__ == "__main__":
    sys.exit(main())
