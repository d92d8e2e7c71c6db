"""The system profile and tag rules of jube/jbprofile.py (no JUBE, no Slurm needed)."""

from __future__ import annotations

import importlib.util
import shlex
import sys

import pytest

from tests.jube.conftest import JUBE_DIR

_spec = importlib.util.spec_from_file_location("jbprofile", JUBE_DIR / "jbprofile.py")
jbprofile = importlib.util.module_from_spec(_spec)
sys.modules["jbprofile"] = jbprofile
_spec.loader.exec_module(jbprofile)

ISSUE_SYSTEMS = ("A100", "H100", "WAIH100", "GH200", "JEDI", "MI250", "GC200", "H200", "MI300X", "local", "CI")
CLEAN_ENV = {"PATH": "/usr/bin:/bin"}


def test_every_system_of_the_issue_has_a_complete_profile() -> None:
    names = jbprofile.system_names(CLEAN_ENV)
    assert set(ISSUE_SYSTEMS) <= set(names)
    for name in names:
        profile = jbprofile.load_profile(name, CLEAN_ENV)
        assert profile["vendor"] in ("nvidia", "amd", "graphcore", "cpu"), name
        assert int(profile["devices_per_node"]) >= 1, name
        assert profile["default_model"] in jbprofile.MODEL_TAGS, name
        assert jbprofile.time_limit_seconds(profile["time_limit"]) > 0, name


def test_environment_overrides_every_system_then_one_system() -> None:
    env = {**CLEAN_ENV, "JOULEBENCH_PARTITION": "everywhere", "JOULEBENCH_A100_PARTITION": "only-a100",
           "joulebench_account": "lower-case-name"}
    assert jbprofile.load_profile("A100", env)["partition"] == "only-a100"
    assert jbprofile.load_profile("H100", env)["partition"] == "everywhere"
    assert jbprofile.load_profile("h100", env)["account"] == "lower-case-name"
    assert jbprofile.load_profile("jedi", CLEAN_ENV)["system"] == "JEDI"  # case-insensitive (CARAML's Jedi bug)


def test_extra_profile_file_adds_a_system(tmp_path) -> None:
    extra = tmp_path / "site.ini"
    extra.write_text("[MYSITE]\npartition = gpu\ndevices_per_node = 2\n")
    env = {**CLEAN_ENV, "JOULEBENCH_PROFILE": str(extra)}
    profile = jbprofile.load_profile("MYSITE", env)
    assert (profile["partition"], profile["devices_per_node"], profile["vendor"]) == ("gpu", "2", "nvidia")


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
    assert message in str(err.value)


def test_gc200_says_why_it_cannot_run() -> None:
    with pytest.raises(jbprofile.ConfigError, match="Poplar SDK"):
        jbprofile.build_settings("resnet50", ["GC200"], {}, "run", {**CLEAN_ENV, "PATH": "/nonexistent"})


def test_no_tag_is_local_with_its_default_model() -> None:
    settings = jbprofile.build_settings("llm", [], {}, "run", CLEAN_ENV)
    assert (settings["JB_SYSTEM"], settings["JB_LAUNCHER"], settings["JB_MODEL"]) == ("local", "local", "tiny")
    assert "--model tiny" in settings["JB_TRAIN_ARGS"]


def test_cluster_defaults_and_parameters_reach_the_driver_arguments(tmp_path) -> None:
    fake_sbatch = tmp_path / "sbatch"
    fake_sbatch.write_text("#!/bin/sh\nexit 0\n")
    fake_sbatch.chmod(0o755)
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin"}
    settings = jbprofile.build_settings("llm", ["A100", "13B"], {"global_batch_size": "64"}, "run", env)
    assert (settings["JB_NODES"], settings["JB_WORLD_SIZE"], settings["JB_PARTITION"]) == ("44", "176", "dc-gpu")
    args = shlex.split(settings["JB_TRAIN_ARGS"])
    assert args[args.index("--tensor-parallel") + 1] == "2"
    assert args[args.index("--global-batch-size") + 1] == "64"
    validate = shlex.split(settings["JB_VALIDATE_ARGS"])
    assert validate[validate.index("--world-size") + 1] == "176"
    default = jbprofile.build_settings("llm", ["A100"], {}, "run", env)
    assert default["JB_MODEL"] == "800M"


def test_local_refuses_more_than_one_process() -> None:
    with pytest.raises(jbprofile.ConfigError, match="local system runs one process"):
        jbprofile.build_settings("llm", ["local"], {"nodes": "2"}, "run", CLEAN_ENV)


@pytest.mark.parametrize(("text", "seconds"), [("0:20:00", 1200), ("15", 900), ("1-0:00:00", 86400), ("5:30", 330)])
def test_slurm_time_formats(text: str, seconds: int) -> None:
    assert jbprofile.time_limit_seconds(text) == seconds


def test_training_stops_itself_before_the_time_limit() -> None:
    assert jbprofile.exit_duration_mins(15 * 60) == pytest.approx(12.8, abs=0.05)
    assert jbprofile.exit_duration_mins(60) == 1.0


def _fake_sbatch_env(tmp_path) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "sbatch").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "sbatch").chmod(0o755)
    return {"PATH": f"{bin_dir}:/usr/bin:/bin"}


def test_every_systems_defaults_pass_the_real_drivers_validate(tmp_path, capsys) -> None:
    """Each system x model (and ResNet) as the profile resolves it, through the drivers' own validate."""
    from llm_training.cli import main as llm_main
    from resnet50.cli import main as resnet_main

    env = _fake_sbatch_env(tmp_path)
    rejected = []
    for system in jbprofile.system_names(env):
        if jbprofile.load_profile(system, env)["unsupported"]:
            continue
        models = [None] if system in ("local",) else [None, *jbprofile.MODEL_TAGS]
        for model in models:
            tags = [system] if model is None else [system, model]
            settings = jbprofile.build_settings("llm", tags, {}, "run", env)
            if llm_main(["validate", *shlex.split(settings["JB_VALIDATE_ARGS"])]) != 0:
                rejected.append((system, model, capsys.readouterr().err.strip()))
        settings = jbprofile.build_settings("resnet50", [system], {"framework": "pytorch"}, "run", env)
        if resnet_main(["validate", *shlex.split(settings["JB_VALIDATE_ARGS"])]) != 0:
            rejected.append((system, "resnet50", capsys.readouterr().err.strip()))
    assert not rejected, "\n".join(map(str, rejected))
