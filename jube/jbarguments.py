"""The driver options of a sweep point, one builder per workflow (jbworkloads.py names which).

Each builder maps the point's workflow parameters, the system profile and the tags to the driver's options
(name -> text; empty: the driver's default). The inference workflow has two modes, chosen per point by `rate`:
empty is a static-batch point (`llm_inference run`), a rate or `max` a serving point (`llm_inference load`: open-loop
arrivals, continuous batching); each mode's own parameters are not driver options in the other and read `-` in the
table. The dimensions passed as they are come from the core's table (joulebench.sweep_settings). Standard library
and that table only (Python >= 3.10): the login node's validate step runs this.
"""

from __future__ import annotations

import jbsettings  # noqa: F401  (puts the repository root on sys.path, for the core's table below)
from jbchecks import devices_per_node
from jbshell import SERVER_SETTINGS
from jbsystems import FRAMEWORK_TAGS, PointRefused, override_variable

from joulebench.sweep_settings import passed_as_given

STATIC_ONLY = ("batch_size", "objective")  # objective: how the static engine chooses its decode variant
STATIC_ENGINES = ("static", "hf")  # engine of a static-batch point; a serving point's: continuous or a server
SERVING_ONLY = ("rate", "max_concurrency", "admit_divisor", "slo_ttft_ms", "slo_tpot_ms")
ENGINE_ONLY = ("admit_divisor",)  # the in-process engine's scheduling: a server schedules its own requests


def runs_a_server(value: dict[str, str]) -> bool:
    """A serving point whose engine is a server of the profile, not the in-process engine."""
    return value.get("engine", "") not in ("", "continuous")


def as_given(driver: str, value: dict[str, str], other_mode: tuple[str, ...] = ()) -> dict[str, str]:
    """The sweep dimensions a point passes to the driver as they are, empty for the driver's default (the core's
    table, joulebench.sweep_settings, names them: a new one needs no line here), but those of the point's other
    mode."""
    return {key: value.get(key, "") for key in passed_as_given(driver) if key not in other_mode}


def common_arguments(profile: dict[str, str], value: dict[str, str]) -> dict[str, str]:
    """Options every driver takes."""
    return {
        "precision": value.get("precision") or profile["precision"],
        "steady_seconds": value.get("steady_seconds") or profile["steady_seconds"],
        "device": profile["driver_device"],
    }


def iteration_arguments(profile: dict[str, str], value: dict[str, str], prefix: str) -> dict[str, str]:
    """The training drivers' iteration counts (profile keys <prefix>_iterations, <prefix>_warmup_iterations)."""
    return {
        "iterations": value.get("iterations") or profile[f"{prefix}_iterations"],
        "warmup_iterations": value.get("warmup_iterations") or profile[f"{prefix}_warmup_iterations"],
        "log_interval": profile["log_interval"],
    }


def one_node_layout(profile: dict[str, str], model: str, nodes: int) -> dict[str, str]:
    """A point on one node takes the model's one-node layout (tp_/pp_<MODEL>_one_node) over its cluster layout:
    13B's TP 2 x PP 2 is written for 44 nodes, where data parallelism shards the optimizer; on one node there is none
    (docs/jube.md, "GPT-13B on one node")."""
    if nodes != 1:
        return {}
    key = model.lower()
    return {f"{kind}_{key}": profile[f"{kind}_{key}_one_node"] for kind in ("tp", "pp")
            if profile.get(f"{kind}_{key}_one_node")}


def llm_arguments(profile: dict[str, str], value: dict[str, str], model: str, flags: list[str],
                  prefix: str) -> dict[str, str]:
    """llm_training: the model preset, its layout and batch from the profile's per-model keys."""
    key = model.lower()
    return {
        "model": model,
        "tensor_parallel": value.get("tensor_parallel") or profile.get(f"tp_{key}", ""),
        "pipeline_parallel": value.get("pipeline_parallel") or profile.get(f"pp_{key}", ""),
        "global_batch_size": value.get("global_batch_size") or profile.get(f"gbs_{key}", ""),
        "data_path": "" if "synthetic" in flags else profile["llm_data_path"],
        **common_arguments(profile, value), **iteration_arguments(profile, value, prefix),
        **as_given("llm_training", value),
    }


def resnet_arguments(profile: dict[str, str], value: dict[str, str], model: str, flags: list[str],
                     prefix: str) -> dict[str, str]:
    """resnet50: the framework (a sweep dimension), batch, image size and data directory."""
    framework = value.get("framework", "pytorch")
    if framework not in FRAMEWORK_TAGS:
        raise PointRefused(f"framework={framework!r}", f"use one of {', '.join(FRAMEWORK_TAGS)}")
    if value.get("compile_mode") and framework != "pytorch":
        raise PointRefused(f"compile_mode={value['compile_mode']} with framework={framework}: the compile mode is "
                           "torch.compile's (TensorFlow compiles with XLA)", "sweep compile_mode with --tag pytorch")
    return {
        "framework": framework,
        "global_batch_size": value.get("global_batch_size") or profile["resnet_gbs"],
        "image_size": value.get("image_size") or profile["resnet_image_size"],
        "data": "synthetic" if "synthetic" in flags or not profile["resnet_data_dir"] else profile["resnet_data_dir"],
        **common_arguments(profile, value), **iteration_arguments(profile, value, prefix),
        **as_given("resnet50", value),
    }


def inference_arguments(profile: dict[str, str], value: dict[str, str], model: str, flags: list[str],
                        prefix: str) -> dict[str, str]:
    """llm_inference: a serving point (rate set) or a static-batch point, on tensor_parallel GPUs of one node."""
    shared = {"preset": model, "task": value.get("task") or profile[f"{prefix}_task"],
              "tensor_parallel": inference_ranks(profile, value)}
    window = window_argument(profile, value, prefix)
    if value.get("rate"):
        arguments = {**shared, "rate": value["rate"],
                     "max_concurrency": value.get("max_concurrency") or profile[f"{prefix}_max_concurrency"],
                     "slo_ttft_ms": value.get("slo_ttft_ms") or profile[f"{prefix}_slo_ttft_ms"],
                     "slo_tpot_ms": value.get("slo_tpot_ms") or profile[f"{prefix}_slo_tpot_ms"],
                     **window, **common_arguments(profile, value), **server_arguments(profile, value.get("engine", "")),
                     # load's engine: server_arguments; a server takes none of the engine's own options
                     **as_given("llm_inference", value,
                                (*STATIC_ONLY, "engine", *(ENGINE_ONLY if runs_a_server(value) else ())))}
    else:
        arguments = {**shared, "batch_size": value.get("batch_size") or profile[f"{prefix}_batch_size"], **window,
                     **common_arguments(profile, value), **as_given("llm_inference", value, SERVING_ONLY)}
    return {**arguments, **window}  # the window's steady_seconds over common_arguments', in the same place


def inference_ranks(profile: dict[str, str], value: dict[str, str]) -> str:
    """A point's tensor_parallel ("" = 1): refused where it does not divide the node's devices (the ranks fill the
    node's GPUs in equal groups; the local launcher's one rank per node is jbchecks.check_local_layout's refusal, the
    heads' divisibility the driver's validate step's)."""
    text = value.get("tensor_parallel", "")
    ranks, per_node = int(text or "1"), devices_per_node(profile, {}, 1)  # the node's GPUs ("all" counted)
    if per_node % ranks:
        raise PointRefused(f"tensor_parallel={ranks} does not divide the {per_node} devices of a {profile['system']} "
                           "node", "use a tensor_parallel that divides devices_per_node")
    return text


def window_argument(profile: dict[str, str], value: dict[str, str], prefix: str) -> dict[str, str]:
    """llm_inference's --min-window-s is another name of --steady-seconds (the driver refuses both together): one
    of them is sent. A point's own value wins over the profile's; a point giving both is refused. From the profile,
    <prefix>_min_window_s (the inference workflow's own key) wins over steady_seconds (every driver's)."""
    given = [key for key in ("steady_seconds", "min_window_s") if value.get(key)]
    if len(given) == 2:
        raise PointRefused(f"steady_seconds={value['steady_seconds']} and min_window_s={value['min_window_s']}: both "
                           "set the length of the measured windows", "set one of them (min_window_s or "
                                                                     "steady_seconds) for the point, not both")
    if given:
        return {"steady_seconds": "", "min_window_s": "", given[0]: value[given[0]]}
    own = profile[f"{prefix}_min_window_s"]
    return {"steady_seconds": "" if own else profile["steady_seconds"], "min_window_s": own}


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


def serving_mode(settings: dict[str, str], value: dict[str, str], serving: bool) -> str:
    """Mark the other mode's parameters `-` in the point's coordinates; the engine of a serving point, and whether
    it is a server; which explicit values the point's mode ignores (the note)."""
    other = STATIC_ONLY if serving else SERVING_ONLY
    server = serving and runs_a_server(value)
    settings.update({f"JB_COORD_{key.upper()}": "-" for key in (*other, *(ENGINE_ONLY if server else ()))})
    if serving:
        settings["JB_COORD_ENGINE"] = value.get("engine") or "continuous"
        settings["JB_SERVER"] = "yes" if server else ""
    ignored = [f"{key}={value[key]}" for key in other if value.get(key) and key != "engine"]
    mode = "a serving point (rate set)" if serving else "a static-batch point (rate empty)"
    notes = [f"{', '.join(ignored)} ignored: {mode}"] if ignored else []
    by_server = [f"{key}={value[key]}" for key in ENGINE_ONLY if server and value.get(key)]
    if by_server:
        notes.append(f"{', '.join(by_server)} ignored: the in-process engine's option, and {value['engine']} is a "
                     "server")
    return "; ".join(notes)


def cli_args(values: dict[str, str]) -> list[str]:
    """Options as a command line; an empty value is left out (the driver's default)."""
    args: list[str] = []
    for key, val in values.items():
        if val != "":
            args += [f"--{key.replace('_', '-')}", str(val)]
    return args
