"""The profile settings that become command lines: one check per kind of value, run when the profile is validated.

Why: a quote left open or a `;` in a free-form setting used to pass validation and break later (a traceback in
the submit step, no row, a job without its finalizer), and job.sh and the Python tools split some of these values
differently. Three kinds (COMMAND_KEYS):
- shell lines (`setup`): run by bash before every command of the job (job.sh's `eval`, jbsettings.in_profile_shell);
  checked with `bash -n`. Every shell construct is allowed: both consumers evaluate the same text the same way.
- shell words (`container`, `sbatch_args`, `finalizer_sbatch_args`, `srun_args`, `server_<ENGINE>`,
  `server_version_<ENGINE>`): split like a command line (shlex) and passed as they are, never to a shell. A shell
  operator or expansion outside quotes (`;`, `|`, `&`, `<`, `>`, `(`, `)`, a newline, `$`, a backtick, a `#`
  comment) would mean something else typed at a prompt than here, so it is refused. job.sh reads the canonical
  form (shlex.join of the words) into arrays, so a value means the same words in the job as in the Python tools.
- a program (`python`): one word that needs no quoting in a shell (job.sh runs it as "$PY").
Standard library only (Python >= 3.8).
"""

from __future__ import annotations

import shlex
import subprocess

from jbsystems import ConfigError, override_variable

LINES, WORDS, PROGRAM = "shell lines", "shell words", "program"
WORD_KEYS = ("container", "sbatch_args", "finalizer_sbatch_args", "srun_args")
SERVER_TEMPLATE_PREFIX = "server_"
SERVER_NOT_COMMANDS = ("server_extra_", "server_api", "server_ready_timeout_s")  # JSON, a choice, a number
OPERATORS = ";&|<>()\n"
EXPANSIONS = "$`"  # expanded by a shell also inside double quotes


def command_keys(profile: dict[str, str]) -> dict[str, str]:
    """Every profile key whose value becomes (part of) a command line, and its kind."""
    kinds = {"setup": LINES, "python": PROGRAM, **{key: WORDS for key in WORD_KEYS}}
    kinds.update({key: WORDS for key in profile
                  if key.startswith(SERVER_TEMPLATE_PREFIX) and not key.startswith(SERVER_NOT_COMMANDS)})
    return kinds


def _where(profile: dict[str, str], key: str) -> str:
    return f"in the profile file, or through {override_variable(profile['system'], key)}"


def _unquoted_shell_syntax(value: str) -> str | None:
    """The first character a shell would act on (an operator, an expansion, a comment), or None."""
    quote, escaped, word_start = "", False, True
    for char in value:
        if escaped:
            escaped, word_start = False, False
        elif quote == "'":
            quote = "" if char == "'" else quote
        elif char == "\\":
            escaped = True
        elif quote == '"':
            if char in EXPANSIONS:
                return char
            quote = "" if char == '"' else quote
        elif char in OPERATORS or char in EXPANSIONS or (char == "#" and word_start):
            return char
        elif char in "'\"":
            quote, word_start = char, False
        else:
            word_start = char in " \t"
    return None


def shell_words(profile: dict[str, str], key: str) -> list[str]:
    """The value of `key` split into words as every consumer splits it; ConfigError where a shell would differ."""
    value = profile[key]
    try:
        words = shlex.split(value)
    except ValueError as exc:
        raise ConfigError(f"profile key {key} = {value!r} cannot be split into shell words ({exc})",
                          "close the quote, or escape a literal quote or backslash with a backslash "
                          f"({_where(profile, key)})") from None
    char = _unquoted_shell_syntax(value)
    if char is not None:
        raise ConfigError(f"profile key {key} = {value!r} has shell syntax ({char!r}, unquoted) that nothing acts on "
                          "here: its words are passed as they are, no shell expands or runs anything in them",
                          f"write the value out, and quote a character meant literally (e.g. '--comment=a;b'); shell "
                          f"commands and variables belong in setup ({_where(profile, key)})")
    return words


def shell_lines(profile: dict[str, str], key: str) -> str:
    """The value of `key` if bash can parse it (`bash -n`: syntax only, nothing runs); ConfigError with bash's words."""
    value = profile[key]
    if not value.strip():
        return value
    try:
        proc = subprocess.run(["bash", "-n", "-c", value], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ConfigError(f"cannot check profile key {key} with bash -n ({exc})",
                          "install bash on this node: the job script runs with it") from None
    said = " ".join(line.replace("bash: -c: ", "") for line in proc.stderr.splitlines())
    if proc.returncode != 0 or said:
        said = said or f"bash -n: exit {proc.returncode}"
        raise ConfigError(f"profile key {key} = {value!r} is not valid shell ({said})",
                          f"close the quote, bracket or here-document; these lines run in bash before every command "
                          f"of the job ({_where(profile, key)})")
    return value


def program(profile: dict[str, str], key: str) -> str:
    """The value of `key` as one program name or path, which every consumer runs the same way."""
    value = profile[key]
    if value and (shlex.quote(value) != value or value.startswith("~")):
        raise ConfigError(f"profile key {key} = {value!r} is not a program name or path: it is run as one word, "
                          "without a shell (no spaces, quotes, ~, $ or other shell syntax)",
                          f"set {key} to the interpreter's full path or a name on PATH; put module loads and "
                          f"activations into setup ({_where(profile, key)})")
    return value


CHECKS = {LINES: shell_lines, WORDS: shell_words, PROGRAM: program}


def check_command_values(profile: dict[str, str]) -> dict[str, str]:
    """Check every command-line-forming key of the resolved profile (ConfigError naming key, value and fix); returns
    the values job.sh reads: the word keys in their canonical form (shlex.join of the words)."""
    canonical = {}
    for key, kind in command_keys(profile).items():
        checked = CHECKS[kind](profile, key)
        if key in WORD_KEYS:
            canonical[key] = shlex.join(checked)
    return canonical
