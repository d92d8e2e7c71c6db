"""`joulebench VERB ...`: the analysis verbs over run records and traces.

    joulebench report PATH... -o OUTDIR | --compare A B   # efficiency charts, HTML report, energy diagnosis
    joulebench report --pareto RUNS... [--max-slowdown 1%] # a sweep's Pareto front and waste-free point
    joulebench plan RUNS... | --profile FILE              # one clock per phase under a slowdown limit (predicted)
    joulebench recommend RUNS... [--max-p90-tpot-ms MS] [--max-slowdown 5%] [--remeasure]  # cheapest setting
    joulebench plot RUN_DIR -o trace.png                  # power, clocks, utilisation with the windows shaded
    joulebench attribute RUN_DIR [--profile KERNELS.json] # a window's energy per phase: fit and replay estimators
    joulebench demo [--out DIR]                           # all of it on a laptop, from a recorded H100 trace
    joulebench doctor                                     # after installing: each problem of this install, its fix

Measuring is the meter's job (`jpwr -- CMD`, `jpwr serve`, `jpwr combine`, `jpwr info`,
`jpwr selftest`). Each verb's module is imported only when that verb runs, so the usage text
needs none of the optional extras.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

from joulebench.boundary import exit_code_of
from jpwr import ExitCode
from jpwr.errors import take_debug_flag

# verb -> (module with main(argv), one-line summary)
VERBS = {
    "report": ("joulebench.analysis.report", "charts, a table and an HTML page over run records; --compare A B"),
    "plot": ("joulebench.analysis.plot", "a trace's power, clocks and utilisation with its windows shaded"),
    "plan": ("joulebench.analysis.plan", "one SM clock per phase under a slowdown limit, beside the best single "
                                         "clock (a prediction)"),
    "recommend": ("joulebench.analysis.recommend", "the cheapest software setting of a sweep that meets a target, "
                                                   "its saving against the default; --remeasure confirms it"),
    "attribute": ("joulebench.analysis.attribute", "where a window's joules go: per phase (fit, replay), kernel "
                                                   "classes; writes the record's attribution block"),
    "doctor": ("joulebench.analysis.doctor", "after installing: what blocks the quick start or another workflow here, "
                                             "each with its fix (exit 0: nothing blocks the quick start)"),
    "demo": ("joulebench.analysis.demo", "a tiny CPU run metered by a replayed H100 trace, then plot, report and "
                                         "attribute it (labelled: replayed trace, not this machine)"),
}


def usage() -> str:
    lines = ["usage: joulebench VERB [options]   (joulebench VERB --help for a verb's options)", "", "verbs:"]
    lines += [f"  {verb:<10} {summary}" for verb, (_, summary) in VERBS.items()]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    debug, args = take_debug_flag(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(usage())
        return ExitCode.OK if args else ExitCode.USAGE
    verb, rest = args[0], args[1:]
    if verb not in VERBS:
        print(f"joulebench: error: unknown verb {verb!r}. Fix: use one of {', '.join(VERBS)}\n\n{usage()}",
              file=sys.stderr)
        return ExitCode.USAGE
    # imported inside the error boundary: a verb's missing extra is named, not a traceback
    return exit_code_of(f"joulebench {verb}", lambda: importlib.import_module(VERBS[verb][0]).main(rest), debug)
