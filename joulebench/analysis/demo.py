"""`joulebench demo [--out DIR]`: the whole pipeline on a laptop, with energy from a trace recorded on an H100.

A tiny GPT trains on the CPU under the meter, whose only sensor plays back tests/data/h100_trace
(`jpwr --methods replay:TRACE_DIR`, jpwr.backends.replay: the recording's idle segment in the idle baseline, its
loaded segment in the work windows, so idle draws less than steady and the phase replay adds up); then the trace
is plotted, the run reported and its steady window's energy split per phase. Each command is printed before it
runs, as it could be typed.
The energy is the recording's, not this machine's: the record's energy domain, the plot's title, the report's
table and series and the attribution all say "replayed trace, not this machine", and nothing ranks the run
beside measured ones (joulebench.analysis.energy_domain).
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from joulebench.arguments import Number, state_ranges
from jpwr import ExitCode, ValidationError
from jpwr.errors import ArgumentParser
from jpwr.trace import REPLAYED

REPO = Path(__file__).resolve().parents[2]
DEFAULT_TRACE = REPO / "tests" / "data" / "h100_trace"


def commands(out: Path, trace: Path, replay_phases: float) -> list[list[str]]:
    """The demo's four commands: train under the replaying meter, plot, report, attribute."""
    run = out / "run"
    python = sys.executable
    return [
        [python, "-m", "jpwr", "--methods", f"replay:{trace}", "--out", str(run / "jpwr"), "--",
         python, "-m", "llm_training", "train", "--model", "tiny", "--device", "cpu", "--out-dir", str(run),
         "--replay-phases", f"{replay_phases:g}"],
        [python, "-m", "joulebench", "plot", str(run / "jpwr"), "-o", str(out / "trace.png")],
        [python, "-m", "joulebench", "report", str(run), "-o", str(out / "report")],
        [python, "-m", "joulebench", "attribute", str(run)],
    ]


def main(argv: Sequence[str]) -> int:
    parser = ArgumentParser(prog="joulebench demo", description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("runs/demo"), help="where everything goes (default "
                                                                             "runs/demo; must not exist yet)")
    parser.add_argument("--trace", type=Path, default=DEFAULT_TRACE, help="a recorded trace directory "
                                                                          "(default: the clone's H100 trace)")
    parser.add_argument("--replay-phases", type=Number(float, 0.0, 600.0, low_open=True), default=3.0,
                        metavar="SECONDS",
                        help="seconds each training phase runs alone for the attribution (default 3)")
    args = state_ranges(parser).parse_args(argv)
    if not (args.trace / "meta.json").is_file():
        raise ValidationError(f"no recorded trace at {args.trace}", "run the demo from a clone of the repository, "
                                                                    "or pass --trace DIR (meta.json, trace.csv.gz)")
    if args.out.exists():
        raise ValidationError(f"{args.out} exists", "remove it, or pass --out with a new directory")
    print(f"joulebench demo: energy below is a trace recorded on an H100 ({REPLAYED})", flush=True)
    for command in commands(args.out, args.trace.resolve(), args.replay_phases):
        print(f"\n$ {shlex.join(command)}", flush=True)
        code = subprocess.run(command, check=False).returncode
        if code != 0:
            print(f"joulebench demo: stopped, the command above exited with {code}", file=sys.stderr)
            return code
    print(f"\njoulebench demo: done ({REPLAYED}): record {args.out / 'run' / 'run_record.json'}, plot "
          f"{args.out / 'trace.png'}, report {args.out / 'report' / 'index.html'}", flush=True)
    return ExitCode.OK
