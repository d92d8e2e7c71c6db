"""The Apptainer definition files, read with a real parser (spython): pinned bases, required sections, and
agreement with the lock file, the suite's own pins and the repository files they copy in."""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

import pytest
from spython.main.parse.parsers import SingularityParser

from tests.container.conftest import CONTAINER_DIR, REPO, jbcontainer

DEFINITIONS = sorted(CONTAINER_DIR.glob("*.def"))
# Exact release tags: NGC YY.MM[-tf2]-py3, ROCm rocmX.Y.Z_..._release_A.B.C / rocmX.Y.Z-pyA.B-tfC.D-dev.
EXACT_TAG = re.compile(r"^(\d{2}\.\d{2}(-tf2)?-py3|rocm\d+\.\d+\.\d+[_-].*\d+\.\d+.*)$")


def parse(path: Path) -> object:
    return SingularityParser(str(path)).recipe["spython-base"]


def test_one_definition_per_vendor_and_framework_and_none_for_graphcore() -> None:
    names = {p.stem for p in DEFINITIONS}
    assert names == {"nvidia-pytorch", "nvidia-tensorflow", "amd-pytorch", "amd-tensorflow"}
    with pytest.raises(jbcontainer.ValidationError, match=r"Python 3\.8"):
        jbcontainer.image_name("graphcore", "pytorch")


@pytest.mark.parametrize("definition", DEFINITIONS, ids=lambda p: p.stem)
def test_base_is_pinned_to_an_exact_tag_and_matches_the_lock(definition: Path) -> None:
    recipe = parse(definition)
    base = recipe.fromHeader
    assert base == jbcontainer.definition_base(definition)
    assert "@" not in base, "the definition names the tag; the digest lives in images.lock.json"
    tag = jbcontainer.split_reference(base)[2]
    assert tag != "latest" and EXACT_TAG.match(tag), f"{definition.name}: '{tag}' is not an exact release tag"
    entry = jbcontainer.load_lock()["images"][definition.stem]
    assert entry["base"] == base, "pin moved in the .def without `jbcontainer.py lock NAME --update`"
    assert entry["digest"] is None or jbcontainer.DIGEST_RE.fullmatch(entry["digest"])


@pytest.mark.parametrize("definition", DEFINITIONS, ids=lambda p: p.stem)
def test_required_sections(definition: Path) -> None:
    recipe = parse(definition)
    vendor, framework = definition.stem.split("-")
    text = definition.read_text()
    for section in ("%post", "%labels", "%test", "%environment", "%files"):
        assert re.search(rf"(?m)^{section}\b", text), f"{definition.name} lacks {section}"
    # %post installs the suite into the image (spython appends the %test lines to `install`).
    post = f"sh /opt/joulebench/src/container/post-install.sh {definition.stem} {framework} {vendor}"
    assert recipe.install[0] == post
    labels = dict(line.split(None, 1) for line in recipe.labels)
    assert labels["org.joulebench.image"] == definition.stem
    assert labels["org.joulebench.base"] == recipe.fromHeader
    assert (labels["org.joulebench.vendor"], labels["org.joulebench.framework"]) == (vendor, framework)
    assert "PYTHONNOUSERSITE=1" in recipe.environ  # never ~/.local (CARAML's pip --user installs)
    assert "jpwr info" in text.split("%test", 1)[1]
    framework_module = "resnet50.torch_backend" if framework == "pytorch" else "resnet50.tf_backend"
    assert framework_module in text.split("%test", 1)[1]


@pytest.mark.parametrize("definition", DEFINITIONS, ids=lambda p: p.stem)
def test_copied_files_exist_in_the_repository(definition: Path) -> None:
    for line in parse(definition).files:
        source, destination = line.split()
        assert (REPO / source).exists(), f"{definition.name}: %files source {source} is not in the repository"
        assert destination.startswith("/opt/joulebench/src/")


def test_post_install_pins_agree_with_the_package() -> None:
    script = (CONTAINER_DIR / "post-install.sh").read_text()
    subprocess.run(["sh", "-n", str(CONTAINER_DIR / "post-install.sh")], check=True)
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    megatron_pin = next(dep for dep in extras["llm"] if dep.startswith("megatron-core"))
    assert f"--no-deps {megatron_pin}" in script
    assert 'pip_install --no-deps --no-build-isolation "$src"' in script
    for name in ("nvidia-pytorch", "amd-pytorch"):
        labels = dict(line.split(None, 1) for line in parse(CONTAINER_DIR / f"{name}.def").labels)
        assert labels["org.joulebench.pin.megatron-core"] == megatron_pin.split("==")[1]


def test_build_text_pins_the_digest_and_still_parses(tmp_path: Path) -> None:
    digest = "sha256:" + "ab" * 32
    definition = CONTAINER_DIR / "nvidia-pytorch.def"
    text = jbcontainer.build_definition_text(definition, digest, {"org.joulebench.base.digest": digest})
    built = tmp_path / "built.def"
    built.write_text(text)
    recipe = parse(built)
    assert recipe.fromHeader == f"nvcr.io/nvidia/pytorch@{digest}"
    assert f"org.joulebench.base.digest {digest}" in recipe.labels
    assert recipe.install == parse(definition).install


@pytest.mark.parametrize("definition", DEFINITIONS, ids=lambda p: p.stem)
def test_every_image_carries_the_meter_and_the_core(definition: Path) -> None:
    """Every driver imports jpwr and joulebench: an image without either cannot run any of them."""
    sources = {line.split()[0] for line in parse(definition).files}
    assert {"jpwr", "joulebench"} <= sources
