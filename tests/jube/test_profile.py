"""The system profile, tag and input rules of jube/jbprofile.py (no JUBE, no Slurm needed)."""

from __future__ import annotations

import importlib.util
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.jube.conftest import JUBE_DIR

_spec = importlib.util.spec_from_file_location("jbprofile", JUBE_DIR / "jbprofile.py")
jbprofile = importlib.util.module_from_spec(_spec)
sys.modules["jbprofile"] = jbprofile
_spec.loader.exec_module(jbprofile)
jbslurm = sys.modules["jbslurm"]  # loaded by jbprofile from the same directory
jbchecks = sys.modules["jbchecks"]
jbworkloads = sys.modules["jbworkloads"]

ISSUE_SYSTEMS = ("A100", "H100", "WAIH100", "GH200", "JEDI", "MI250", "GC200", "H200", "MI300X", "local", "CI")
CLEAN_ENV = {"PATH": "/usr/bin:/bin"}  # no nvidia-smi or rocm-smi here: `local` resolves to its CPU settings


def test_every_system_of_the_issue_has_a_complete_profile() -> None:
    names = jbprofile.system_names(CLEAN_ENV)
    assert set(ISSUE_SYSTEMS) <= set(names) and "local.cpu" not in names  # an overlay is not a system
    for name in names:
        profile = jbprofile.load_profile(name, CLEAN_ENV)
        assert profile["vendor"] in ("nvidia", "amd", "graphcore", "cpu"), name
        assert int(profile["devices_per_node"]) >= 1, name
        assert profile["default_model"] in jbprofile.WORKLOADS["llm"].model_tags, name
        assert jbslurm.duration_s(profile["time_limit"]) > 0, name


def test_environment_overrides_every_system_then_one_system() -> None:
    env = {**CLEAN_ENV, "JOULEBENCH_PARTITION": "everywhere", "JOULEBENCH_A100_PARTITION": "only-a100",
           "joulebench_account": "lower-case-name", "JOULEBENCH_NOT_A_KEY": "ignored"}
    assert jbprofile.load_profile("A100", env)["partition"] == "only-a100"
    assert jbprofile.load_profile("H100", env)["partition"] == "everywhere"
    assert jbprofile.load_profile("h100", env)["account"] == "lower-case-name"
    assert "not_a_key" not in jbprofile.load_profile("h100", env)  # other variables are no profile keys
    assert jbprofile.load_profile("jedi", CLEAN_ENV)["system"] == "JEDI"  # case-insensitive (CARAML's Jedi bug)


def test_extra_profile_file_adds_a_system(tmp_path: Path) -> None:
    extra = tmp_path / "site.ini"
    extra.write_text("[MYSITE]\npartition = gpu\ndevices_per_node = 2\n")
    env = {**CLEAN_ENV, "JOULEBENCH_PROFILE": str(extra)}
    profile = jbprofile.load_profile("MYSITE", env)
    assert (profile["partition"], profile["devices_per_node"], profile["vendor"]) == ("gpu", "2", "nvidia")


@pytest.mark.parametrize(("text", "message"), [
    ("[MYSITE]\npartiton = gpu\n", "unknown key 'partiton' in \\[MYSITE\\] of .* \\(did you mean 'partition'\\?\\)"),
    ("[DEFAULT]\ndevices_per_nod = 2\n", "unknown key 'devices_per_nod' in \\[DEFAULT\\]"),
    ("[tiny]\npartition = gpu\n", "section \\[tiny\\] .* has the name of a model, framework or flag tag"),
    ("[Llama-8b]\npartition = gpu\n", "section \\[Llama-8b\\] .* has the name of a model"),
    ("[MYSITE.gpu]\npartition = gpu\n", "only \\[<system>.cpu\\] overlays exist"),
    ("[my/site]\npartition = gpu\n", "cannot be used as a file or job name"),
    ("[..]\npartition = gpu\n", "cannot be used as a file or job name"),
    ("partition = gpu\n", "not a valid profile file"),
])
def test_profile_files_with_unknown_keys_or_ambiguous_sections_are_refused(tmp_path: Path, text: str,
                                                                           message: str) -> None:
    extra = tmp_path / "site.ini"
    extra.write_text(text)
    with pytest.raises(jbprofile.ConfigError, match=f"{message}.*Fix: "):
        jbprofile.system_names({**CLEAN_ENV, "JOULEBENCH_PROFILE": str(extra)})


def test_unknown_workflow_parameters_are_refused_with_the_closest_name() -> None:
    with pytest.raises(jbprofile.ConfigError, match=r"unknown workflow parameter 'global_batchsize' .*did you mean "
                                                    r"'global_batch_size'.*Fix: use one of nodes, "):
        jbprofile.build_settings("llm", ["CI", "tiny"], {"global_batchsize": "8"}, "run", CLEAN_ENV)
    with pytest.raises(jbprofile.ConfigError, match="unknown workflow parameter 'image_size' for the llm workflow"):
        jbprofile.build_settings("llm", [], {"image_size": "64"}, "run", CLEAN_ENV)


@pytest.mark.parametrize("run_id", ["a/b", "..", "x..y", "", "has space"])
def test_run_ids_that_cannot_be_file_names_are_refused(run_id: str) -> None:
    with pytest.raises(jbprofile.ConfigError, match=r"run id .* cannot be used as a file or job name"):
        jbprofile.build_settings("llm", [], {}, run_id, CLEAN_ENV)


@pytest.mark.parametrize(("key", "value"), [
    ("global_batch_size", "nan"), ("global_batch_size", "0"), ("global_batch_size", "-1"), ("global_batch_size", "x"),
    ("nodes", "inf"), ("nodes", "0"), ("iterations", "1e3"), ("warmup_iterations", "-1"), ("seq_length", "nan"),
    ("steady_seconds", "nan"), ("steady_seconds", "inf"), ("steady_seconds", "0"), ("steady_seconds", "-5"),
])
def test_numbers_out_of_range_nan_and_infinity_refuse_the_point(key: str, value: str) -> None:
    with pytest.raises(jbprofile.PointRefused, match=f"{key}='?{re.escape(value)}'? is (not a number|out of range)"
                                                     ".*Fix: set "):
        jbprofile.build_settings("llm", [], {key: value}, "run", CLEAN_ENV)


def test_allow_partial_is_a_yes_or_no_switch() -> None:
    assert jbprofile.build_settings("llm", [], {}, "r", CLEAN_ENV)["JB_ALLOW_PARTIAL"] == "no"
    assert jbprofile.build_settings("llm", [], {}, "r", {**CLEAN_ENV, "JOULEBENCH_ALLOW_PARTIAL": "yes"}
                                    )["JB_ALLOW_PARTIAL"] == "yes"
    with pytest.raises(jbprofile.ConfigError, match="allow_partial = 'maybe' is neither yes nor no"):
        jbprofile.build_settings("llm", [], {}, "r", {**CLEAN_ENV, "JOULEBENCH_ALLOW_PARTIAL": "maybe"})


def test_device_settings_policy_and_values_are_checked() -> None:
    """Off by default everywhere; a typo stops the workflow; a setting's value is a point's number."""
    for name in jbprofile.system_names(CLEAN_ENV):
        assert jbprofile.load_profile(name, CLEAN_ENV)["device_settings"] == "off", name
    settings = jbprofile.build_settings("llm", ["CI"], {"power_limit": "300", "sm_clock": ""}, "r",
                                        {**CLEAN_ENV, "JOULEBENCH_LAUNCHER": "local"})
    assert (settings["JB_POWER_LIMIT"], settings["JB_SM_CLOCK"], settings["JB_DEVICE_SETTINGS"]) == ("300", "", "off")
    assert (settings["JB_COORD_POWER_LIMIT"], settings["JB_COORD_SM_CLOCK"]) == ("300", "")
    with pytest.raises(jbprofile.ConfigError, match="device_settings = 'on' is neither off nor allowed"):
        jbprofile.build_settings("llm", [], {}, "r", {**CLEAN_ENV, "JOULEBENCH_DEVICE_SETTINGS": "on"})
    for key, value in (("power_limit", "0"), ("power_limit", "nan"), ("sm_clock", "1410.5"), ("sm_clock", "-1")):
        with pytest.raises(jbprofile.PointRefused, match=f"{key}="):
            jbprofile.build_settings("llm", [], {key: value}, "r", CLEAN_ENV)


def test_the_inference_engine_is_a_sweep_parameter() -> None:
    """`hf` reaches the driver; empty leaves the driver's default engine (static), which its record names."""
    hf = jbprofile.build_settings("inference", [], {"engine": "hf"}, "r", CLEAN_ENV)
    assert "--engine hf" in hf["JB_TRAIN_ARGS"] and hf["JB_COORD_ENGINE"] == "hf"
    default = jbprofile.build_settings("inference", [], {"engine": ""}, "r", CLEAN_ENV)
    assert "--engine" not in default["JB_TRAIN_ARGS"] and default["JB_COORD_ENGINE"] == ""


def test_valid_edge_values_pass() -> None:
    settings = jbprofile.build_settings("llm", [], {"warmup_iterations": "0", "steady_seconds": "0.5"}, "r",
                                        CLEAN_ENV)
    args = shlex.split(settings["JB_TRAIN_ARGS"])
    assert args[args.index("--warmup-iterations") + 1] == "0" and args[args.index("--steady-seconds") + 1] == "0.5"


@pytest.mark.parametrize(
    ("tags", "message"),
    [
        (["A100", "H100"], "2 system tags given (A100, H100)"),
        (["CI", "tiny", "800M"], "2 model tags given"),
        (["A1000"], "unknown tag 'A1000'"),
        (["pytorch"], "unknown tag 'pytorch' for the llm workflow"),
    ],
)
def test_bad_tag_combinations_are_errors(tags: list[str], message: str) -> None:
    with pytest.raises(jbprofile.ConfigError, match="Fix:") as err:
        jbprofile.build_settings("llm", tags, {}, "run", CLEAN_ENV)
    assert message in str(err.value) and not isinstance(err.value, jbprofile.PointRefused)


def test_gc200_says_why_it_cannot_run() -> None:
    with pytest.raises(jbprofile.ConfigError, match="Poplar SDK"):
        jbprofile.build_settings("resnet50", ["GC200"], {}, "run", {**CLEAN_ENV, "PATH": "/nonexistent"})


def _fake_tool(tmp_path: Path, name: str, output: str) -> dict[str, str]:
    """A vendor listing tool on PATH (the hardware boundary): prints `output` as the real one would."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    tool = bin_dir / name
    tool.write_text(f"#!/bin/sh\ncat <<'EOF'\n{output}\nEOF\n")
    tool.chmod(0o755)
    return {"PATH": f"{bin_dir}:{CLEAN_ENV['PATH']}"}


def test_local_without_an_accelerator_uses_cpu_sized_settings_and_says_so() -> None:
    settings = jbprofile.build_settings("llm", [], {}, "run", CLEAN_ENV)
    assert (settings["JB_SYSTEM"], settings["JB_LAUNCHER"], settings["JB_MODEL"]) == ("local", "local", "tiny")
    assert "no GPU found" in settings["JB_NOTE"] and "CPU-sized settings of [local.cpu]" in settings["JB_NOTE"]
    resnet = shlex.split(jbprofile.build_settings("resnet50", [], {"framework": "pytorch"}, "run", CLEAN_ENV)[
        "JB_TRAIN_ARGS"])
    assert [resnet[resnet.index(f"--{k}") + 1] for k in ("precision", "image-size", "global-batch-size")] == [
        "fp32", "64", "8"]
    assert resnet[resnet.index("--log-interval") + 1] == "1"  # a progress line per (slow) CPU iteration


def test_local_with_a_gpu_uses_the_settings_of_a_one_gpu_node(tmp_path: Path) -> None:
    env = _fake_tool(tmp_path, "nvidia-smi", "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0b6c)")
    settings = jbprofile.build_settings("llm", [], {}, "run", env)
    assert settings["JB_MODEL"] == "800M" and settings["JB_VENDOR"] == "nvidia"
    assert settings["JB_NOTE"].startswith("local: 1 NVIDIA GPU(s) found by nvidia-smi (NVIDIA H100 80GB HBM3)")
    args = shlex.split(settings["JB_TRAIN_ARGS"])
    assert "--iterations" not in args and "--precision" not in args  # the drivers' own windows and precision
    resnet = shlex.split(jbprofile.build_settings("resnet50", [], {}, "run", env)["JB_TRAIN_ARGS"])
    assert resnet[resnet.index("--global-batch-size") + 1] == "256" and "--image-size" not in resnet
    hidden = jbprofile.build_settings("llm", [], {}, "run", {**env, "CUDA_VISIBLE_DEVICES": ""})
    assert hidden["JB_MODEL"] == "tiny" and "CUDA_VISIBLE_DEVICES='' hides them" in hidden["JB_NOTE"]


def test_local_with_an_amd_gpu(tmp_path: Path) -> None:
    listing = "GPU[0]\t\t: Card series: \t\tAMD Instinct MI250X\nGPU[0]\t\t: Card model: \t\t0x740c"
    settings = jbprofile.build_settings("resnet50", [], {}, "run", _fake_tool(tmp_path, "rocm-smi", listing))
    assert settings["JB_VENDOR"] == "amd" and "1 AMD GPU(s) found by rocm-smi (AMD Instinct MI250X)" in settings[
        "JB_NOTE"]


def test_cluster_defaults_and_parameters_reach_the_driver_arguments(tmp_path: Path) -> None:
    env = _fake_tool(tmp_path, "sbatch", "")
    settings = jbprofile.build_settings("llm", ["A100", "13B"], {"global_batch_size": "64", "seq_length": "1024",
                                                                 "steady_seconds": "45"}, "run", env)
    assert (settings["JB_NODES"], settings["JB_WORLD_SIZE"], settings["JB_PARTITION"]) == ("44", "176", "dc-gpu")
    args = shlex.split(settings["JB_TRAIN_ARGS"])
    for option, value in (("--tensor-parallel", "2"), ("--global-batch-size", "64"), ("--seq-length", "1024"),
                          ("--steady-seconds", "45")):
        assert args[args.index(option) + 1] == value
    validate = shlex.split(settings["JB_VALIDATE_ARGS"])
    assert validate[validate.index("--world-size") + 1] == "176"
    assert (settings["JB_COORD_GLOBAL_BATCH_SIZE"], settings["JB_COORD_NODES"], settings["JB_COORD_PRECISION"]) == (
        "64", "44", "")  # empty: the driver's default, filled from its record
    default = jbprofile.build_settings("llm", ["A100"], {}, "run", env)
    assert default["JB_MODEL"] == "800M" and "--steady-seconds" not in default["JB_TRAIN_ARGS"]


def test_local_runs_one_rank_per_node_identity_unless_asked_for_more(tmp_path: Path) -> None:
    """nodes = 2 on local: one rank per node identity by default; devices_per_node = 2 makes each identity a node of
    two devices (nodes x devices, issue 43), refused where the host has fewer GPUs than that."""
    settings = jbprofile.build_settings("llm", ["local"], {"nodes": "2"}, "run", CLEAN_ENV)
    assert (settings["JB_NODES"], settings["JB_WORLD_SIZE"], settings["JB_LOCAL_NODE_DEVICES"]) == ("2", "2", "own")
    two = jbprofile.build_settings("llm", ["local"], {"nodes": "2", "devices_per_node": "2"}, "run", CLEAN_ENV)
    assert (two["JB_NODES"], two["JB_TASKS_PER_NODE"], two["JB_WORLD_SIZE"]) == ("2", "2", "4")
    env = {**_fake_tool(tmp_path, "nvidia-smi", "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0b6c)"),
           "JOULEBENCH_LOCAL_DEVICES_PER_NODE": "2"}
    with pytest.raises(jbprofile.PointRefused, match=r"has 1 GPU\(s\) this job may use, the point asks for nodes=2 x "
                       r"devices_per_node=2\. Fix: use nodes x devices_per_node <= 1") as err:
        jbprofile.build_settings("llm", ["local"], {"nodes": "2"}, "run", env)
    assert err.value.settings["JB_COORD_NODES"] == "2"  # the INVALID row keeps the point's coordinates
    with pytest.raises(jbprofile.ConfigError, match="local_node_devices = 'both' is neither own nor all"):
        jbprofile.build_settings("llm", ["local"], {}, "run", {**CLEAN_ENV, "JOULEBENCH_LOCAL_NODE_DEVICES": "both"})


@pytest.mark.parametrize(("text", "seconds"), [("0:20:00", 1200), ("15", 900), ("1-0:00:00", 86400), ("5:30", 330),
                                                ("UNLIMITED", None)])
def test_slurm_time_formats(text: str, seconds: int | None) -> None:
    assert jbslurm.duration_s(text) == seconds


@pytest.mark.parametrize(("limit_s", "margin_s"), [(60, 10), (120, 12), (1200, 120), (3600, 300), (86400, 300)])
def test_the_stop_margin_follows_the_limit(limit_s: int, margin_s: int) -> None:
    assert jbchecks.stop_margin_s(limit_s) == margin_s


def test_a_time_limit_too_short_for_the_preset_is_refused_and_a_tight_one_noted(tmp_path: Path) -> None:
    env = _fake_tool(tmp_path, "sbatch", "")
    with pytest.raises(jbprofile.PointRefused, match=r"time limit 0:02:00 leaves 108 s .* about 120 s of start-up "
                                                     r"and warm-up of 800M on A100 and a 30 s minimum steady window"
                                                     r".*Fix: set time_limit to at least 0:03:00"):
        jbprofile.build_settings("llm", ["A100"], {}, "run", {**env, "JOULEBENCH_TIME_LIMIT": "0:02:00"})
    # The hint names the variable that wins: the general one loses to the system's own.
    short = {**env, "JOULEBENCH_A100_TIME_LIMIT": "0:02:00"}
    with pytest.raises(jbprofile.PointRefused, match=r"at least 0:03:00 \(JOULEBENCH_A100_TIME_LIMIT\)"):
        jbprofile.build_settings("llm", ["A100"], {}, "run", {**short, "JOULEBENCH_TIME_LIMIT": "0:20:00"})
    assert jbprofile.build_settings("llm", ["A100"], {}, "run", {**short, "JOULEBENCH_A100_TIME_LIMIT": "0:20:00"})
    with pytest.raises(jbprofile.PointRefused, match=r"at least 0:05:00"):  # the steady window asked for counts
        jbprofile.build_settings("llm", ["A100"], {"steady_seconds": "120"}, "run",
                                 {**env, "JOULEBENCH_TIME_LIMIT": "0:03:00"})
    tight = jbprofile.build_settings("llm", ["A100"], {}, "run", {**env, "JOULEBENCH_TIME_LIMIT": "0:03:00"})
    assert tight["JB_NOTE"].startswith("tight time limit: time limit 0:03:00 leaves 162 s")
    assert (tight["JB_STOP_MARGIN_S"], tight["JB_STOP_BUDGET_S"]) == ("18", "162")
    assert jbprofile.build_settings("llm", ["A100"], {}, "run", env)["JB_NOTE"] == ""  # 20 minutes: roomy


def test_partition_limits_are_checked_before_sbatch() -> None:
    nodes = [jbslurm.Node(f"c{i}", "idle", 2, 2) for i in range(1, 5)]
    booster = jbslurm.Partition("booster", 4, None, 3600, nodes)
    assert jbslurm.fit_problem(booster, 4, 1, 1, 1, 600) is None
    assert jbslurm.fit_problem(booster, 6, 1, 1, 1, 600) == "partition booster allows at most 4 nodes per job, 6 " \
                                                            "requested"
    assert "only 0 node(s) of partition booster have 4 GPUs" in jbslurm.fit_problem(booster, 1, 4, 4, 1, 600)
    assert "2 CPUs" not in (jbslurm.fit_problem(booster, 1, 2, 0, 1, 600) or "")  # 2 tasks x 1 CPU fit
    assert "above partition booster's maximum of 3600 s" in jbslurm.fit_problem(booster, 1, 1, 1, 1, 7200)
    capped = jbslurm.Partition("devel", 4, 2, None, nodes)
    assert "allows at most 2 nodes" in jbslurm.fit_problem(capped, 3, 1, 1, 1, 600)
    drained = jbslurm.Partition("booster", 4, None, None, [*nodes[:2], jbslurm.Node("c3", "drained", 2, 2),
                                                           jbslurm.Node("c4", "down*", 2, 2)])
    assert jbslurm.fit_problem(drained, 4, 1, 1, 1, 600) == ("only 2 node(s) of partition booster are up, 4 "
                                                             "requested; down or drained: c3 (drained), c4 (down*)")


@pytest.mark.parametrize(("gres", "gpus"), [("gpu:2", 2), ("gpu:a100:4(S:0-1)", 4), ("gpu:4,nvme:1", 4),
                                            ("(null)", 0), ("gpu:a100:2,gpu:h100:2", 4)])
def test_gpus_per_node_from_slurm_gres(gres: str, gpus: int) -> None:
    assert jbslurm._gpus(gres) == gpus


def test_every_systems_defaults_pass_the_real_drivers_validate(tmp_path: Path, capsys, roomy_host) -> None:
    """Each system x model (and ResNet) as the profile resolves it, through the drivers' own validate (with a
    time limit long enough for the largest models, which the CI clusters only validate), on a roomy host."""
    from llm_training.cli import main as llm_main
    from resnet50.cli import main as resnet_main

    env = {**_fake_tool(tmp_path, "sbatch", ""), "JOULEBENCH_TIME_LIMIT": "4:00:00"}
    rejected = []
    for system in jbprofile.system_names(env):
        if jbprofile.load_profile(system, env)["unsupported"]:
            continue
        models = [None] if system in ("local",) else [None, *jbprofile.WORKLOADS["llm"].model_tags]
        for model in models:
            tags = [system] if model is None else [system, model]
            settings = jbprofile.build_settings("llm", tags, {}, "run", env)
            if llm_main(["validate", *shlex.split(settings["JB_VALIDATE_ARGS"])]) != 0:
                rejected.append((system, model, capsys.readouterr().err.strip()))
        settings = jbprofile.build_settings("resnet50", [system], {"framework": "pytorch"}, "run", env)
        if resnet_main(["validate", *shlex.split(settings["JB_VALIDATE_ARGS"])]) != 0:
            rejected.append((system, "resnet50", capsys.readouterr().err.strip()))
    assert not rejected, "\n".join(map(str, rejected))


def test_a_profile_file_that_is_not_utf8_is_refused_naming_it(tmp_path: Path) -> None:
    """Issue 32 (P07): a Latin-1 profile file ended prepare in a UnicodeDecodeError traceback."""
    extra = tmp_path / "site.ini"
    extra.write_bytes("[MYSITE]\npartition = café\n".encode("latin-1"))
    with pytest.raises(jbprofile.ConfigError, match=f"{re.escape(str(extra))} is not UTF-8 text \\(byte 0xe9 at "
                                                    "offset 24\\). Fix: save the profile file as UTF-8"):
        jbprofile.system_names({**CLEAN_ENV, "JOULEBENCH_PROFILE": str(extra)})


def test_prepare_names_an_unwritable_out_and_a_bad_min_steady_s(tmp_path: Path) -> None:
    """Issue 32 (D13, P13): --out under a file ended prepare in a traceback; a bad min_steady_s was reported as
    steady_seconds. The refused point's settings file is still written, or its failure said (exit 73)."""
    blocker = tmp_path / "afile"
    blocker.write_text("")
    env = {**CLEAN_ENV, "JOULEBENCH_MIN_STEADY_S": "nan"}
    for out, code in ((tmp_path / "job.env", 0), (blocker / "job.env", jbprofile.EX_CANTCREAT)):
        proc = subprocess.run([sys.executable, str(JUBE_DIR / "jbprofile.py"), "prepare", "--benchmark", "llm",
                               "--run-id", "r", "--out", str(out)], env=env, capture_output=True, text=True, timeout=60)
        assert proc.returncode == code, proc.stderr
        assert "min_steady_s=nan is out of range. Fix: set min_steady_s to a finite number >= 0.0" in proc.stderr
        assert "Traceback" not in proc.stderr
    assert f"jbprofile: error: cannot write --out {blocker / 'job.env'} (" in proc.stderr
    assert "Fix: pass a writable path" in proc.stderr


@pytest.mark.parametrize(("point", "env", "sent"), [
    ({"steady_seconds": "40"}, {}, ("--steady-seconds", "40")),  # the point's value, whichever of its two names
    ({"min_window_s": "2"}, {"JOULEBENCH_STEADY_SECONDS": "60"}, ("--min-window-s", "2")),
    ({}, {"JOULEBENCH_STEADY_SECONDS": "60", "JOULEBENCH_INFERENCE_MIN_WINDOW_S": "3"}, ("--min-window-s", "3")),
    ({}, {"JOULEBENCH_STEADY_SECONDS": "60", "JOULEBENCH_INFERENCE_MIN_WINDOW_S": ""}, ("--steady-seconds", "60")),
])
def test_an_inference_point_sends_one_window_option_never_both(point, env, sent) -> None:
    """--min-window-s is llm_inference's other name of --steady-seconds (the driver refuses both together)."""
    args = shlex.split(jbprofile.build_settings("inference", [], point, "r", {**CLEAN_ENV, **env})["JB_TRAIN_ARGS"])
    given = [a for a in args if a in ("--steady-seconds", "--min-window-s")]
    assert given == [sent[0]] and args[args.index(sent[0]) + 1] == sent[1]


def test_an_inference_point_giving_both_window_options_is_refused() -> None:
    with pytest.raises(jbprofile.PointRefused, match="steady_seconds=40 and min_window_s=2: both set the length"):
        jbprofile.build_settings("inference", [], {"steady_seconds": "40", "min_window_s": "2"}, "r", CLEAN_ENV)


def _option(args: str, option: str) -> str:
    words = shlex.split(args)
    return words[words.index(option) + 1]


def test_gpt13b_on_one_node_takes_the_one_node_layout_and_one_nodes_share_of_the_batch(tmp_path: Path) -> None:
    env = _fake_tool(tmp_path, "sbatch", "")
    cluster = jbprofile.build_settings("llm", ["H100", "13B"], {}, "run", env)
    assert (_option(cluster["JB_TRAIN_ARGS"], "--tensor-parallel"),
            _option(cluster["JB_TRAIN_ARGS"], "--pipeline-parallel")) == ("2", "2")  # 44 nodes: the cluster layout
    node = jbprofile.build_settings("llm", ["H100", "13B"], {"nodes": "1"}, "run", env)
    assert (node["JB_WORLD_SIZE"], node["JB_COORD_TENSOR_PARALLEL"], node["JB_COORD_PIPELINE_PARALLEL"]) == (
        "4", "4", "1")
    assert _option(node["JB_TRAIN_ARGS"], "--global-batch-size") == "128"  # weak scaling: 5632 x 4 / 176
    asked = jbprofile.build_settings("llm", ["H100", "13B"], {"nodes": "1", "tensor_parallel": "2",
                                                              "pipeline_parallel": "2"}, "run", env)
    assert _option(asked["JB_TRAIN_ARGS"], "--pipeline-parallel") == "2"  # a point's own layout wins
    gpus = "\n".join(f"GPU {i}: NVIDIA H100 80GB HBM3 (UUID: GPU-{i})" for i in range(4))
    local = jbprofile.build_settings("llm", ["13B"], {}, "run", _fake_tool(tmp_path, "nvidia-smi", gpus))
    assert (local["JB_NODES"], local["JB_WORLD_SIZE"], _option(local["JB_TRAIN_ARGS"], "--tensor-parallel"),
            _option(local["JB_TRAIN_ARGS"], "--global-batch-size")) == ("1", "4", "4", "128")


@pytest.mark.parametrize(("system", "tag", "nodes", "memory_gib", "passes"), [
    ("H100", "13B", "1", "79.6", True),  # the 4-GPU node default, on 80 GB cards
    ("H100", "175B", "", "79.6", True),  # the CARAML cluster shape: 16 nodes x 4, TP 8 x PP 8
    ("A100", "175B", "", "39.4", False),  # the same shape on 40 GB cards
])
def test_profile_layouts_pass_the_drivers_validate_or_are_refused_with_estimate_and_capacity(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], system: str, tag: str, nodes: str, memory_gib: str,
        passes: bool) -> None:
    from llm_training.cli import main

    point = {"nodes": nodes} if nodes else {}
    settings = jbprofile.build_settings("llm", [system, tag], point, "run", _fake_tool(tmp_path, "sbatch", ""))
    code = main(["validate", *shlex.split(settings["JB_VALIDATE_ARGS"]), "--device-memory-gib", memory_gib])
    out, err = capsys.readouterr()
    if passes:
        assert code == 0 and f"GiB/device of {memory_gib} GiB" in out, err
    else:
        assert code == 64 and "refused by the memory estimate" in err and f"the device has {memory_gib} GiB" in err
        assert re.search(r"needs about \d+\.\d GiB per device", err) and "Fix: " in err
