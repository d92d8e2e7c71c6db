"""joulebench.tensorflow_free: the drivers that never use TensorFlow do not load it (nor print its start-up log
lines), and `--log-to tensorboard` still writes its event files (tensorboard's own stub)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_documented_commands import REPO, as_installed

SCRIPT = """
import sys
from joulebench.tensorflow_free import tensorboard_without_tensorflow
tensorboard_without_tensorflow()
import megatron.core.timers  # pulls in torch.utils.tensorboard, which imports TensorFlow where installed
from torch.utils.tensorboard import SummaryWriter
writer = SummaryWriter(sys.argv[1])
writer.add_scalar("energy_j", 1.5, 0)
writer.close()
print(sorted(name for name, module in sys.modules.items() if name.startswith("tensorflow") and module is not None))
"""


def test_tensorflow_is_not_loaded_and_tensorboard_still_writes(tmp_path: Path) -> None:
    pytest.importorskip("megatron.core")
    result = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "tb")], cwd=REPO, env=as_installed(),
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == "[]"
    assert "oneDNN" not in result.stderr and "cpu_feature_guard" not in result.stderr, result.stderr[-2000:]
    assert list((tmp_path / "tb").glob("events.out.tfevents.*"))


def test_a_training_process_leaves_tensorflow_unimported():
    pytest.importorskip("tensorflow")  # where it is not installed there is nothing to keep out
    probe = ("import sys, llm_training.train; "
             "print('tensorflow' in sys.modules, 'torch.utils.tensorboard' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", probe], cwd=REPO, env=as_installed(), capture_output=True, text=True,
                          timeout=300, check=True)
    assert done.stdout.split() == ["False", "True"], done.stdout + done.stderr[-2000:]
    assert "oneDNN" not in done.stderr  # TensorFlow's start-up log line
