"""Shared test setup: the hardware-boundary fakes come first on sys.path.

`import pynvml`, `import amdsmi` and `import gcipuinfo` in any test (and in jpwr code under test) get the
fakes in tests/fakes, which start out as "no such hardware" until a test configures them. Subprocesses get
the same through the `fake_env` fixture (FAKES_DIR first on PYTHONPATH).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

TESTS_DIR = Path(__file__).resolve().parent
FAKES_DIR = TESTS_DIR / "fakes"
H100_TRACE_DIR = TESTS_DIR / "data" / "h100_trace"

# One pytest process imports TensorFlow (resnet50's TF backend) and torch._dynamo (torchvision, torch.compile).
# Loading triton's libtriton after TensorFlow's bundled LLVM segfaults (TF 2.21, triton 3.x from torch 2.14);
# loaded first, both work. Drivers never import both frameworks in one process.
with contextlib.suppress(ImportError):
    import triton  # noqa: F401

if str(FAKES_DIR) not in sys.path:
    sys.path.insert(0, str(FAKES_DIR))
for _name in ("pynvml", "amdsmi", "gcipuinfo"):  # drop a real library imported before us
    if _name in sys.modules and not str(getattr(sys.modules[_name], "__file__", "")).startswith(str(FAKES_DIR)):
        del sys.modules[_name]


@pytest.fixture
def h100_trace_dir() -> Path:
    return H100_TRACE_DIR


@pytest.fixture
def fake_pynvml() -> Iterator[object]:
    """The fake pynvml module, reset to 'no driver' after the test; call .configure(...) to replay."""
    import pynvml

    pynvml.reset()
    yield pynvml
    pynvml.reset()


@pytest.fixture
def fake_amdsmi() -> Iterator[object]:
    import amdsmi

    amdsmi.reset()
    yield amdsmi
    amdsmi.reset()


@pytest.fixture
def fake_gcipuinfo() -> Iterator[object]:
    import gcipuinfo

    gcipuinfo.reset()
    yield gcipuinfo
    gcipuinfo.reset()


@pytest.fixture
def fake_env() -> Callable[..., dict[str, str]]:
    """fake_env(JPWR_FAKE_NVML_TRACE=...) -> an environment whose Python imports the fakes and this checkout."""

    def build(**extra: str) -> dict[str, str]:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(FAKES_DIR), str(TESTS_DIR.parent), env.get("PYTHONPATH", "")])
        env.update(extra)
        return env

    return build
