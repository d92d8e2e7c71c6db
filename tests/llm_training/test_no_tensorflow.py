"""A training process never imports TensorFlow (megatron-core pulls in TensorBoard, which would load all of it)."""

import subprocess
import sys

import pytest


def test_a_training_process_leaves_tensorflow_unimported():
    pytest.importorskip("tensorflow")  # where it is not installed there is nothing to keep out
    probe = ("import sys, llm_training.train; "
             "print('tensorflow' in sys.modules, 'torch.utils.tensorboard' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300, check=True)
    assert done.stdout.split() == ["False", "True"], done.stdout + done.stderr[-2000:]
    assert "oneDNN" not in done.stderr  # TensorFlow's start-up log line
