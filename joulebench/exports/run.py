"""A run's exports: the tools' writers opened on global rank 0, and the window figures of the record at the end.

The figures are the record's own (`metrics`, the headline window's), never recomputed: every number the record has
is logged under `window/`, and its method, window, coverage and unavailable reasons as facts beside it, so no figure
reaches a tool without the method and bound it was measured with.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from joulebench.exports.sinks import SINKS, Sink

FIGURES = "window/"


class Exports:
    """The writers of one run record, in the order asked for. A writer that cannot open, or fails later, is
    dropped and named in `problems` (the lifecycle puts them into the record's warnings): a tool must not cost the
    run, so nothing here raises an Exception."""

    def __init__(self, targets: Sequence[str], out_dir: Path, run_id: str, benchmark: str) -> None:
        self.sinks: list[Sink] = []
        self.problems: list[str] = []
        self.last_step = 0
        for name in targets:
            try:
                out_dir.mkdir(parents=True, exist_ok=True)
                self.sinks.append(SINKS[name](out_dir, run_id, f"joulebench-{benchmark}"))
            except Exception as exc:  # an unreachable server, a missing key, an unwritable directory
                self.problems.append(f"{name} could not be opened and was left out: {type(exc).__name__}: {exc}")
            except BaseException:
                self.close()  # an interrupt stops the opening: the writers already open are closed
                raise

    def _each(self, what: str, call: Callable[[Sink], None]) -> None:
        for sink in list(self.sinks):
            try:
                call(sink)
            except Exception as exc:
                self.sinks.remove(sink)
                self.problems.append(f"{type(sink).__name__} failed logging {what} and was dropped: "
                                     f"{type(exc).__name__}: {exc}")
                self.problems += self._close([sink])

    def series(self, step: int, values: Mapping[str, float]) -> None:
        self.last_step = max(self.last_step, step)
        self._each(f"step {step}", lambda sink: sink.series(step, values))

    def facts(self, values: Mapping[str, str]) -> None:
        self._each("facts", lambda sink: sink.facts(values))

    def finish(self, status: str, metrics: Mapping[str, Any]) -> None:
        """The record's window figures (numbers) and their facts (text: method, window, reasons) with its status."""
        numbers = {f"{FIGURES}{k}": float(v) for k, v in metrics.items()
                   if isinstance(v, int | float) and not isinstance(v, bool)}
        texts = {f"{FIGURES}{k}": str(v) for k, v in metrics.items() if isinstance(v, str)}
        self._each("the window figures", lambda sink: sink.figures(self.last_step, numbers))
        self.facts({**texts, "status": status})

    def close(self) -> list[str]:
        """Close every writer; everything that failed, in words."""
        problems, self.sinks = [*self.problems, *self._close(self.sinks)], []
        return problems

    @staticmethod
    def _close(sinks: Sequence[Sink]) -> list[str]:
        """Close each writer, also after one failed (it must not keep the others open)."""
        problems = []
        for sink in sinks:
            try:
                sink.close()
            except Exception as exc:
                problems.append(f"{type(sink).__name__} did not close: {type(exc).__name__}: {exc}")
        return problems
