"""The phases drivers mark inside a step, and the replay of each phase alone in its own window.

Driver policy built on the meter: jpwr stores phase marks under any name and meters any window; which
names the drivers share (the analysis reads them back) and how a phase is replayed for the replay
estimator (joulebench.analysis.replay) is decided here, once for every driver.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NoReturn

from jpwr import ValidationError

if TYPE_CHECKING:  # only the types: drivers import the phase names before any meter is opened
    from jpwr import Window, WindowMeter

FORWARD = "forward"
BACKWARD = "backward"
OPTIMIZER = "optimizer"
GRAD_REDUCE = "grad_reduce"  # data-parallel gradient reduction not hidden behind backward
PIPELINE_P2P = "pipeline_p2p"  # pipeline-parallel sends and receives between stages
STANDARD_PHASES = (FORWARD, BACKWARD, OPTIMIZER, GRAD_REDUCE, PIPELINE_P2P)
REPLAY_PREFIX = "replay/"  # replay windows are named replay/<phase>


@dataclasses.dataclass(frozen=True)
class Replay:
    """One phase run on its own for the replay estimator; `setup` runs once before its window (untimed)."""

    name: str
    run: Callable[[], object]
    setup: Callable[[], object] | None = None


TIMING_INVOCATIONS = 3  # timed invocations that fix a replay's count, after one that warms up
MIN_REPLAY_INVOCATIONS = 3


def check_replay_seconds(seconds: float, has_sampler: bool, option: str = "--replay-phases") -> None:
    """A replay without a sampler would run for nothing: no window would get an energy."""
    if seconds < 0:
        raise ValidationError(f"{option} {seconds:g} is negative", f"pass seconds per phase (e.g. {option} 5), "
                                                                    "or 0 / leave it out for no replay")
    if seconds > 0 and not has_sampler:
        raise ValidationError(f"{option} {seconds:g} without a jpwr sampler (replay windows would get no energy)",
                              "run under `jpwr -- ...` or `jpwr serve`, or pass --energy-methods")


def replay_phases(meter: WindowMeter, replays: Sequence[Replay], min_seconds: float,
                  agree_max: Callable[[int], int] | None = None, log: Callable[[str], None] | None = None,
                  stop_reason: Callable[[], str | None] | None = None) -> list[Window]:
    """Run each phase alone in its own window `replay/<name>`; J per invocation = window energy / invocations.

    Invocations outside the window (after `setup`) measure the phase's duration: the first one warms up (its
    allocations and first-call costs made the count, and so the window, too short), the next TIMING_INVOCATIONS
    are timed. That fixes the count for at least `min_seconds` (and MIN_REPLAY_INVOCATIONS); `agree_max` (a
    collective, e.g. a max over ranks) makes all ranks run the same count, since phases with collectives inside
    must be called equally often everywhere. `min_seconds` should cover at least 30 updates of the energy counter
    (3 s at the H100's 100 ms). The window lasts at least `min_seconds` (run_at_least tops the count up). `log`
    (the driver's progress line, rank 0's) says which phase runs, so that replays longer than 10 s are not silent.

    A stop request (`stop_reason`, the run's StopRequest.local_reason) is heard before each phase and about once a
    second inside its window, on every rank at the same invocation (through `agree_max`): the window closes with
    the invocations done and the run ends there (StopRequested), keeping every window closed before.
    """
    sync = meter.sync or (lambda: None)
    agree = agree_max or (lambda flag: flag)

    def stopping() -> bool:
        return bool(agree(1 if stop_reason is not None and stop_reason() else 0))

    windows: list[Window] = []
    for number, replay in enumerate(replays, start=1):
        if stopping():
            _stopped(stop_reason, f"before replaying {replay.name}", windows)
        if log is not None:
            log(f"replay {number}/{len(replays)}: {replay.name} alone for >= {min_seconds:g} s")
        if replay.setup is not None:
            replay.setup()
        replay.run()
        sync()
        started = time.monotonic()
        for _ in range(TIMING_INVOCATIONS):
            replay.run()
        sync()
        once_s = max((time.monotonic() - started) / TIMING_INVOCATIONS, 1e-6)
        count = max(MIN_REPLAY_INVOCATIONS, int(min_seconds / once_s) + 1)
        count = agree(count)
        check_every = max(1, math.ceil(count / max(min_seconds, 1.0)))  # the same on every rank: count is agreed
        name = REPLAY_PREFIX + replay.name
        meter.begin(name, 0)
        done, stopped = run_at_least(replay.run, count, min_seconds, sync, agree_max, stopping, check_every)
        if stopped:
            windows.append(meter.end(name, done, {"invocations": float(done)},
                                     reason=f"stopped after {done} invocations"))
            _stopped(stop_reason, f"in {name} after {done} invocations", windows)
        windows.append(meter.end(name, done, {"invocations": float(done)}))
    return windows


def run_at_least(run: Callable[[], object], count: int, min_seconds: float, sync: Callable[[], object],
                 agree_max: Callable[[int], int] | None = None, stopping: Callable[[], bool] | None = None,
                 check_every: int = 1) -> tuple[int, bool]:
    """Call `run` `count` times, then more until `min_seconds` have passed; returns how many calls ran, and whether
    `stopping` (asked every `check_every` calls: a collective, so every rank asks at the same call) ended it early.

    The count from the few timed invocations before the window runs short where a phase's time varies: on a CPU the
    first invocations after another phase, or under another process's load, differ by up to 2x from the window's
    (a 3 s replay lasted 1.6-2.9 s). Each top-up is sized by the window's own rate so far; with `agree_max` every
    rank runs the largest top-up any rank needs (phases with collectives inside must be called equally often)."""
    started = time.monotonic()
    done = 0
    while count > 0:
        for _ in range(count):
            run()
            done += 1
            if stopping is not None and done % check_every == 0 and stopping():
                return done, True
        sync()
        elapsed = time.monotonic() - started
        count = math.ceil((min_seconds - elapsed) * done / max(elapsed, 1e-9)) if elapsed < min_seconds else 0
        if agree_max is not None:
            count = agree_max(count)
    return done, False


def _stopped(stop_reason: Callable[[], str | None] | None, where: str, windows: Sequence[Window]) -> NoReturn:
    """End the run at a stop request heard during the replays, saying where and what was kept."""
    from joulebench.lifecycle import StopRequested  # the lifecycle imports the meter: not at the phase names' import

    why = (stop_reason() if stop_reason is not None else None) or "another rank requested the stop"
    kept = ", ".join(w.name for w in windows) or "none"
    raise StopRequested(f"{why}: stopped during the phase replays, {where}; the steady window and the replay windows "
                        f"closed before are kept ({kept})")
