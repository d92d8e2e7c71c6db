"""Which extras a documented workflow needs, and which of their packages this Python lacks.

The extras are read from the clone's pyproject.toml (the one list of them; an installed joulebench's metadata where
there is no clone), so `joulebench doctor` and a command that needs several extras (the demo, which would otherwise
stop at its plot step, after training) check the same thing: each requirement's distribution is installed, and so
is each package of an extra it names itself (`transformers[serving]`).
"""

from __future__ import annotations

import importlib.metadata
import re
import tomllib
from pathlib import Path

from jpwr import ExitCode, JpwrError

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"
QUICK_START_EXTRAS = ("llm", "reports")  # train, then plot and report (the demo runs the same steps)
# what each documented workflow needs: (its name, where it is documented, its extras)
WORKFLOWS = (
    ("the quick start and `joulebench demo`", "README.md", QUICK_START_EXTRAS),
    ("the JUBE workflows", "docs/jube.md", ("llm", "resnet-pytorch")),
    ("ResNet-50, PyTorch", "docs/resnet50.md", ("resnet-pytorch",)),
    ("ResNet-50, TensorFlow", "docs/resnet50.md", ("resnet-tensorflow",)),
    ("LLM inference", "docs/llm_inference.md", ("inference",)),
    ("LLM serving against `transformers serve`", "docs/llm_inference.md", ("serving",)),
    ("--log-to tensorboard, mlflow, wandb", "docs/exports.md", ("tensorboard", "mlflow", "wandb")),
)
# an extra another one stands in for: the same code without CUDA libraries (README's Install)
ALTERNATIVES = {"resnet-tensorflow": "resnet-tensorflow-cpu"}
_NAME = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[([^\]]*)\])?")
_EXTRA_MARKER = re.compile(r"""extra\s*==\s*["']([^"']+)["']""")


class ExtrasMissingError(JpwrError):
    """A command needs extras whose packages are not installed (exit 69, as a missing extra at import)."""

    exit_code = ExitCode.UNAVAILABLE

    def __init__(self, command: str, missing: dict[str, list[str]]) -> None:
        named = "; ".join(f"{extra}: {', '.join(packages)}" for extra, packages in missing.items())
        super().__init__(f"{command} needs extras that are not installed ({named}). Fix: "
                         f"{install_line(list(missing))}")


def install_line(extras: list[str]) -> str:
    return f"pip install 'joulebench[{','.join(extras)}]'"


def extra_requirements() -> dict[str, list[str]]:
    """extra -> its requirement strings, from the clone's pyproject.toml, else the installed joulebench."""
    if PYPROJECT.is_file():
        project = tomllib.loads(PYPROJECT.read_text())["project"]
        return {extra: list(reqs) for extra, reqs in project.get("optional-dependencies", {}).items()}
    extras: dict[str, list[str]] = {}
    for requirement in importlib.metadata.requires("joulebench") or []:
        marker = _EXTRA_MARKER.search(requirement)
        if marker:
            extras.setdefault(marker.group(1), []).append(requirement.split(";")[0])
    return extras


def _installed(distribution: str) -> bool:
    try:
        importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def _nested(distribution: str, extra: str) -> list[str]:
    """The distributions an installed package's own extra requires (`transformers[serving]`: fastapi, ...)."""
    nested = []
    for requirement in importlib.metadata.requires(distribution) or []:
        marker = _EXTRA_MARKER.search(requirement)
        match = _NAME.match(requirement)
        if marker and marker.group(1) == extra and match:
            nested.append(match.group(1))
    return nested


def missing_packages(extra: str, requirements: dict[str, list[str]]) -> list[str]:
    """The distributions of `extra` that are not installed (with those of the extras its requirements name)."""
    missing = []
    for requirement in requirements.get(extra, []):
        match = _NAME.match(requirement)
        if match is None:
            continue
        name, nested = match.group(1), match.group(2)
        if not _installed(name):
            missing.append(name)
            continue
        for inner in (nested or "").split(","):
            missing += [dist for dist in _nested(name, inner.strip()) if inner.strip() and not _installed(dist)]
    return missing


def missing_extras(extras: tuple[str, ...], requirements: dict[str, list[str]] | None = None
                   ) -> dict[str, list[str]]:
    """extra -> its missing packages, for the extras of `extras` that are incomplete (an extra that another stands
    in for, e.g. resnet-tensorflow-cpu for resnet-tensorflow, counts as installed when the other is)."""
    requirements = extra_requirements() if requirements is None else requirements
    missing = {}
    for extra in extras:
        packages = missing_packages(extra, requirements)
        alternative = ALTERNATIVES.get(extra)
        if packages and not (alternative and not missing_packages(alternative, requirements)):
            missing[extra] = packages
    return missing


def installed_as(extras: tuple[str, ...], requirements: dict[str, list[str]]) -> list[str]:
    """The extras as installed: one that another stands in for by that other's name (resnet-tensorflow-cpu)."""
    return [ALTERNATIVES[extra] if extra in ALTERNATIVES and missing_packages(extra, requirements) else extra
            for extra in extras]


def require_extras(command: str, extras: tuple[str, ...]) -> None:
    """Raise ExtrasMissingError naming every missing extra of `command` at once, before its first step."""
    missing = missing_extras(extras)
    if missing:
        raise ExtrasMissingError(command, missing)
