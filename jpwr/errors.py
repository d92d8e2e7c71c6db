"""Error types and process exit codes shared by jpwr and every driver."""

from __future__ import annotations

import enum
import sys
from collections.abc import Callable


class ExitCode(enum.IntEnum):
    """Exit codes of jpwr itself; a wrapped command's own code is passed through unchanged.

    They sit above the range used by ordinary programs (0-2) and below the 128+N signal range,
    so a caller can tell a jpwr failure from the wrapped command's failure.
    """

    OK = 0
    USAGE = 64  # bad command line or configuration (EX_USAGE)
    UNAVAILABLE = 69  # an explicitly requested method is not available here (EX_UNAVAILABLE)
    SOFTWARE = 70  # internal error in jpwr (EX_SOFTWARE)
    CANT_CREATE = 73  # output directory cannot be created or written (EX_CANTCREAT)
    NO_COMMAND = 127  # the wrapped command was not found


class JpwrError(Exception):
    """Base class of errors raised deliberately by joulebench code."""

    exit_code: ExitCode = ExitCode.SOFTWARE


class ValidationError(JpwrError):
    """A configuration value that cannot work, with the offending value and the fix.

    The message always has the form "<problem>. Fix: <fix>" so that users can act on it
    without reading the source; it is raised before any job is submitted or device touched.
    """

    exit_code = ExitCode.USAGE

    def __init__(self, problem: str, fix: str) -> None:
        self.problem = problem.rstrip(".")
        self.fix = fix
        super().__init__(f"{self.problem}. Fix: {fix}")


class MethodUnavailableError(JpwrError):
    """An explicitly requested measurement method cannot run on this machine."""

    exit_code = ExitCode.UNAVAILABLE


class OutputDirError(JpwrError):
    """The output directory cannot be created or written."""

    exit_code = ExitCode.CANT_CREATE


def exit_code_of(prog: str, command: Callable[[], int]) -> int:
    """Run one CLI command; a JpwrError (raised before any device work) becomes "<prog>: error: ..." on
    stderr and its own exit code, so every joulebench command reports bad input the same way."""
    try:
        return int(command())
    except JpwrError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return int(exc.exit_code)
