"""A run's exports: the tools' writers opened on global rank 0, and the window figures of the record at the end.

The figures are the record's own (`metrics`, the headline window's), never recomputed: every number the record has
is logged under `window/`, and its method, window, coverage and unavailable reasons as facts beside it, so no figure
reaches a tool without the method and bound it was measured with. An energy that was not measured on this machine (a
replayed trace) keeps its label in the tools: its figures are logged under `replayed/` (a chart shows the name, not
the facts beside it) and the energy domain is a fact.

Every call into a tool is bounded (joulebench.waits.call_within, TOOL_TIMEOUT_S): a tracking server out of reach
makes MLflow's and W&B's clients retry for minutes, which would hold the run past its SIGTERM and its record; such
a tool is left out with a warning instead. Its opening is also given up at once when the run is asked to stop.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from joulebench.exports.sinks import SINKS, Sink
from joulebench.waits import StopCheck, Stopped, call_within, never_stop
from jpwr.trace import REPLAYED

FIGURES = "window/"
TOOL_TIMEOUT_S = 30.0  # a tool's opening or one of its calls: longer, and it is left out
ENERGY_PARTS = ("energy", "_wh", "power", "j_per_", "_j")  # a figure's name with one of these is an energy figure


def energy_label(domain: str | None) -> str | None:
    """The prefix an energy domain's figures carry in the tools: `replayed/` for a replayed trace's, else none."""
    return "replayed/" if domain and REPLAYED in domain else None


def labelled(values: Mapping[str, float], domain: str | None) -> dict[str, float]:
    """`values` with each energy figure's name under the domain's label (figures of work and time keep theirs)."""
    label = energy_label(domain)
    return {f"{label}{k}" if label and any(part in k for part in ENERGY_PARTS) else k: v for k, v in values.items()}


class Exports:
    """The writers of one run record, in the order asked for. A writer that cannot open, or fails later, is
    dropped and named in `problems` (the lifecycle puts them into the record's warnings) and said at once through
    `say` (the lifecycle's stderr line): a tool must not cost the run, so nothing here raises an Exception. `stop`: the
    run's stop request, which gives up an opening."""

    def __init__(self, targets: Sequence[str], out_dir: Path, run_id: str, benchmark: str,
                 stop: StopCheck = never_stop, timeout_s: float = TOOL_TIMEOUT_S,
                 say: Callable[[str], None] = lambda _problem: None) -> None:
        self.sinks: list[Sink] = []
        self.problems: list[str] = []
        self.say = say
        self.last_step = 0
        self.timeout_s = timeout_s
        for name in targets:
            try:
                out_dir.mkdir(parents=True, exist_ok=True)
                opening: Callable[[], Sink] = partial(SINKS[name], out_dir, run_id, f"joulebench-{benchmark}")
                self.sinks.append(call_within(opening, timeout_s, f"opening {name}", stop))
            except Stopped as exc:
                self._problem(f"{name} was left out: {exc}")
            except Exception as exc:  # an unreachable server, a missing key, an unwritable directory
                self._problem(f"{name} could not be opened and was left out: {type(exc).__name__}: {exc}")
            except BaseException:
                self.close()  # an interrupt (a second Ctrl-C) stops the opening: the writers already open are closed
                raise

    def _problem(self, text: str) -> None:
        """A tool left out or dropped: kept for the record's warnings, and said when it happens."""
        self.problems.append(text)
        self.say(text)

    def _each(self, what: str, call: Callable[[Sink], None]) -> None:
        for sink in list(self.sinks):
            try:
                call_within(partial(call, sink), self.timeout_s, f"{type(sink).__name__} logging {what}")
            except TimeoutError as exc:  # a tool that hangs once is not asked again, not even to close
                self.sinks.remove(sink)
                self._problem(f"{type(sink).__name__} was dropped: {exc}")
            except Exception as exc:
                self.sinks.remove(sink)
                self._problem(f"{type(sink).__name__} failed logging {what} and was dropped: "
                              f"{type(exc).__name__}: {exc}")
                self._close([sink])

    def series(self, step: int, values: Mapping[str, float]) -> None:
        self.last_step = max(self.last_step, step)
        self._each(f"step {step}", lambda sink: sink.series(step, values))

    def facts(self, values: Mapping[str, str]) -> None:
        self._each("facts", lambda sink: sink.facts(values))

    def finish(self, status: str, metrics: Mapping[str, Any], energy_domain: str | None = None) -> None:
        """The record's window figures (numbers) and their facts (text: method, window, reasons, energy domain) with
        its status; a replayed energy's figures under their label (`labelled`)."""
        numbers = labelled({f"{FIGURES}{k}": float(v) for k, v in metrics.items()
                            if isinstance(v, int | float) and not isinstance(v, bool)}, energy_domain)
        texts = {f"{FIGURES}{k}": str(v) for k, v in metrics.items() if isinstance(v, str)}
        self._each("the window figures", lambda sink: sink.figures(self.last_step, numbers))
        self.facts({**texts, **({"energy_domain": energy_domain} if energy_domain else {}), "status": status})

    def close(self) -> list[str]:
        """Close every writer; everything that failed, in words."""
        sinks, self.sinks = self.sinks, []
        self._close(sinks)
        return list(self.problems)

    def _close(self, sinks: Sequence[Sink]) -> None:
        """Close each writer, also after one failed (it must not keep the others open); a failure is a problem."""
        for sink in sinks:
            try:
                call_within(sink.close, self.timeout_s, f"closing {type(sink).__name__}")
            except TimeoutError as exc:
                self._problem(str(exc))
            except Exception as exc:
                self._problem(f"{type(sink).__name__} did not close: {type(exc).__name__}: {exc}")
