"""Keep TensorFlow out of the drivers that do not use it (llm_training, llm_inference).

Why: megatron.core.timers imports torch.utils.tensorboard, which imports TensorFlow wherever it is installed (the
test environment, a site's shared venv): each run then prints TensorFlow's start-up log lines (oneDNN, CPU
features, absl) on stderr, which TF_CPP_MIN_LOG_LEVEL does not all silence, and spends seconds loading it.
tensorboard works without it (its own stub writes the event files `--log-to tensorboard` needs).
"""

from __future__ import annotations

import sys


def keep_tensorflow_out() -> None:
    """Make `import tensorflow` fail fast in this process (as if not installed), unless it is already loaded."""
    sys.modules.setdefault("tensorflow", None)  # type: ignore[arg-type]  # None in sys.modules: ImportError
