"""Command-line types of the drivers and the analysis verbs: one module to import them from.

jpwr's `Number` is the one implementation of a numeric option with a stated range (the meter's own
command line needs it too); the ranges jpwr states for itself are re-exported here, the ranges only
drivers need are declared here. See jpwr/arguments.py for why every numeric option has one.
"""

from __future__ import annotations

from jpwr import COUNT, FRACTION, NON_NEGATIVE, POSITIVE, Number, method_names

__all__ = ["COUNT", "COUNT_OR_ZERO", "FRACTION", "NON_NEGATIVE", "POSITIVE", "PROBABILITY", "SEED", "method_names"]

COUNT_OR_ZERO = Number(int, 0)  # warm-up iterations, workers: none is allowed
SEED = Number(int, 0, 2**32 - 1)  # the range numpy and torch seeds accept
PROBABILITY = Number(float, 0.0, 1.0, high_open=True)  # dropout: 1 would drop everything
