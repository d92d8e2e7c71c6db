"""Keep TensorFlow out of processes that never use it.

Why: megatron.core.timers imports torch.utils.tensorboard, which resolves TensorBoard's TF API through
`tensorboard.compat.tf`; where TensorFlow is installed (the Keras ResNet-50 extra, the test environment) that imports
all of TensorFlow: 2.7 s of every training start on a 2-core machine and TensorFlow's log lines in every run's output.
TensorBoard selects its own stub API when a module named `tensorboard.compat.notf` exists; the stub covers what
SummaryWriter and the exports' event writer use.
"""

from __future__ import annotations

import sys
import types

_NO_TENSORFLOW_SWITCH = "tensorboard.compat.notf"


def tensorboard_without_tensorflow() -> None:
    """Make TensorBoard use its stub TF API in this process; call before anything imports TensorBoard."""
    sys.modules.setdefault(_NO_TENSORFLOW_SWITCH, types.ModuleType(_NO_TENSORFLOW_SWITCH))
