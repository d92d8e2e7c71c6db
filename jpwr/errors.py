"""public: for command lines that share jpwr's error boundary (jpwr's own, the drivers', joulebench's).

Error types, process exit codes and the one error boundary shared by jpwr and every driver. The error types and
ExitCode are in jpwr's top-level API (`from jpwr import ValidationError`); this module adds the boundary itself.
"""

from __future__ import annotations

import argparse
import contextlib
import enum
import errno
import io
import signal
import sys
import textwrap
import threading
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NoReturn

__all__ = ["WIDTH", "ArgumentParser", "exit_code_of", "stop_if_interrupted", "take_debug_flag"]

DEBUG_FLAG = "--debug"
WIDTH = 160  # columns of a line a person reads (a terminal beside an editor): errors and every verb's default output


class ExitCode(enum.IntEnum):
    """Exit codes of jpwr itself; a wrapped command's own code is passed through unchanged.

    They sit above the range used by ordinary programs (0-2) and below the 128+N signal range,
    so a caller can tell a jpwr failure from the wrapped command's failure (BSD sysexits values).
    """

    OK = 0
    USAGE = 64  # bad command line or configuration (EX_USAGE)
    DATA = 65  # an input file is corrupt, truncated or not what it claims to be (EX_DATAERR)
    UNAVAILABLE = 69  # an explicitly requested method is not available here (EX_UNAVAILABLE)
    SOFTWARE = 70  # internal error in jpwr (EX_SOFTWARE)
    CANT_CREATE = 73  # output directory cannot be created or written (EX_CANTCREAT)
    IO = 74  # reading or writing a file failed (EX_IOERR), e.g. a full disk, or a device rejected a settings call
    NO_PERMISSION = 77  # a device setting is not permitted on this system (EX_NOPERM)
    NOT_EXECUTABLE = 126  # the wrapped command exists but cannot be executed (as a shell says)
    NO_COMMAND = 127  # the wrapped command was not found


INTERRUPTED = 128 + int(signal.SIGINT)  # 130: Ctrl-C, as a shell reports it


class JpwrError(Exception):
    """Base class of errors raised deliberately by joulebench code."""

    exit_code: ExitCode = ExitCode.SOFTWARE
    details: tuple[str, ...] = ()  # lines printed before the one-line error: what would make that line too long


class ValidationError(JpwrError):
    """A configuration value that cannot work, with the offending value and the fix.

    The message always has the form "<problem>. Fix: <fix>" so that users can act on it
    without reading the source; it is raised before any job is submitted or device touched.
    """

    exit_code = ExitCode.USAGE

    def __init__(self, problem: str, fix: str, details: Sequence[str] = ()) -> None:
        self.problem = problem.rstrip(".")
        self.fix = fix
        self.details = tuple(details)  # e.g. every run left out, one a line; the message names how many
        super().__init__(f"{self.problem}. Fix: {fix}")


class FormatError(ValidationError):
    """An input file that cannot be read as what it should be: names the file, the defect and the fix."""

    exit_code = ExitCode.DATA


class MethodUnavailableError(JpwrError):
    """An explicitly requested measurement method cannot run on this machine."""

    exit_code = ExitCode.UNAVAILABLE


class OutputDirError(JpwrError):
    """The output directory cannot be created or written."""

    exit_code = ExitCode.CANT_CREATE


def take_debug_flag(argv: Sequence[str]) -> tuple[bool, list[str]]:
    """Remove `--debug` from a command line (before a `--`: what follows belongs to a wrapped command)."""
    args = list(argv)
    end = args.index("--") if "--" in args else len(args)
    if DEBUG_FLAG in args[:end]:
        args.remove(DEBUG_FLAG)
        return True, args
    return False, args


def signal_death(signum: int) -> str:
    """How a parent words a child that a signal ended. SIGKILL is what the kernel's out-of-memory killer sends, and
    the killed process cannot say so itself: only its parent (`jpwr --`, the JUBE job) can name the likely cause."""
    try:
        name = signal.Signals(signum).name
    except ValueError:
        name = "unknown signal"
    if signum == signal.SIGKILL:
        return f"killed by signal {signum} (out of memory?)"
    return f"killed by signal {signum} ({name})"


def os_error_message(exc: OSError) -> str:
    """One line for a failed file operation: what failed, on which file, and what to do about it."""
    where = f" {exc.filename}" if exc.filename else ""
    fixes = {
        errno.ENOSPC: "free space on that file system, or write the output elsewhere (--out / --out-dir)",
        errno.EDQUOT: "free quota on that file system, or write the output elsewhere (--out / --out-dir)",
        errno.EACCES: "check the permissions of that path, or choose another one",
        errno.EPERM: "check the permissions of that path, or choose another one",
        errno.ENOENT: "check the path: it (or its directory) does not exist",
        errno.EROFS: "that file system is read-only: write the output elsewhere",
    }
    fix = fixes.get(exc.errno or 0, "check the path and the file system")
    return f"{exc.strerror or exc}:{where}. Fix: {fix}"


def exit_code_of(prog: str, command: Callable[[], int], debug: bool = False,
                 extras: Mapping[str, str] | None = None) -> int:
    """Run one CLI command behind the one error boundary every joulebench command shares.

    A JpwrError (bad input, raised before any device work), an OSError (a full disk, a missing
    file) and a text file that is not UTF-8 (65) become one line "<prog>: error: ..." on stderr with their
    sysexits code (a JpwrError's details, e.g. every run it left out, one a line above it); a missing optional
    library names the extra that installs it (69): the meter's own (jpwr.extras) and `extras`, the
    command line's module -> extra table (joulebench.boundary passes the drivers' and analysis'); anything
    else is an internal error (70); Ctrl-C that reaches it (the imports before a run installs its handlers) exits
    130 with one line, never a traceback. `--debug` adds the traceback.
    """
    from jpwr.extras import missing_extra
    from jpwr.output import ESCAPED

    for stream in (sys.stdout, sys.stderr):  # a path whose name is not UTF-8 prints escaped (jpwr.output.printable)
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(errors=ESCAPED)
    try:
        with _interrupts_heard():
            return int(command())
    except KeyboardInterrupt:  # Ctrl-C outside a run's own handler (imports, tools opening before it): one line
        return _report(prog, "stopped by Ctrl-C (SIGINT) outside a run: no run was going on (a run that had begun "
                             "wrote its record)", INTERRUPTED, debug)
    except ModuleNotFoundError as exc:
        error = missing_extra(exc, extras)
        if error is not None:
            return _report(prog, str(error), int(error.exit_code), debug)
        return _internal(prog, exc, debug)
    except JpwrError as exc:
        return _report(prog, str(exc), int(exc.exit_code), debug, exc.details)
    except OSError as exc:
        return _report(prog, os_error_message(exc), int(ExitCode.IO), debug)
    except UnicodeDecodeError as exc:  # a text input (profile, schedule, CSV, corpus) that is not text
        return _report(prog, f"an input file is not UTF-8 text ({exc.reason} at byte {exc.start}). Fix: save it as "
                             "UTF-8, or check that the option names the intended file (--debug shows which read "
                             "failed)", int(ExitCode.DATA), debug)
    except Exception as exc:
        return _internal(prog, exc, debug)
    finally:  # every Ctrl-C that reached this point was handled, here or by the command (a run's second-Ctrl-C one)
        _forget_unhandled_interrupt()


def _forget_unhandled_interrupt() -> None:
    """A KeyboardInterrupt that left code run from a string (`exec`/`eval` of source: dataclasses and namedtuple build
    their methods so, at import) sets CPython's "unhandled Ctrl-C" flag, and `python -m`/`python FILE` then ends the
    process by SIGINT after finalizing (exit -2, not the exit code chosen), even once the exception was handled, by
    this boundary or inside the command: seen once under load, Ctrl-C landing in a driver's imports. Running an empty
    source string resets it."""
    exec("", {})  # no input: CPython clears the flag before each evaluation of source


_heard_interrupts: list[int] = []  # SIGINTs delivered while a command ran behind exit_code_of


@contextlib.contextmanager
def _interrupts_heard() -> Iterator[None]:
    """Python's own Ctrl-C handler, counting: a KeyboardInterrupt raised where Python or a library swallows it (a
    __del__ or GC callback running at that moment prints "Exception ignored", a bare except in an import) would
    otherwise be lost, and the command would run to its end. stop_if_interrupted() raises it again."""
    main = threading.current_thread() is threading.main_thread()
    if not main or signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield  # someone else's handler (a host program, a test runner's thread): leave it alone
        return

    def heard(signum: int, frame: Any) -> None:
        _heard_interrupts.append(signum)
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, heard)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def stop_if_interrupted() -> None:
    """Raise KeyboardInterrupt if Ctrl-C reached this command before now: called where a run installs its own
    handlers, so a Ctrl-C during the imports that something swallowed still stops the command before its run."""
    if _heard_interrupts:
        raise KeyboardInterrupt


def _internal(prog: str, exc: Exception, debug: bool) -> int:
    return _report(prog, f"internal error: {type(exc).__name__}: {exc} (run again with --debug for the "
                         "traceback, and please report it)", int(ExitCode.SOFTWARE), debug)


def _report(prog: str, message: str, code: int, debug: bool, details: Sequence[str] = ()) -> int:
    """The error on stderr after its details, each detail wrapped to WIDTH columns; the error line as _error_line
    says."""
    if debug:
        traceback.print_exc()
    for detail in details:
        print(_wrapped(f"{prog}: {detail}"), file=sys.stderr)
    print(_error_line(prog, message), file=sys.stderr)
    return code


def _error_line(prog: str, message: str) -> str:
    """The error line, wrapped on a terminal only: in a log or a pipe it stays one line, which the JUBE recorder
    (jbrecord.py, the row's note from job.err) and a user's grep read whole."""
    line = f"{prog}: error: {message}"
    return _wrapped(line) if sys.stderr.isatty() else line


# Actions whose repetition is a list (each occurrence adds), or that take no value to repeat: never refused twice.
LIST_ACTIONS = (argparse._AppendAction, argparse._AppendConstAction, argparse._ExtendAction, argparse._CountAction)
UNCHECKED_ACTIONS = (*LIST_ACTIONS, argparse._HelpAction, argparse._VersionAction, argparse._SubParsersAction)
REPEAT_NOTE = "repeat the option for more"  # what a list option's help says (added where it does not)


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser, its usage errors said like the boundary's: argparse wraps its usage lines to the terminal
    but never its error line (an invalid choice lists every choice), so that line wraps here to WIDTH columns on a
    terminal and stays one line in a log. Subcommands' parsers are of this class too (add_subparsers' default).

    The one rule on repetition, for every command: argparse keeps the last of an option given twice, silently;
    here an option given twice with different values (`--objective speed --objective energy`, `--device cpu
    --device cuda`, a flag and its `--no-` form) is refused (exit 2) naming both values; given twice alike it is
    one. An option whose repetition makes a list (`action="append"`) says so in its help. `excludes=(OPTION, ...)`
    declares options it has no meaning beside (a trace's requests are its own: `--requests` with `--trace`):
    given together they are refused naming both."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._given: dict[str, tuple[str, Any]] = {}  # dest -> (the option that set it, its value), this parse

    def add_argument(self, *args: Any, excludes: Sequence[str] = (), **kwargs: Any) -> argparse.Action:
        return _checked(super().add_argument(*args, **kwargs), excludes)

    def add_argument_group(self, *args: Any, **kwargs: Any) -> argparse._ArgumentGroup:
        group = _Group(self, *args, **kwargs)  # as argparse's, of the class that keeps the rule
        self._action_groups.append(group)
        return group

    def add_mutually_exclusive_group(self, **kwargs: Any) -> argparse._MutuallyExclusiveGroup:
        return _exclusive_group(self, **kwargs)

    def parse_known_args(self, *args: Any, **kwargs: Any) -> Any:
        self._given = {}
        parsed = super().parse_known_args(*args, **kwargs)
        given = {option for option, _ in self._given.values()}
        for action in self._actions:
            mine = next((o for o in action.option_strings if o in given), None)
            other = next((o for o in _EXCLUDES.get(action, ()) if o in given), None)
            if mine and other:
                self.error(f"{mine} and {other} both given: {mine} has no meaning beside {other} and would be "
                           f"ignored; leave {mine} out")
        return parsed

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(2, _error_line(self.prog, message) + "\n")


class _Group(argparse._ArgumentGroup):
    """An argument group of ArgumentParser: its options follow the parser's rule on repetition."""

    def add_argument(self, *args: Any, excludes: Sequence[str] = (), **kwargs: Any) -> argparse.Action:
        return _checked(super().add_argument(*args, **kwargs), excludes)

    def add_mutually_exclusive_group(self, **kwargs: Any) -> argparse._MutuallyExclusiveGroup:
        return _exclusive_group(self, **kwargs)


class _ExclusiveGroup(argparse._MutuallyExclusiveGroup):
    def add_argument(self, *args: Any, excludes: Sequence[str] = (), **kwargs: Any) -> argparse.Action:
        return _checked(super().add_argument(*args, **kwargs), excludes)


def _exclusive_group(container: argparse._ActionsContainer, **kwargs: Any) -> argparse._MutuallyExclusiveGroup:
    """As argparse's add_mutually_exclusive_group (the group registered with its container), of the class that keeps
    the rule on repetition."""
    group = _ExclusiveGroup(container, **kwargs)
    container._mutually_exclusive_groups.append(group)
    return group


_ONCE_CLASSES: dict[type, type] = {}
_EXCLUDES: dict[argparse.Action, tuple[str, ...]] = {}  # an action -> the options it has no meaning beside


def _checked(action: argparse.Action, excludes: Sequence[str]) -> argparse.Action:
    """The action under the rule on repetition: a list action's help says it repeats; any other refuses a second,
    different value (its class swapped for a subclass that checks before it stores: custom actions included)."""
    if excludes:
        _EXCLUDES[action] = tuple(excludes)
    if isinstance(action, LIST_ACTIONS):
        if action.help not in (None, argparse.SUPPRESS) and "repeat" not in action.help:
            action.help = f"{action.help} ({REPEAT_NOTE})"
        return action
    if not isinstance(action, UNCHECKED_ACTIONS):
        kind = type(action)
        if kind not in _ONCE_CLASSES:
            _ONCE_CLASSES[kind] = type(f"Once{kind.__name__}", (_Once, kind), {})
        action.__class__ = _ONCE_CLASSES[kind]
    return action


class _Once(argparse.Action):
    """Refuse a second occurrence of the option (or another spelling of its dest) with a different value."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        super().__call__(parser, namespace, values, option_string)
        given = getattr(parser, "_given", None)
        if given is None or not self.option_strings:
            return
        option, value = option_string or self.dest, getattr(namespace, self.dest, None)  # what it stored
        if self.dest in given and given[self.dest][1] != value:
            first, earlier = given[self.dest]
            keep = f"give {option} once" if first == option else f"give one of {first} and {option}"
            parser.error(f"{first} {_said(earlier)} and {option} {_said(value)} both given: only the last would "
                         f"count; {keep}")
        given.setdefault(self.dest, (option, value))


def _said(value: Any) -> str:
    """An option's value as the user gave it (a flag's True/False as on/off)."""
    if isinstance(value, bool) or value is None:
        return {True: "(on)", False: "(off)", None: "(given)"}[value]
    if isinstance(value, list | tuple):
        return " ".join(map(str, value))
    return str(value)


def _wrapped(text: str) -> str:
    """Each line of `text` in lines of at most WIDTH columns, the further ones indented; words are never split (a
    path or an option stays whole, even where it alone is longer)."""
    return "\n".join("\n".join(textwrap.wrap(line, WIDTH, subsequent_indent="    ", break_long_words=False,
                                             break_on_hyphens=False) or [line]) for line in text.split("\n"))
