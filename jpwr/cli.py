"""`jpwr`: wrap a command and meter it, or run the node sampler, combine nodes, inspect sensors.

    jpwr [--methods auto|nvml,rapl,...] [--interval MS] [--out DIR] [--run-id ID] [--whole-node] -- CMD ...
    jpwr serve --out DIR [--run-id ID] [--addr PATH] [--whole-node]  # one per node in a job script; stops on TERM
    jpwr combine DIR [--run-id ID]                        # merge node summaries of one run
    jpwr info                                             # sensors, signals, read cost, update period
    jpwr selftest                                         # periodic GPU load vs. the sensors (aliasing check)
    jpwr qualify METER_A METER_B                          # a meter against a reference, MLPerf-style (5 windows)

Reports and trace plots moved to `joulebench report` / `joulebench plot` (analysis is not the
meter's job); `jpwr report` and `jpwr plot` forward there until the next minor release.

Exit codes: the wrapped command's own code (128+N if it died of signal N); jpwr's own errors
use jpwr.errors.ExitCode (64 usage, 69 method unavailable, 70 internal, 73 output dir, 127 no command).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from jpwr import __version__
from jpwr.arguments import (
    FRACTION,
    INTERVAL_MS,
    NODES,
    PORT,
    SECONDS_OR_ZERO,
    state_ranges,
)
from jpwr.clock import SYSTEM_CLOCK
from jpwr.errors import (
    ArgumentParser,
    ExitCode,
    ValidationError,
    exit_code_of,
    os_error_message,
    signal_death,
    take_debug_flag,
)
from jpwr.node import check_file_name, directory_node_name
from jpwr.output import fmt, write_atomic
from jpwr.summary import NodeSummary

SUBCOMMANDS = ("serve", "combine", "info", "selftest", "qualify")
MOVED_VERBS = ("plot", "report")  # now `joulebench VERB`; forwarded until the next minor release
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)


def _add_meter_options(p: argparse.ArgumentParser) -> None:
    from jpwr.windows import DEFAULT_MIN_COVERAGE

    p.add_argument("--methods", nargs="+", default=["auto"],
                   help="auto (default) or names: nvml, amdsmi, rapl, hwmon_gh, gcipuinfo "
                        "(aliases pynvml, rocm, gh, gc); comma or space separated; replay:TRACE_DIR plays a "
                        "recorded trace back (joulebench demo)")
    p.add_argument("--interval", type=INTERVAL_MS, default=100.0, help="power/metrics sampling interval in ms")
    p.add_argument("--counter-interval", type=INTERVAL_MS, default=1000.0, help="energy counter read interval in ms")
    p.add_argument("--out", default="jpwr_out", help="output directory (per-node subdirectories)")
    p.add_argument("--run-id", default=None, help="run id shared by all nodes of one run")
    p.add_argument("--metrics-port", type=PORT, default=None,
                   help="serve power and energy counters per device at http://HOST:PORT/metrics in Prometheus' "
                        "text format, labelled with node, run id and the open window (default: off)")
    p.add_argument("--metrics-host", default="127.0.0.1",
                   help="address --metrics-port binds to (default 127.0.0.1: this host only; 0.0.0.0 opens it to "
                        "the network, e.g. for the cluster's Prometheus: the figures show what runs where)")
    p.add_argument("--min-coverage", type=FRACTION, default=DEFAULT_MIN_COVERAGE,
                   help="fraction of a window each device's data must cover for its energy to be trusted "
                        f"(default {DEFAULT_MIN_COVERAGE:g}; 0 = trust any coverage); below it the energy is n/a and "
                        "the run PARTIAL")
    p.add_argument("--whole-node", action="store_true",
                   help="also meter the node's devices the job is not bound to (CUDA_VISIBLE_DEVICES, ROCR/HIP, "
                        "Slurm's GPU binding), on their own line per window: 'not used by the job: N devices, X J'; "
                        "never in the headline (default: the job's devices only)")


def _methods(raw: Sequence[str]) -> list[str] | None:
    from jpwr.backends import parse_methods

    return parse_methods(",".join(raw))


def _run_id(explicit: str | None) -> str:
    """One id for all nodes of a run: explicit, else the Slurm job (same on every node), else time and pid."""
    if explicit:
        return explicit
    if os.environ.get("JPWR_RUN_ID"):
        return os.environ["JPWR_RUN_ID"]
    job = os.environ.get("SLURM_JOB_ID")
    return f"slurm-{job}" if job else f"run-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"


def _start(args: argparse.Namespace):
    from jpwr.channel import resolve_addr
    from jpwr.claims import claim_socket
    from jpwr.sampler import Sampler, SocketServer, default_socket_path, open_backends

    methods = _methods(args.methods)
    out = Path(args.out)
    run_id = check_file_name(_run_id(args.run_id), "run id", "pass --run-id (or JPWR_RUN_ID) without '/' or '..'")
    directory_node_name()
    template = getattr(args, "addr", None) or default_socket_path(run_id)
    addr = resolve_addr(template)
    claim_socket(addr)  # before the sampler writes anything: a refused start leaves no trace behind
    backends, discoveries = open_backends(methods, SYSTEM_CLOCK, whole_node=args.whole_node)
    sampler = Sampler(backends, discoveries, out, args.interval / 1000.0, args.counter_interval / 1000.0,
                      run_id=run_id, min_coverage=args.min_coverage).start()
    server = SocketServer(sampler, addr).start()
    metrics = None
    if args.metrics_port is not None:
        from jpwr.prometheus import MetricsServer

        try:
            metrics = MetricsServer(sampler, args.metrics_host, args.metrics_port).start()
        except OSError as exc:
            server.stop()
            sampler.stop()
            raise ValidationError(f"--metrics-port {args.metrics_port} on {args.metrics_host}: "
                                  f"{exc.strerror or exc}", "pick a free port") from None
        print(f"jpwr: Prometheus metrics at {metrics.address}", file=sys.stderr, flush=True)
    return sampler, server, template, metrics


def _print_windows(summary: NodeSummary, stream: TextIO = sys.stderr) -> None:
    info = summary.info
    print(f"jpwr {__version__}: node {summary.node}, run {summary.run_id}, "
          f"backends: {', '.join(info['backends']) or 'none'}", file=stream)
    for reason in info["unavailable"]:
        print(f"jpwr:   {reason}", file=stream)
    if summary.trace_error:
        print(f"jpwr: warning: the trace was not saved completely: {summary.trace_error}", file=stream)
    first_with: dict[str | None, str] = {}  # a reason in full once (on a CPU machine 460 characters, every window's)
    for name, w in summary.windows.items():
        e = w.energy
        if e.energy_j is None:
            said = first_with.setdefault(e.unavailable_reason, name)
            why = e.unavailable_reason if said == name else f"the same reason as window {said}"
            print(f"jpwr: window {name}: {w.duration_s:.3f} s, energy n/a ({why})", file=stream)
            continue
        coverage = "n/a" if e.coverage is None else f"{e.coverage:.1%}"
        print(f"jpwr: window {name}: {w.duration_s:.3f} s, {fmt(e.energy_j, 6)} J ({fmt(e.energy_wh, 5)} Wh) "
              f"on {e.devices} device(s) ({e.domain or 'accelerators'}), mean {fmt(e.mean_power_w, 5)} W, "
              f"method {e.method}, "
              f"coverage {coverage}, bound ±{fmt(e.error_bound_j, 3)} J", file=stream)
        if e.outside_job_line:
            print(f"jpwr: window {name}: {e.outside_job_line} (not in the figures above)", file=stream)
        for warning in e.warnings:
            print(f"jpwr:   warning: {warning}", file=stream)


def cmd_wrap(argv: Sequence[str]) -> int:
    parser = ArgumentParser(prog="jpwr", description="Meter a command's accelerator energy.",
                            epilog="Subcommands: " + ", ".join(SUBCOMMANDS))
    _add_meter_options(parser)
    parser.add_argument("--df-out", default=None, help="jpwr 0.0.10 compatibility: write power/energy tables here")
    parser.add_argument("--df-filetype", default="csv", choices=("csv", "h5"))
    parser.add_argument("--version", action="version", version=f"jpwr {__version__} (joulebench)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ARGS...")
    args = state_ranges(parser).parse_args(argv)
    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        parser.error("no command given: jpwr [options] -- CMD ...")
    from jpwr.channel import ADDR_ENV, Mark

    sampler, server, template, metrics = _start(args)
    env = dict(os.environ, **{ADDR_ENV: template, "JPWR_RUN_ID": sampler.run_id})
    # The whole command is a window of its own, so a command that marks nothing is metered too.
    sampler.add_mark(Mark("command", "begin", 0, SYSTEM_CLOCK.monotonic_ns()))
    try:
        child = subprocess.Popen(command, env=env)
    except (FileNotFoundError, PermissionError, NotADirectoryError) as exc:
        server.stop()
        if metrics:
            metrics.stop()
        sampler.stop()
        if isinstance(exc, FileNotFoundError):
            print(f"jpwr: command not found: {command[0]}. Fix: check its name and PATH", file=sys.stderr)
            return ExitCode.NO_COMMAND
        print(f"jpwr: command not executable: {command[0]}. Fix: make it executable (chmod +x) or run it "
              "through its interpreter", file=sys.stderr)
        return ExitCode.NOT_EXECUTABLE

    def forward(signum: int, _frame: object) -> None:
        if child.poll() is None:
            child.send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in FORWARDED_SIGNALS}
    try:
        code = child.wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    sampler.add_mark(Mark("command", "end", 0, SYSTEM_CLOCK.monotonic_ns()))
    server.stop()
    child_code = 128 - code if code < 0 else code
    if code < 0:
        print(f"jpwr: {command[0]} was {signal_death(-code)}", file=sys.stderr)
    try:
        summary = sampler.stop()
        if args.df_out:
            from jpwr.legacy import write_dataframes

            write_dataframes(sampler.trace(), Path(args.df_out), args.df_filetype)
    except OSError as exc:
        # The command ran and was measured: say what failed, print what was measured, keep its exit code.
        print(f"jpwr: error: could not write the results: {os_error_message(exc)}", file=sys.stderr)
        _print_windows(sampler.in_memory_summary())
        return child_code
    finally:  # after the sampler: the trace and summary are written whatever the metrics' clients do
        if metrics:
            metrics.stop()
    _print_windows(summary)
    return child_code


def cmd_serve(argv: Sequence[str]) -> int:
    parser = ArgumentParser(prog="jpwr serve", description="Run this node's sampler until SIGTERM/SIGINT.")
    _add_meter_options(parser)
    parser.add_argument("--addr", default=None, help="socket path template ({node} = node name); default from "
                                                     "JPWR_ADDR or a per-run path in the temp dir")
    args = state_ranges(parser).parse_args(argv)
    from jpwr.channel import ADDR_ENV

    args.addr = args.addr or os.environ.get(ADDR_ENV)
    stop = threading.Event()
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, lambda *_: stop.set())
    sampler, server, _, metrics = _start(args)
    write_atomic(sampler.node_dir / "ready", f"{server.addr}\n")  # polled by job scripts: whole or absent
    print(f"jpwr: serving node {sampler.node} on {server.addr} (run {sampler.run_id})", file=sys.stderr, flush=True)
    stop.wait()
    server.stop()
    try:
        summary = sampler.stop()
    finally:  # after the sampler: the trace and summary are written whatever the metrics' clients do
        if metrics:
            metrics.stop()
    _print_windows(summary)
    return ExitCode.OK


def cmd_combine(argv: Sequence[str]) -> int:
    from jpwr.combine import combine_run, expected_nodes_from

    parser = ArgumentParser(prog="jpwr combine", description="Merge the node summaries of one run.")
    parser.add_argument("directory")
    parser.add_argument("--run-id", default=None, help="the run to combine (needed when DIR holds several)")
    parser.add_argument("--expected-nodes", type=NODES, default=expected_nodes_from(),
                        help="nodes the run has (default: Slurm's SLURM_JOB_NUM_NODES); fewer found = no energy")
    args = state_ranges(parser).parse_args(argv)
    result = combine_run(Path(args.directory), args.run_id, args.expected_nodes)
    for node in result.recovered_nodes:
        print(f"jpwr combine: warning: node {node} had no summary (sampler killed?); recovered from its segments",
              file=sys.stderr)
    if result.partial:
        print(f"jpwr combine: warning: {result.partial}", file=sys.stderr)
    for name, w in result.windows.items():
        e = w.energy
        print(f"{name}: nodes={len(result.nodes)} devices={e.devices} energy_J={fmt(e.energy_j, 6)} "
              f"energy_Wh={fmt(e.energy_wh, 5)} method={e.method or 'n/a'} "
              f"{'reason=' + e.unavailable_reason if e.unavailable_reason else ''}".rstrip())
        if e.outside_job_line:
            print(f"{name}:   {e.outside_job_line} (not in the figures above)")
        for warning in e.warnings:
            print(f"{name}:   warning: {warning}")
    return ExitCode.OK


def cmd_info(argv: Sequence[str]) -> int:
    parser = ArgumentParser(prog="jpwr info", description="List sensors, signals, read cost, update period.")
    parser.add_argument("--methods", nargs="+", default=["auto"])
    parser.add_argument("--probe-seconds", type=SECONDS_OR_ZERO, default=1.0,
                        help="time spent measuring update periods (0 = list the sensors, no update periods)")
    args = state_ranges(parser).parse_args(argv)
    from jpwr.info import describe

    print(describe(_methods(args.methods), args.probe_seconds))
    return ExitCode.OK


def cmd_selftest(argv: Sequence[str]) -> int:
    from jpwr.selftest import main as selftest_main

    return selftest_main(argv)


def cmd_qualify(argv: Sequence[str]) -> int:
    from jpwr.qualify import main as qualify_main

    return qualify_main(argv)


def cmd_moved(verb: str, argv: Sequence[str]) -> int:
    """Forward a verb that moved to `joulebench` (a separate process: the meter imports nothing of the analysis)."""
    print(f"jpwr: `jpwr {verb}` moved to `joulebench {verb}`; this alias goes in the next minor release",
          file=sys.stderr)
    return subprocess.call([sys.executable, "-m", "joulebench", verb, *argv])


def main(argv: Sequence[str] | None = None) -> int:
    debug, args = take_debug_flag(sys.argv[1:] if argv is None else argv)
    handlers = {"serve": cmd_serve, "combine": cmd_combine, "info": cmd_info, "selftest": cmd_selftest,
                "qualify": cmd_qualify}
    if args and args[0] in MOVED_VERBS:
        return cmd_moved(args[0], args[1:])
    if args and args[0] in handlers:
        return exit_code_of("jpwr", lambda: handlers[args[0]](args[1:]), debug)
    return exit_code_of("jpwr", lambda: cmd_wrap(args), debug)


if __name__ == "__main__":
    sys.exit(main())
