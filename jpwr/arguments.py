"""Numeric command-line options with a stated range, checked by argparse before anything starts.

`--interval 0` once killed the sampler thread with a division by zero and `--min-window-s inf`
waited for ever: every numeric option of jpwr and of the drivers is declared with one of these
types (this module's, or joulebench.arguments' built on `Number`), so NaN, infinity, a non-number
or a value outside the range ends the command at once (exit 2) with the option, the value and the
range named. tests/test_numeric_options.py checks that no numeric option goes without one.
"""

from __future__ import annotations

import argparse
import dataclasses
import math


@dataclasses.dataclass(frozen=True)
class Number:
    """An argparse `type`: a finite int or float within [low, high] (an open end where stated)."""

    kind: type[int] | type[float]
    low: float | None = None
    high: float | None = None
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
        if self.low is not None and (value < self.low or (self.low_open and value == self.low)):
            return False
        return not (self.high is not None and (value > self.high or (self.high_open and value == self.high)))

    def describe(self) -> str:
        kind = "whole number" if self.kind is int else "number"
        if self.low is not None and self.high is not None:
            return (f"a {kind} in {'(' if self.low_open else '['}{self.low:g}, {self.high:g}"
                    f"{')' if self.high_open else ']'}")
        if self.low is not None:
            return f"a {kind} {'>' if self.low_open else '>='} {self.low:g}"
        if self.high is not None:
            return f"a {kind} {'<' if self.high_open else '<='} {self.high:g}"
        return f"a finite {kind}"


# The ranges jpwr's own options state; the drivers' and analysis' further ones build on Number in the core
# (joulebench.arguments), which re-exports these for them.
COUNT = Number(int, 1)  # iterations, batch sizes, nodes, repeats: at least one
POSITIVE = Number(float, 0.0, low_open=True)  # durations, intervals, rates, sizes: strictly above zero
NON_NEGATIVE = Number(float, 0.0)  # weight decay, gradient clip (0 = off), probe time
UNIT_OPEN = Number(float, 0.0, 1.0, low_open=True, high_open=True)  # fractions strictly inside (0, 1)
FINITE = Number(float)  # offsets: any sign
FRACTION = Number(float, 0.0, 1.0)  # coverage thresholds: 0 and 1 both meaningful
PORT = Number(int, 1, 65535)  # a TCP port (--metrics-port)


def method_names(text: str) -> str:
    """An argparse `type` for a drivers' --energy-methods: every name known to jpwr (checked before anything
    runs); the text itself is kept, WindowMeter parses it when the run opens its meter."""
    from jpwr.backends import parse_methods
    from jpwr.errors import ValidationError

    try:
        parse_methods(text)
    except ValidationError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text
