"""What the shared training loop needs from a framework backend (torch or TensorFlow).

Keeping the loop, the windows, the record and the output lines framework-free is what makes
the two backends report comparable numbers: only the step itself differs.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from typing import Any, Protocol

from joulebench.launch import LaunchEnv
from joulebench.phases import Replay
from joulebench.record_types import HardwareBlock
from jpwr import ValidationError
from jpwr.phases import PhaseRecorder
from resnet50.config import TrainConfig

REQUIRED_MODULES = {"pytorch": ("torch", "torchvision"), "tensorflow": ("tensorflow", "keras")}
INSTALL_HINT = {
    "pytorch": "pip install 'joulebench[resnet-pytorch]' (torch and torchvision)",
    "tensorflow": "pip install 'joulebench[resnet-tensorflow]' (GPU) or 'joulebench[resnet-tensorflow-cpu]'",
}


class Backend(Protocol):
    """One process's share of a data-parallel ResNet-50 training run."""

    devices: int  # data-parallel replicas of the whole run
    device_kind: str  # "cuda" or "cpu"

    def hardware(self) -> HardwareBlock:
        """Device names and counts for the run record."""
        ...

    def train_step(self) -> Any:
        """Enqueue one training step and return a handle to its loss without waiting for it."""
        ...

    def sync(self) -> None:
        """Block until every queued step has finished on the device (window edges)."""
        ...

    def mark_phases(self, recorder: PhaseRecorder) -> None:
        """Mark forward, backward, optimizer (and gradient reduction) of each step on `recorder`."""
        ...

    def phase_replays(self) -> list[Replay]:
        """Each phase as a callable for the replay estimator (joulebench.phases.replay_phases)."""
        ...

    def loss_value(self, handle: Any) -> float:
        """Mean loss over all replicas of the step behind `handle`; collective, host sync."""
        ...

    def any_rank(self, flag: bool) -> bool:
        """True on every rank if `flag` is true on any rank; collective."""
        ...

    def gather(self, obj: Any) -> list[Any]:
        """A JSON-serialisable object from every rank, in rank order, on every rank; collective."""
        ...

    def close(self) -> None: ...


class BackendModule(Protocol):
    """The two functions each backend module exposes."""

    def discover(self, config: TrainConfig, launch: LaunchEnv) -> tuple[int, str]:
        """(replicas of the whole run, device kind), by looking only: no device is initialised."""
        ...

    def create(self, config: TrainConfig, launch: LaunchEnv) -> Backend: ...


def load_backend(framework: str) -> BackendModule:
    """Import a backend, turning a missing framework into a validation error with the install command."""
    missing = [module for module in REQUIRED_MODULES[framework] if importlib.util.find_spec(module) is None]
    if missing:
        raise ValidationError(
            f"--framework {framework} but {', '.join(missing)} is not installed", INSTALL_HINT[framework]
        )
    if framework == "tensorflow":
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # hides cuInit noise on CPU-only hosts
    name = {"pytorch": "resnet50.torch_backend", "tensorflow": "resnet50.tf_backend"}[framework]
    return importlib.import_module(name)
