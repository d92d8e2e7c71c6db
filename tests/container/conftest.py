"""Shared pieces of the container tests: the two stdlib tools loaded from their files, fake runtimes on PATH.

Apptainer, Docker and registries are out of reach on CI, so `fake_bin/` stands in for the `apptainer` and
`skopeo` programs (the boundary the suite talks to); everything on our side of it is the real code.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]
CONTAINER_DIR = REPO / "container"
FAKE_BIN = Path(__file__).resolve().parent / "fake_bin"
SYSTEM_PATH = "/usr/bin:/bin"


def _load(name: str, path: Path) -> ModuleType:
    """One module object per tool, shared with the tools' own on-demand imports (they import by name)."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


jbcontainer = _load("jbcontainer", CONTAINER_DIR / "jbcontainer.py")
jbprofile = _load("jbprofile", REPO / "jube" / "jbprofile.py")


@pytest.fixture
def fake_env(tmp_path: Path) -> dict[str, str]:
    """An environment whose PATH has the fake apptainer/skopeo, logging to tmp_path/apptainer.log."""
    return {"PATH": f"{FAKE_BIN}:{SYSTEM_PATH}", "FAKE_APPTAINER_LOG": str(tmp_path / "apptainer.log"),
            "HOME": str(tmp_path)}


@pytest.fixture
def lock_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A scratch copy of the real lock file, used by every jbcontainer call of the test."""
    path = tmp_path / "images.lock.json"
    path.write_text((CONTAINER_DIR / "images.lock.json").read_text())
    monkeypatch.setattr(jbcontainer, "LOCK_FILE", path)
    return path
