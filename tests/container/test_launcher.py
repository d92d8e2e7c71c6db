"""The launcher prefix per system profile (vendor, arch), the runtime lookup, the image check, and
build/pull/ensure against the fake `apptainer` (the real one cannot run on CI)."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from tests.container.conftest import FAKE_BIN, REPO, SYSTEM_PATH, jbcontainer, jbprofile

FIRST = "sha256:" + "1" * 64


def settings_for(system: str, env: dict[str, str], framework: str = "pytorch", **keys: str) -> dict[str, str]:
    profile = jbprofile.load_profile(system, env)
    profile.update(keys)
    return jbcontainer.job_settings(profile, framework, env)


@pytest.mark.parametrize(("system", "framework", "flags", "image"), [
    ("A100", "pytorch", ["--nv"], "nvidia-pytorch-x86_64.sif"),
    ("H100", "tensorflow", ["--nv"], "nvidia-tensorflow-x86_64.sif"),
    ("GH200", "pytorch", ["--nv"], "nvidia-pytorch-aarch64.sif"),
    ("JEDI", "tensorflow", ["--nv"], "nvidia-tensorflow-aarch64.sif"),
    ("MI250", "pytorch", ["--rocm"], "amd-pytorch-x86_64.sif"),
    ("MI300X", "tensorflow", ["--rocm"], "amd-tensorflow-x86_64.sif"),
    ("local", "pytorch", [], "nvidia-pytorch-x86_64.sif"),
    ("CI", "tensorflow", [], "nvidia-tensorflow-x86_64.sif"),
])
def test_prefix_per_system(system: str, framework: str, flags: list[str], image: str,
                           fake_env: dict[str, str], tmp_path: Path) -> None:
    env = {**fake_env, "JOULEBENCH_CONTAINER_DIR": str(tmp_path / "sif")}
    settings = settings_for(system, env, framework)
    argv = shlex.split(settings["JB_CONTAINER"])
    assert argv == [str(FAKE_BIN / "apptainer"), "exec", *flags, "--bind", str(REPO), str(tmp_path / "sif" / image)]
    assert settings["JB_CONTAINER_BIND_VAR"] == "APPTAINER_BIND"
    assert settings["JB_PYTHON"] == "python3"  # the image's interpreter, not the host venv


def test_data_directories_are_bound_and_an_explicit_python_is_kept(fake_env: dict[str, str]) -> None:
    settings = settings_for("A100", fake_env, llm_data_path="/p/data/oscar/oscar_text_document",
                            resnet_data_dir="/p/data/imagenet", python="/opt/venv/bin/python")
    argv = shlex.split(settings["JB_CONTAINER"])
    assert argv[argv.index("--bind") + 1] == f"{REPO},/p/data/oscar,/p/data/imagenet"
    assert settings["JB_PYTHON"] == "/opt/venv/bin/python"
    assert argv[-1] == str(jbcontainer.DEFAULT_IMAGE_DIR / "nvidia-pytorch-x86_64.sif")
    relative = settings_for("A100", fake_env, container_dir="site/sif")  # relative: from the repository root
    assert shlex.split(relative["JB_CONTAINER"])[-1] == str(REPO / "site" / "sif" / "nvidia-pytorch-x86_64.sif")


def test_without_the_tag_the_job_runs_bare_metal() -> None:
    env = {"PATH": SYSTEM_PATH}
    settings = jbprofile.build_settings("llm", [], {}, "run", env)
    assert settings["JB_CONTAINER"] == "" and "JB_CONTAINER_IMAGE" not in settings
    tagged = jbprofile.build_settings("llm", ["container"], {}, "run", {**env, "PATH": f"{FAKE_BIN}:{SYSTEM_PATH}"})
    assert shlex.split(tagged["JB_CONTAINER"])[:2] == [str(FAKE_BIN / "apptainer"), "exec"]


def test_missing_runtime_is_a_config_error_naming_the_fix() -> None:
    with pytest.raises(jbprofile.ConfigError, match=r"neither apptainer nor singularity .*Fix: .*module load"):
        jbprofile.build_settings("resnet50", ["container", "pytorch"], {}, "run", {"PATH": SYSTEM_PATH})


def test_runtime_from_setup_lines_and_singularity_fallback(tmp_path: Path) -> None:
    only_singularity = tmp_path / "bin"
    only_singularity.mkdir()
    (only_singularity / "singularity").symlink_to(FAKE_BIN / "apptainer")
    env = {"PATH": SYSTEM_PATH}
    settings = settings_for("H100", env, setup=f"export PATH={only_singularity}:$PATH")
    assert shlex.split(settings["JB_CONTAINER"])[0] == str(only_singularity / "singularity")
    assert settings["JB_CONTAINER_BIND_VAR"] == "SINGULARITY_BIND"


def test_graphcore_and_arm_amd_have_no_image(fake_env: dict[str, str]) -> None:
    with pytest.raises(jbcontainer.ValidationError, match=r"Python 3\.8"):
        settings_for("GC200", fake_env)
    with pytest.raises(jbcontainer.ValidationError, match="x86_64 only"):
        settings_for("MI250", fake_env, arch="aarch64")


def test_check_reports_a_missing_image_then_accepts_it(fake_env: dict[str, str], tmp_path: Path) -> None:
    profile = {**jbprofile.load_profile("JEDI", fake_env), "container_dir": str(tmp_path)}
    with pytest.raises(jbcontainer.ValidationError, match=r"does not exist yet\. Fix: build it .*aarch64 node"):
        jbcontainer.check(profile, "pytorch", fake_env)
    (tmp_path / "nvidia-pytorch-aarch64.sif").write_text("image")
    assert jbcontainer.check(profile, "pytorch", fake_env)["JB_CONTAINER_NAME"] == "nvidia-pytorch"


def test_build_from_the_locked_digest(lock_file: Path, fake_env: dict[str, str], tmp_path: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", fake_env["PATH"])
    jbcontainer.record_digest("nvidia-pytorch", "nvcr.io/nvidia/pytorch:25.12-py3", FIRST, "given")
    image = jbcontainer.build("nvidia-pytorch", tmp_path / "sif", environ=fake_env)
    assert image == tmp_path / "sif" / f"nvidia-pytorch-{jbcontainer.host_arch()}.sif"
    built_from = image.read_text()  # the fake copies the definition it was given into the "image"
    assert f"From: nvcr.io/nvidia/pytorch@{FIRST}" in built_from
    assert f"org.joulebench.base.digest {FIRST}" in built_from
    assert list(image.parent.iterdir()) == [image]  # no temporary file left behind
    assert not list(jbcontainer.CONTAINER_DIR.glob(".*.build.def"))
    call = (tmp_path / "apptainer.log").read_text().split("\t", 1)[1].split()
    assert call[:2] == ["build", "--force"]  # into a temporary file beside the image, renamed once built
    assert Path(call[2]).parent == image.parent and Path(call[2]).name.startswith(f".{image.name}.")


def test_first_build_records_the_digest(lock_file: Path, fake_env: dict[str, str], tmp_path: Path) -> None:
    manifest = tmp_path / "index.json"
    manifest.write_bytes(b'{"manifests": []}')
    env = {**fake_env, "FAKE_SKOPEO_MANIFEST": str(manifest)}
    image = jbcontainer.build("amd-tensorflow", tmp_path / "sif", "x86_64", environ=env)
    digest = jbcontainer.load_lock()["images"]["amd-tensorflow"]["digest"]
    assert digest and f"From: rocm/tensorflow@{digest}" in image.read_text()


def test_failed_build_leaves_no_image(lock_file: Path, fake_env: dict[str, str], tmp_path: Path) -> None:
    jbcontainer.record_digest("amd-pytorch", jbcontainer.definition_base(jbcontainer.definition_path("amd-pytorch")),
                              FIRST, "given")
    with pytest.raises(jbcontainer.ValidationError, match=r"build` of amd-pytorch failed .*Fix: .*--fakeroot"):
        jbcontainer.build("amd-pytorch", tmp_path / "sif", "x86_64", environ={**fake_env, "FAKE_APPTAINER_FAIL": "1"})
    assert not list((tmp_path / "sif").iterdir())


def test_build_for_another_architecture_says_where_to_run(fake_env: dict[str, str], tmp_path: Path) -> None:
    other = "aarch64" if jbcontainer.host_arch() == "x86_64" else "x86_64"
    with pytest.raises(jbcontainer.ValidationError, match=rf"cannot be built on this .*Fix: .*on an {other} node"):
        jbcontainer.build("nvidia-pytorch", tmp_path, other, environ=fake_env)


def test_ensure_pulls_once_from_the_configured_source(fake_env: dict[str, str], tmp_path: Path) -> None:
    profile = {**jbprofile.load_profile("H100", fake_env), "container_dir": str(tmp_path / "sif"),
               "container_source": "oras://registry.example/joulebench/nvidia-pytorch:0.1.0"}
    first = jbcontainer.ensure_image(profile, "pytorch", fake_env)
    second = jbcontainer.ensure_image(profile, "pytorch", fake_env)
    assert first == second == tmp_path / "sif" / "nvidia-pytorch-x86_64.sif"
    calls = [line.split("\t", 1)[1].split()[0] for line in (tmp_path / "apptainer.log").read_text().splitlines()]
    assert calls == ["pull", "test"]  # pulled and %test-ed once; the second call found the image


def test_cli_launcher_prints_the_prefix(fake_env: dict[str, str], monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("PATH", fake_env["PATH"])
    assert jbcontainer.main(["launcher", "--system", "mi250", "--benchmark", "resnet50",
                             "--framework", "tensorflow"]) == 0
    assert shlex.split(capsys.readouterr().out)[1:3] == ["exec", "--rocm"]
    assert jbcontainer.main(["check", "--system", "nosuchsystem"]) == 64
    assert "has no profile" in capsys.readouterr().err
