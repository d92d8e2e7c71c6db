"""Optional extras: a missing one is named, with the pip command that installs it, when it is needed.

No `--help` needs an extra (parsers import no optional library). A command that does need one and
does not find it fails with "<module> is not installed (...). Fix: pip install 'joulebench[<extra>]'"
and exit code 69, through jpwr.errors.exit_code_of, which every command line runs under.
"""

from __future__ import annotations

from jpwr.errors import ExitCode, JpwrError

# Top-level module -> the extra of pyproject.toml that installs it. torch belongs to several extras
# (llm, inference, resnet-pytorch): the command line that needs it names its own.
EXTRA_OF_MODULE = {
    "matplotlib": "reports", "pandas": "reports", "pynvml": "nvidia", "megatron": "llm", "tokenizers": "llm",
    "psutil": "llm", "transformers": "inference", "torchvision": "resnet-pytorch", "tensorflow": "resnet-tensorflow",
    "keras": "resnet-tensorflow", "spython": "test", "pytest": "test", "hypothesis": "test",
}


def install_hint(module: str, torch_extra: str | None = None) -> str | None:
    """The pip command that installs `module` (a top-level name), or None when no extra provides it."""
    extra = torch_extra if module == "torch" else EXTRA_OF_MODULE.get(module)
    return None if extra is None else f"pip install 'joulebench[{extra}]'"


class MissingExtraError(JpwrError):
    """An optional library a command needs is not installed."""

    exit_code = ExitCode.UNAVAILABLE

    def __init__(self, module: str, hint: str) -> None:
        self.module = module
        super().__init__(f"{module} is not installed (an optional extra this command needs). Fix: {hint}")


def missing_extra(exc: ModuleNotFoundError, torch_extra: str | None = None) -> MissingExtraError | None:
    """The extra behind a failed import, or None when the module is not one of ours to name (a real bug)."""
    module = (exc.name or "").split(".")[0]
    hint = install_hint(module, torch_extra)
    return None if hint is None else MissingExtraError(module, hint)
