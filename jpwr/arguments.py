"""public: for command lines (jpwr's, and the drivers' through joulebench.arguments).

Numeric command-line options with a stated range, checked by argparse before anything starts.

`--interval 0` once killed the sampler thread with a division by zero and `--min-window-s inf`
waited for ever: every numeric option of jpwr and of the drivers is declared with one of these
types (this module's, or joulebench.arguments' built on `Number`), so NaN, infinity, a non-number
or a value outside the range ends the command at once (exit 2) with the option, the value and the
range named. Every range has both ends, stated in the option's help; where it admits 0, the help says
what 0 does. tests/test_numeric_options.py checks that no numeric option goes without one, and runs
every command at each option's lower bound.
"""

from __future__ import annotations

import argparse
import dataclasses
import math

from jpwr.backends import parse_methods
from jpwr.errors import ValidationError

__all__ = [
    "COUNT", "COUNT_OR_ZERO", "FRACTION", "NODES", "PORT", "SECONDS", "SECONDS_OR_ZERO",
    "Number", "method_names", "parse_methods", "state_ranges",
]


@dataclasses.dataclass(frozen=True)
class Number:
    """An argparse `type`: a finite int or float within [low, high] (an open end where stated).

    Both ends are required: an option without an upper bound once accepted values at which a command never
    returned (an hour-long probe, ten billion iterations); the range is stated in the option's help
    (`state_ranges`) and refused at the parser."""

    kind: type[int] | type[float]
    low: float
    high: float
    low_open: bool = False  # True: low itself is refused (e.g. an interval > 0)
    high_open: bool = False

    @property
    def __name__(self) -> str:  # argparse names the type in some messages
        return self.kind.__name__

    def __call__(self, text: str) -> int | float:
        try:
            value = self.kind(text)
        except ValueError:
            what = "a whole number" if self.kind is int else "a number"
            raise argparse.ArgumentTypeError(f"{text!r} is not {what} (expected {self.describe()})") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text} is not a finite number (expected {self.describe()})")
        if not self.admits(value):
            raise argparse.ArgumentTypeError(f"{text} is out of range (expected {self.describe()})")
        return value

    def admits(self, value: float) -> bool:
        if value < self.low or (self.low_open and value == self.low):
            return False
        return not (value > self.high or (self.high_open and value == self.high))

    def describe(self) -> str:
        kind = "whole number" if self.kind is int else "number"
        return (f"a {kind} in {'(' if self.low_open else '['}{_show(self.low)}, {_show(self.high)}"
                f"{')' if self.high_open else ']'}")


def _show(value: float) -> str:
    """A bound as written: whole numbers in full (a seed's 4294967295, not 4.29497e+09)."""
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def state_ranges(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Append each numeric option's range to its help, in the parser and its sub-commands: the range a user
    reads in --help is the one the parser enforces, stated once (in the option's Number)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                state_ranges(sub)
        elif isinstance(action.type, Number) and action.help != argparse.SUPPRESS:
            stated = f"[{action.type.describe()}]".replace("%", "%%")
            action.help = f"{action.help} {stated}" if action.help else stated
    return parser


# The ranges jpwr's own options state; the drivers' and analysis' further ones build on Number in the core
# (joulebench.arguments), which re-exports these for them. Upper bounds: far above any real run, low enough that a
# run at the bound still ends (or is refused by validate's memory estimate) instead of hanging for ever.
WEEK_S = 7 * 24 * 3600.0  # the longest duration any option accepts: a Slurm job is shorter
COUNT = Number(int, 1, 10**7)  # iterations, batches, requests, draws, images: at least one, at most ten million
COUNT_OR_ZERO = Number(int, 0, 10**7)  # the same where none is meaningful (each option's help says what 0 does)
NODES = Number(int, 1, 65536)  # nodes, devices, ranks and parallel sizes
SECONDS = Number(float, 0.0, WEEK_S, low_open=True)  # durations and timeouts: above zero, at most 7 days
SECONDS_OR_ZERO = Number(float, 0.0, WEEK_S)  # durations where 0 is meaningful (each option's help says what 0 does)
OFFSET_S = Number(float, -WEEK_S, WEEK_S)  # clock offsets: any sign, at most 7 days
INTERVAL_MS = Number(float, 1.0, 3_600_000.0)  # sampling periods: 1 ms (faster only spins the sampler) to 1 hour
UNIT_OPEN = Number(float, 0.0, 1.0, low_open=True, high_open=True)  # fractions strictly inside (0, 1)
FRACTION = Number(float, 0.0, 1.0)  # coverage thresholds: 0 and 1 both meaningful
PORT = Number(int, 1, 65535)  # TCP ports (--metrics-port, servers)


def method_names(text: str) -> str:
    """An argparse `type` for a drivers' --energy-methods: every name known to jpwr (checked before anything
    runs); the text itself is kept, WindowMeter parses it when the run opens its meter."""
    try:
        parse_methods(text)
    except ValidationError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text
