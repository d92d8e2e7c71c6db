"""Optional extras: a missing one is named, with the pip command that installs it, when it is needed.

No `--help` needs an extra (parsers import no optional library). A command that does need one and
does not find it fails with "<module> is not installed (...). Fix: pip install 'joulebench[<extra>]'"
and exit code 69, through jpwr.errors.exit_code_of, which every command line runs under. The meter
names the extras of the libraries it loads itself; a command line built on it passes the table of
its own (the core's joulebench.boundary does, for the drivers and the analysis verbs).
"""

from __future__ import annotations

from collections.abc import Mapping

from jpwr.errors import ExitCode, JpwrError

# Top-level module -> the extra of pyproject.toml that installs it, for what the meter itself imports.
METER_EXTRAS = {"pynvml": "nvidia"}


def install_hint(module: str, extras: Mapping[str, str] | None = None) -> str | None:
    """The pip command that installs `module` (a top-level name), or None when no extra provides it.

    `extras` (module -> extra) adds a command line's own modules to the meter's."""
    extra = (extras or {}).get(module) or METER_EXTRAS.get(module)
    return None if extra is None else f"pip install 'joulebench[{extra}]'"


class MissingExtraError(JpwrError):
    """An optional library a command needs is not installed."""

    exit_code = ExitCode.UNAVAILABLE

    def __init__(self, module: str, hint: str) -> None:
        self.module = module
        super().__init__(f"{module} is not installed (an optional extra this command needs). Fix: {hint}")


def missing_extra(exc: ModuleNotFoundError, extras: Mapping[str, str] | None = None) -> MissingExtraError | None:
    """The extra behind a failed import, or None when the module is not one of ours to name (a real bug)."""
    module = (exc.name or "").split(".")[0]
    hint = install_hint(module, extras)
    return None if hint is None else MissingExtraError(module, hint)
