"""`joulebench demo [--out DIR]`: the whole pipeline on a laptop, with energy from a trace recorded on an H100.

A tiny GPT trains on the CPU under the meter, whose only sensor plays back tests/data/h100_trace
(`jpwr --methods replay:TRACE_DIR`, jpwr.backends.replay: the recording's idle segment in the idle baseline, its
loaded segment in the work windows, so idle draws less than steady); then the trace is plotted, the run reported
and its steady window attributed. Each command is printed before it runs, as it could be typed.
The energy is the recording's, not this machine's: the record's energy domain, the plot's title, the report's
table and series and the attribution all say "replayed trace, not this machine", and nothing ranks the run
beside measured ones (joulebench.analysis.energy_domain).

No per-phase replay by default: every phase would draw the recording's one loaded power, so a phase's share of the
step would be only its time on this CPU, which other work on the machine moves (backward's share read 51 % in one
run and 26 % in the next on a 2-core machine). The steady window is long enough for the fit estimator instead, which
splits a window only where the trace resolves its phases and says why it does not (`--replay-phases` still runs the
replay, with that caveat). A second demo replaces the first one's directory (it holds the marker file demo.txt).
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from joulebench.analysis.extras_needed import QUICK_START_EXTRAS, require_extras
from joulebench.analysis.text_width import fitted
from joulebench.arguments import Number, state_ranges
from jpwr import ExitCode, ValidationError
from jpwr.errors import ArgumentParser
from jpwr.trace import REPLAYED

REPO = Path(__file__).resolve().parents[2]
DEFAULT_TRACE = REPO / "tests" / "data" / "h100_trace"
# 40 periods of the recording's 100 ms energy counter, the fit estimator needs 20; margin, since the window's step count
# is sized from the warm-up's steps, slower than the steady ones on a CPU (3.7-4.2 s idle, 1.8 s under load, 2026-12-06)
STEADY_SECONDS = 4.0
MARKER = "demo.txt"  # a directory holding it is a demo's output, which the next demo may replace
NO_REPLAY = ("joulebench demo: no per-phase replay: each phase would draw the recording's one loaded power, so its "
             "share of the step would be only its time on this CPU, which other work on the machine moves (backward's "
             "share read 51 % and 26 % in two runs on 2 cores); the fit below splits the steady window only where the "
             "trace resolves the phases, and says why where it does not")
REPLAY_CAVEAT = ("joulebench demo: the replay table below gives each phase's time on this CPU at the recording's one "
                 "loaded power: its shares move with this machine's load, run to run")


def commands(out: Path, trace: Path, replay_phases: float) -> list[list[str]]:
    """The demo's four commands: train under the replaying meter, plot, report, attribute."""
    run = out / "run"
    python = sys.executable
    replay = ["--replay-phases", f"{replay_phases:g}"] if replay_phases else []
    return [
        [python, "-m", "jpwr", "--methods", f"replay:{trace}", "--out", str(run / "jpwr"), "--",
         python, "-m", "llm_training", "train", "--model", "tiny", "--device", "cpu", "--out-dir", str(run),
         "--steady-seconds", f"{STEADY_SECONDS:g}", *replay],
        [python, "-m", "joulebench", "plot", str(run / "jpwr"), "-o", str(out / "trace.png")],
        [python, "-m", "joulebench", "report", str(run), "-o", str(out / "report")],
        [python, "-m", "joulebench", "attribute", str(run)],
    ]


def main(argv: Sequence[str]) -> int:
    parser = ArgumentParser(prog="joulebench demo", description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("runs/demo"),
                        help=f"where everything goes (default runs/demo; new, or an earlier demo's, which holds "
                             f"{MARKER}: replaced)")
    parser.add_argument("--trace", type=Path, default=DEFAULT_TRACE, help="a recorded trace directory "
                                                                          "(default: the clone's H100 trace)")
    parser.add_argument("--replay-phases", type=Number(float, 0.0, 600.0), default=0.0, metavar="SECONDS",
                        help="seconds each training phase runs alone for the replay estimator (0 = no replay, "
                             "the default: see above)")
    args = state_ranges(parser).parse_args(argv)
    if not (args.trace / "meta.json").is_file():
        raise ValidationError(f"no recorded trace at {args.trace}", "run the demo from a clone of the repository, "
                                                                    "or pass --trace DIR (meta.json, trace.csv.gz)")
    require_extras("joulebench demo", QUICK_START_EXTRAS)  # all at once, before training: plot needs reports
    fresh_out(args.out)
    print(f"joulebench demo: energy below is a trace recorded on an H100 ({REPLAYED})", flush=True)
    for command in commands(args.out, args.trace.resolve(), args.replay_phases):
        if command[3:4] == ["attribute"]:
            print(fitted(["", REPLAY_CAVEAT if args.replay_phases else NO_REPLAY]), flush=True)
        print(f"\n$ {shlex.join(command)}", flush=True)
        code = subprocess.run(command, check=False).returncode
        if code != 0:
            print(f"joulebench demo: stopped, the command above exited with {code}", file=sys.stderr)
            return code
    print(f"\njoulebench demo: done ({REPLAYED}): record {args.out / 'run' / 'run_record.json'}, plot "
          f"{args.out / 'trace.png'}, report {args.out / 'report' / 'index.html'}", flush=True)
    return ExitCode.OK


def fresh_out(out: Path) -> None:
    """Make `out` for this demo: a new directory, or an earlier demo's emptied (its marker says it is one); anything
    else stays untouched and is refused."""
    if out.exists():
        if not (out / MARKER).is_file():
            raise ValidationError(f"{out} exists and is not an earlier demo's output (no {MARKER} in it)",
                                  "remove it, or pass --out with a new directory")
        print(f"joulebench demo: replacing {out} (an earlier demo's output)", flush=True)
        shutil.rmtree(out)
    out.mkdir(parents=True)
    (out / MARKER).write_text("Written by `joulebench demo`: a later `joulebench demo --out` this directory replaces "
                              "it, with everything in it.\n")
