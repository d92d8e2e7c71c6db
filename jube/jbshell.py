"""The profile settings that become command lines: one check per kind of value, run when the profile is validated.

Why: a quote left open or a `;` in a free-form setting used to pass validation and break later (a traceback in
the submit step, no row, a job without its finalizer), and job.sh and the Python tools split some of these values
differently. Three kinds (COMMAND_KEYS):
- shell lines (`setup`): run by bash before every command of the job (job.sh's `eval`, jbsettings.in_profile_shell);
  checked with `bash -n`. Every shell construct is allowed: both consumers evaluate the same text the same way.
- shell words (`container`, `sbatch_args`, `finalizer_sbatch_args`, `srun_args`, `server_<ENGINE>`,
  `server_version_<ENGINE>`): split like a command line (shlex) and passed as they are, never to a shell. What a
  shell would read differently from shlex is refused: an operator or expansion outside quotes (`;`, `|`, `&`, `<`,
  `>`, `(`, `)`, a newline, `$`, a backtick, a `#` comment), `$` or a backtick inside double quotes, a backslash
  before `$`, a backtick or a line break inside double quotes, a backslash at a line's end (an INI continuation
  line), a word starting with an unquoted `~`, and brace expansion (`{a,b}`, `{1..3}`). job.sh reads the canonical
  form (shlex.join of the words) into arrays, so a value means the same words in the job as in the Python tools.
- a program (`python`): one word that needs no quoting in a shell (job.sh runs it as "$PY").
Standard library only (Python >= 3.10).
"""

from __future__ import annotations

import re
import shlex
import subprocess

from jbsystems import ConfigError, override_variable, value_source

LINES, WORDS, PROGRAM = "shell lines", "shell words", "program"
WORD_KEYS = ("container", "sbatch_args", "finalizer_sbatch_args", "srun_args")
SERVER_TEMPLATE_PREFIX = "server_"
SERVER_VERSION_PREFIX = "server_version_"  # a word key too: the command that prints the server's version
SERVER_NOT_COMMANDS = ("server_extra_", "server_api", "server_ready_timeout_s")  # JSON, a choice, a number
SERVER_SETTINGS = (SERVER_VERSION_PREFIX, *SERVER_NOT_COMMANDS)  # server_ keys that do not name an engine
OPERATORS = ";&|<>()\n"
EXPANSIONS = "$`"  # expanded by a shell also inside double quotes


def command_keys(profile: dict[str, str]) -> dict[str, str]:
    """Every profile key whose value becomes (part of) a command line, and its kind."""
    kinds = {"setup": LINES, "python": PROGRAM, **{key: WORDS for key in WORD_KEYS}}
    kinds.update({key: WORDS for key in profile
                  if key.startswith(SERVER_TEMPLATE_PREFIX) and not key.startswith(SERVER_NOT_COMMANDS)})
    return kinds


def _where(profile: dict[str, str], key: str, environ: dict[str, str]) -> str:
    """Where the value came from, and the variable that wins over every source."""
    source = value_source(profile["system"], key, environ)
    override = override_variable(profile["system"], key)
    return f"set in {source}" + ("" if source == override else f"; {override} wins over it")


def _shell_difference(value: str) -> tuple[str, str] | None:
    """(problem, fix) for the first place where a shell would read `value` other than as the words shlex splits it
    into (an operator, an expansion, a comment, a line continuation, `~`, `{a,b}`), or None."""
    quote, escaped, word_start, brace = "", False, True, False
    for index, char in enumerate(value):
        if escaped:
            if char == "\n":
                return "continues over a line break with a backslash (an INI continuation line)", "write it on one line"
            escaped, word_start = False, False
        elif quote == "'":
            quote = "" if char == "'" else quote
        elif char == "\\":
            if quote and value[index + 1:index + 2] in (*EXPANSIONS, "\n"):
                return (f"has a backslash before {value[index + 1]!r} inside double quotes, which a shell and "
                        "Python's shlex read differently", "put a literal $ or backtick in single quotes")
            escaped = True
        elif quote == '"':
            if char in EXPANSIONS:
                return (f"has {char!r} inside double quotes, which a shell would expand",
                        "single-quote a literal $ or backtick; shell commands and variables belong in setup")
            quote = "" if char == '"' else quote
        elif char in OPERATORS or char in EXPANSIONS or (char == "#" and word_start):
            return (f"has shell syntax ({char!r}, unquoted)", "quote a character meant literally (e.g. "
                    "'--comment=a;b'); shell commands and variables belong in setup")
        elif char == "~" and word_start:
            return "starts a word with an unquoted '~', a home directory only to a shell", "write the full path"
        elif char == "{":
            brace, word_start = True, False
        elif brace and (char == "," or value.startswith("..", index)):
            return "has brace expansion ({a,b}), several words only to a shell", "write the words out"
        elif char in "'\"":
            quote, word_start = char, False
        else:
            word_start = char in " \t"
            brace = brace and char not in " \t}"
    return None


def shell_words(profile: dict[str, str], key: str, environ: dict[str, str]) -> list[str]:
    """The value of `key` split into words as every consumer splits it; ConfigError where a shell would differ."""
    value = profile[key]
    try:
        words = shlex.split(value)
    except ValueError as exc:
        raise ConfigError(f"profile key {key} = {value!r} cannot be split into shell words ({exc})",
                          "close the quote, or escape a literal quote or backslash with a backslash "
                          f"({_where(profile, key, environ)})") from None
    difference = _shell_difference(value)
    if difference is not None:
        problem, fix = difference
        raise ConfigError(f"profile key {key} = {value!r} {problem}: its words are passed as they are, no shell "
                          "expands or runs anything in them", f"{fix} ({_where(profile, key, environ)})")
    return words


def shell_lines(profile: dict[str, str], key: str, environ: dict[str, str]) -> str:
    """The value of `key` if bash can parse it (`bash -n`: syntax only, nothing runs); ConfigError with bash's words."""
    value = profile[key]
    if not value.strip():
        return value
    try:
        proc = subprocess.run(["bash", "-n", "-c", value], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ConfigError(f"cannot check profile key {key} with bash -n ({exc})",
                          "install bash on this node: the job script runs with it") from None
    said = " ".join(re.sub(r"^bash: (-c: )?(line \d+: )?", "", line) for line in proc.stderr.splitlines())
    if proc.returncode != 0 or said:
        said = said or f"bash -n: exit {proc.returncode}"
        raise ConfigError(f"profile key {key} = {value!r} is not valid shell ({said})",
                          f"close the quote, bracket or here-document; these lines run in bash before every command "
                          f"of the job ({_where(profile, key, environ)})")
    return value


def program(profile: dict[str, str], key: str, environ: dict[str, str]) -> str:
    """The value of `key` as one program name or path, which every consumer runs the same way."""
    value = profile[key]
    if value and (shlex.quote(value) != value or value.startswith("~")):
        raise ConfigError(f"profile key {key} = {value!r} is not a program name or path: it is run as one word, "
                          "without a shell (no spaces, quotes, ~, $ or other shell syntax)",
                          f"set {key} to the interpreter's full path or a name on PATH; put module loads and "
                          f"activations into setup ({_where(profile, key, environ)})")
    return value


CHECKS = {LINES: shell_lines, WORDS: shell_words, PROGRAM: program}


def check_command_values(profile: dict[str, str], environ: dict[str, str]) -> dict[str, str]:
    """Check every command-line-forming key of the resolved profile (ConfigError naming key, value and fix); returns
    the values job.sh reads: the word keys in their canonical form (shlex.join of the words)."""
    canonical = {}
    for key, kind in command_keys(profile).items():
        checked = CHECKS[kind](profile, key, environ)
        if key in WORD_KEYS:
            canonical[key] = shlex.join(checked)
    return canonical
