#!/usr/bin/env python3
"""Write each workflow's `sweep` parameters from the core's table and its coordinate patterns from them; name the
full table's columns of them.

    python3 jube/jbcolumns.py            # rewrite the generated regions of jube/*_benchmark.xml
    python3 jube/jbcolumns.py --check    # exit 1 when a region is out of date (the tests run this)

Why: every row must say which sweep point it is, whatever its status, and a dimension added to the sweep
(power limit, clock, ...) must get its column without anyone remembering to list it. JUBE's tables are static
XML, so the patterns are derived here from the parameters and written between marker comments; jbrecord.py
writes a `JB coord_<name>=` line for every sweep parameter from the job's settings, and the full table (jbtable.py)
has a column for each (coordinate_columns). The sweep parameters themselves are the driver's rows of the core's
table (joulebench.sweep_settings: a setting is declared once), but those whose values come from the workflow's tags,
written by hand before the generated ones. Standard library and that table only.
"""

from __future__ import annotations

import argparse
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

from jbchecks import NUMBERS  # same directory: which sweep parameters are numbers, and of which kind
from jbworkloads import WORKLOADS

from joulebench.sweep_settings import settings_of

JUBE_DIR = Path(__file__).resolve().parent
WORKFLOWS = sorted(JUBE_DIR.glob("*_benchmark.xml"))
SWEEP_SET = "sweep"
# Short titles where the parameter name is long; every other parameter is titled from its name.
TITLES = {
    "global_batch_size": "GBS", "micro_batch_size": "MBS", "tensor_parallel": "TP", "pipeline_parallel": "PP",
    "seq_length": "Seq length", "image_size": "Image px", "iterations": "Iterations asked",
    "warmup_iterations": "Warm-up iterations", "steady_seconds": "Steady s asked", "min_window_s": "Min window s",
    "batch_size": "Batch", "power_limit": "Power limit W asked", "sm_clock": "SM MHz asked",
    "rate": "Rate req/s", "max_concurrency": "Slots", "slo_ttft_ms": "SLO TTFT ms", "slo_tpot_ms": "SLO TPOT ms",
    "devices_per_node": "Devices/node", "admit_divisor": "Admit 1/N",
}
# Result columns a sweep dimension brings beside its coordinate (pattern name, title): what the job read back and
# observed for a GPU setting, and the compare step's figures against the sweep's default-setting row.
RESULTS_OF = {
    "power_limit": (("power_limit_read_back_w", "Power limit W read back"),),
    "sm_clock": (("locked_sm_clock_mhz", "SM MHz locked"), ("sm_clock_mean_mhz", "SM MHz mean")),
}
COMPARED = (("slowdown", "Slowdown vs default"), ("energy_saving", "Energy saving vs default"))
# Result columns that are numbers where not n/a: a typed NAME_value pattern beside the printed one (common.xml says
# why two), for JUBE to sort and reduce
NUMERIC_RESULTS = ("sm_clock_mean_mhz",)
REGION = re.compile(r"(?P<indent>[ \t]*)<!-- BEGIN generated patterns \(jube/jbcolumns\.py\) -->\n"
                    r".*?[ \t]*<!-- END generated patterns -->\n", re.DOTALL)
SWEEP_REGION = re.compile(r"(?P<indent>[ \t]*)<!-- BEGIN generated sweep \(jube/jbcolumns\.py\) -->\n"
                          r".*?[ \t]*<!-- END generated sweep -->\n", re.DOTALL)


def sweep_parameters(text: str, path: Path) -> list[str]:
    """Names of the `sweep` parameterset in order (a parameter with tag variants counts once)."""
    sets = [s for s in ET.fromstring(text).iter("parameterset") if s.get("name") == SWEEP_SET]
    if len(sets) != 1:
        raise SystemExit(f"{path}: expected one <parameterset name=\"{SWEEP_SET}\">, found {len(sets)}")
    return list(dict.fromkeys(p.get("name", "") for p in sets[0].iter("parameter")))


def sweep_region(driver: str, indent: str) -> str:
    """The driver's sweep dimensions as JUBE parameters, each set through JOULEBENCH_SWEEP_<NAME> (empty: the
    profile's value, else the driver's)."""
    body = [f'<parameter name="{s.key}" mode="shell" export="true">printf %s "${{JOULEBENCH_SWEEP_{s.key.upper()}-}}"'
            "</parameter>" for s in settings_of(driver) if s.sweep and not s.tagged]
    lines = ["<!-- BEGIN generated sweep (jube/jbcolumns.py) -->", *body, "<!-- END generated sweep -->"]
    return "".join(f"{indent}{line}\n" for line in lines)


def benchmark_of(text: str, path: Path) -> str:
    found = ET.fromstring(text).find("benchmark")
    if found is None:
        raise SystemExit(f"{path}: no <benchmark>")
    return found.get("name", "")


def title(name: str) -> str:
    return TITLES.get(name, name.replace("_", " ").capitalize())


def results(names: list[str]) -> list[tuple[str, str]]:
    """(pattern, title) of the result columns the sweep's GPU-setting dimensions bring."""
    found = [item for n in names for item in RESULTS_OF.get(n, ())]
    return found + list(COMPARED) if found else []


def coordinate_columns(names: list[str]) -> list[tuple[str, str]]:
    """(title, JB key) of the full table's columns for the sweep parameters `names`, and what their GPU settings
    bring."""
    return [(title(n), f"coord_{n}") for n in names] + [(t, p) for p, t in results(names)]


def region(names: list[str], indent: str) -> str:
    body = []
    for n in names:
        body.append(f'<pattern name="coord_{n}" type="string">^JB coord_{n}=(\\S+)</pattern>')
        if n in NUMBERS:  # the printed coordinate may read `default` or `-`; the typed one is the number only
            kind, macro = ("int", "$jube_pat_int") if NUMBERS[n][0] is int else ("float", "$jube_pat_fp")
            body.append(f'<pattern name="coord_{n}_value" type="{kind}">^JB coord_{n}={macro}$</pattern>')
    for p, _ in results(names):
        body.append(f'<pattern name="{p}" type="string">^JB {p}=(\\S+)</pattern>')
        if p in NUMERIC_RESULTS:
            body.append(f'<pattern name="{p}_value" type="float">^JB {p}=$jube_pat_fp$</pattern>')
    lines = ["<!-- BEGIN generated patterns (jube/jbcolumns.py) -->", *body, "<!-- END generated patterns -->"]
    return "".join(f"{indent}{line}\n" for line in lines)


def generate(text: str, path: Path) -> str:
    """The workflow's text with both regions written: the sweep from the core's table, the patterns from the sweep."""
    workload = WORKLOADS[benchmark_of(text, path)]
    text = SWEEP_REGION.sub(lambda m: sweep_region(workload.driver, m.group("indent")), text)
    names = sweep_parameters(text, path)
    if tuple(names) != workload.sweep_keys:
        raise SystemExit(f"{path}: the sweep parameters {', '.join(names)} are not the core's table's "
                         f"{', '.join(workload.sweep_keys)}: only a tagged setting is written by hand, before the "
                         "generated ones (joulebench/sweep_settings.py)")
    return REGION.sub(lambda m: region(names, m.group("indent")), text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="jbcolumns.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only report regions that are out of date")
    args = parser.parse_args(argv)
    stale = []
    for path in WORKFLOWS:
        text = path.read_text()
        new = generate(text, path)
        if new != text:
            stale.append(path.name)
            if not args.check:
                path.write_text(new)
    if args.check and stale:
        print(f"out of date: {', '.join(stale)}; run python3 jube/jbcolumns.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
