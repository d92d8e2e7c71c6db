"""The error boundary of the drivers' and analysis' command lines: jpwr's, naming the product's extras.

jpwr.exit_code_of is the one boundary (the meter's own command line needs it too) and names the extras
of what the meter loads; which extra brings a framework, a report library or a test tool is the
product's knowledge, kept here with the extras of pyproject.toml.
"""

from __future__ import annotations

from collections.abc import Callable

from jpwr.errors import exit_code_of as jpwr_exit_code_of

# Top-level module -> the extra of pyproject.toml that installs it (the meter's own, e.g. pynvml, are jpwr's).
# torch belongs to several extras (llm, inference, resnet-pytorch): the command line that needs it names its own.
EXTRA_OF_MODULE = {
    "matplotlib": "reports", "pandas": "reports", "megatron": "llm", "tokenizers": "llm", "psutil": "llm",
    "transformers": "inference", "torchvision": "resnet-pytorch", "tensorflow": "resnet-tensorflow",
    "keras": "resnet-tensorflow", "spython": "test", "pytest": "test", "hypothesis": "test",
}


def exit_code_of(prog: str, command: Callable[[], int], debug: bool = False, torch_extra: str | None = None) -> int:
    """Run one driver or analysis command behind jpwr's error boundary; `torch_extra` is the extra that
    brings torch for this command line (a missing torch is then named with it, exit 69)."""
    extras = EXTRA_OF_MODULE if torch_extra is None else {**EXTRA_OF_MODULE, "torch": torch_extra}
    return jpwr_exit_code_of(prog, command, debug, extras)
