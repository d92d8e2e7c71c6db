"""The drivers' way out: end the process without the frameworks' slow teardown.

Why: after the run record is written, Python's final garbage collection walks every object that megatron-core,
torch and TensorFlow (pulled in by torch.utils.tensorboard) created at import; on a 2-core machine that took 2.2 s
idle and over 10 s under load, so a run stopped by SIGTERM in a Slurm grace period could be killed in its teardown.
Freezing the collector's generations skips that walk (0.27 s); objects still release by reference count, and every
file of a run is written and closed before this is called. A tool's client still retrying a server out of reach
(joulebench.waits.calls_given_up) is not waited for either: the process ends without its exit handlers.
"""

from __future__ import annotations

import gc
import importlib
import os
import sys
from typing import NoReturn

from joulebench.waits import calls_given_up


def exit_after_run(code: int | None) -> NoReturn:
    """Flush the standard streams and exit with `code`, leaving the objects alive now to the operating system.
    Where a call was given up on and still runs (a --log-to tool's client retrying a server out of reach: W&B online
    waits for it again in its exit handlers, 70-90 s), the process ends at once, without the interpreter's exit
    handlers: every file of the run is written and closed by then, and the tool was left out with a warning."""
    sys.stdout.flush()
    sys.stderr.flush()
    if calls_given_up():
        os._exit(code or 0)
    gc.freeze()
    sys.exit(code)


def run_driver(prog: str, torch_extra: str) -> NoReturn:
    """`python -m <prog>`: its command line (`<prog>.cli.main`) imported and run behind the drivers' error boundary,
    then exit_after_run. Why the import too: a Ctrl-C while the command line's own modules load (seconds on a loaded
    machine) must end with the boundary's one line and 130, as one during a driver's later imports does, not with a
    traceback; a library missing there is named with its extra (`torch_extra` for torch)."""
    from joulebench.boundary import exit_code_of

    exit_after_run(exit_code_of(prog, lambda: importlib.import_module(f"{prog}.cli").main() or 0,
                                torch_extra=torch_extra))
