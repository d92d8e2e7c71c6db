"""Command-line types of the drivers and the analysis verbs: one module to import them from.

jpwr's `Number` is the one implementation of a numeric option with a stated range (the meter's own
command line needs it too); the ranges jpwr states for itself are re-exported here, the ranges only
drivers need are declared here. See jpwr/arguments.py for why every numeric option has both ends.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from jpwr.arguments import (
    COUNT,
    COUNT_OR_ZERO,
    FRACTION,
    NODES,
    PORT,
    SECONDS,
    SECONDS_OR_ZERO,
    Number,
    method_names,
    state_ranges,
)

__all__ = ["COUNT", "COUNT_OR_ZERO", "FACTOR", "FRACTION", "GIB", "LEARNING_RATE", "LOG_INTERVAL", "LOSS_SCALE",
           "MILLISECONDS", "MINUTES", "NODES", "PORT", "POSITIVE_FACTOR", "PROBABILITY", "SECONDS",
           "SECONDS_OR_ZERO", "SEED", "SIZE", "WATTS", "Number", "SameMeaning", "comma_list", "method_names",
           "state_ranges"]

SEED = Number(int, 0, 2**32 - 1)  # the range numpy and torch seeds accept (0 is a seed like any other)
PROBABILITY = Number(float, 0.0, 1.0, high_open=True)  # dropout, Adam's betas: 1 would drop (or keep) everything
# progress lines, where the training loop also hears a stop: a longer interval would delay SIGTERM past Slurm's margin
LOG_INTERVAL = Number(int, 1, 1000)
SIZE = Number(int, 1, 2**20)  # model and batch dimensions, tokens, pixels: validate's memory estimate refuses most
MINUTES = Number(float, 0.0, 7 * 24 * 60.0, low_open=True)  # --exit-duration-mins: at most 7 days
MILLISECONDS = Number(float, 0.0, 3_600_000.0, low_open=True)  # latency objectives: at most 1 hour
GIB = Number(float, 0.0, 2.0**20, low_open=True)  # device memory in GiB: at most 1 PiB
WATTS = Number(float, 0.0, 100_000.0)  # power per device: at most 100 kW (each option says what 0 does)
LEARNING_RATE = Number(float, 0.0, 10.0, low_open=True)  # above any schedule's peak; 0 would not train
FACTOR = Number(float, 0.0, 1e6)  # weight decay, gradient clip, a floor learning rate (each says what 0 does)
POSITIVE_FACTOR = Number(float, 0.0, 1e6, low_open=True)  # Adam's epsilon, the init std: 0 would divide by zero
LOSS_SCALE = Number(float, 0.0, 2.0**64, low_open=True)  # fp16 loss scales: powers of two up to 2^64


def comma_list(text: str, what: str, example: str) -> list[str]:
    """The items of a comma-separated option, stripped; an empty item (`1,,4`, a trailing comma) is refused
    rather than dropped, since it is a typo more often than a choice."""
    items = [item.strip() for item in text.split(",")]
    if not text.strip() or "" in items:
        raise argparse.ArgumentTypeError(f"{text!r} has an empty {what} (expected {what}s separated by single "
                                         f"commas, e.g. {example})")
    return items


class SameMeaning(argparse.Action):
    """A stored option that means the same as others (a sweep and its one point, `--rates` beside `--rate`; a name
    and its alias): argparse would keep one of them silently, so a command line giving more than one is refused
    (exit 2) naming both and which to keep. The one rule for every driver:

        w.add_argument("--rate", action=SameMeaning, same_as=("--rates",), keep="...", type=parse_rate)

    `same_as`: the options it is refused beside (each lists the others; an action's own aliases are included
    without being named); `keep`: which to keep, in words. The options seen are noted in the namespace, so the
    check holds in either order and whatever the values (also one equal to the default)."""

    SEEN = "_same_meaning_seen"  # the namespace attribute holding the options given so far

    def __init__(self, option_strings: Sequence[str], dest: str, same_as: Sequence[str] = (), keep: str = "",
                 **kwargs: Any) -> None:
        super().__init__(option_strings, dest, **kwargs)
        self.same_as = (*same_as, *option_strings)
        self.keep = keep

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        seen: list[str] = namespace.__dict__.setdefault(self.SEEN, [])
        given = option_string or self.dest
        earlier = next((option for option in seen if option != given and option in self.same_as), None)
        if earlier is not None:
            parser.error(f"{earlier} and {given} both given: they set the same thing, and only one would count; "
                         f"keep {self.keep}")
        seen.append(given)
        setattr(namespace, self.dest, values)
