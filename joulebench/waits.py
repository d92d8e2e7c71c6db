"""One wait for every place a run waits: the next arrival of a load, a server becoming ready, a tool's set-up.

A signal handler of the run (joulebench.lifecycle.StopRequest) only sets a flag, so a plain `time.sleep` until the
next arrival of a very low rate, or a tracking client retrying a server out of reach, would keep the run past its
SIGTERM (and Slurm's SIGKILL would then cost it its record). `wait_until` waits in slices of at most SLICE_S and asks
the stop request between them; `call_within` runs a call that may block for minutes in its own retries on a helper
thread and waits for it the same way, with a timeout.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar, cast

SLICE_S = 0.5  # a stop request ends any wait within this long
StopCheck = Callable[[], str | None]  # the run's stop request: its reason, or None while the run may go on
T = TypeVar("T")


def never_stop() -> str | None:
    """The stop check of a wait that only its deadline or its event ends."""
    return None


def wait_until(deadline: float | None, stop: StopCheck, done: threading.Event | None = None) -> str | None:
    """Wait until time.monotonic() reaches `deadline` (None: no deadline), `done` is set, or `stop()` gives a reason;
    returns that reason, else None. A stop is seen within SLICE_S."""
    while True:
        reason = stop()
        if reason:
            return reason
        if done is not None and done.is_set():
            return None
        left = SLICE_S if deadline is None else deadline - time.monotonic()
        if left <= 0:
            return None
        if done is not None:
            done.wait(min(SLICE_S, left))
        else:
            time.sleep(min(SLICE_S, left))


_GIVEN_UP: list[threading.Thread] = []  # the helper threads of calls given up on (call_within)


def calls_given_up() -> list[str]:
    """What each call given up on and still running was doing (its thread's name): a tool's client retrying a server
    out of reach, whose library waits for it again at the interpreter's exit (joulebench.process_exit)."""
    return [thread.name for thread in _GIVEN_UP if thread.is_alive()]


class Stopped(Exception):
    """A bounded call was given up because the run is stopping (the message says why)."""


class _Outcome(Generic[T]):
    """What the helper thread of `call_within` hands back: the value or the exception, and when it is there."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.value: T | None = None
        self.error: BaseException | None = None


def call_within(call: Callable[[], T], timeout_s: float, what: str, stop: StopCheck = never_stop) -> T:
    """`call()` on a daemon thread, waited for at most `timeout_s` and only while `stop()` gives no reason: raises
    TimeoutError naming `what` when it has not returned by then, Stopped when the run is stopping, else returns its
    value or raises its exception. A call given up on is left to end alone (a daemon thread), and counted
    (calls_given_up): a library that waits for it at the interpreter's exit is not waited for (process_exit)."""
    outcome: _Outcome[T] = _Outcome()

    def target() -> None:
        try:
            outcome.value = call()
        except BaseException as exc:  # handed to the waiting thread, which raises it
            outcome.error = exc
        finally:
            outcome.done.set()

    thread = threading.Thread(target=target, name=f"bounded: {what}", daemon=True)
    thread.start()
    reason = wait_until(time.monotonic() + timeout_s, stop, outcome.done)
    if reason or not outcome.done.is_set():
        _GIVEN_UP.append(thread)
    if reason:
        raise Stopped(f"{what} was given up: {reason}")
    if not outcome.done.is_set():
        raise TimeoutError(f"{what} did not return within {timeout_s:g} s")
    if outcome.error is not None:
        raise outcome.error
    return cast(T, outcome.value)  # set: the call returned without an error
