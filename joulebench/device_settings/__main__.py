"""`python -m joulebench.device_settings probe|apply|restore`: the job script's (and epilog's) interface.

    probe    can the requested settings be applied here? Reads only; prints each device's current settings.
    apply    check every device, save the prior values to the state file, set; roll back on any failure.
    restore  put back what the state file says was changed; no state file = nothing to do.
    hold     apply, then keep the settings until a stop signal or the parent's exit, then restore (the job
             script's guard: one per node, living as long as the run).

    python -m joulebench.device_settings probe --device-settings allowed --power-limit 300
    python -m joulebench.device_settings apply --device-settings allowed --sm-clock 1410 --record settings.json
    python -m joulebench.device_settings restore --device-settings allowed --job-id "$SLURM_JOB_ID"

`--device-settings` carries the profile key of the same name (default off). Exit codes: 0 done (also: nothing
requested, nothing to restore); 64 a bad value (unknown policy, out of range); 65 a damaged state file; 69 no NVML
here (apply, restore); 73 the state file cannot be written (nothing changed); 74 a device rejected a call (rolled
back; the message says what is left); 77 refused (the site does not allow settings, or this process has no route:
no root, no usable zeusd). Errors are one line, "joulebench device-settings: error: <setting>: <reason>. Fix:
<fix>"; --debug adds the traceback.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from joulebench.boundary import exit_code_of
from joulebench.device_settings import (
    POLICIES,
    PROFILE_KEY,
    VENDORS,
    Devices,
    Privileges,
    ProbeResult,
    Request,
    apply,
    authorize,
    check_policy,
    open_devices,
    probe,
    restore,
    vendor_of_route,
)
from joulebench.device_settings.nvml import Reading
from joulebench.device_settings.record import node_block
from joulebench.device_settings.state import DEFAULT_STATE_DIR, SettingsState, check_owner, state_path
from jpwr import ExitCode, ValidationError
from jpwr.devices import job_devices, node_name
from jpwr.errors import ArgumentParser, take_debug_flag
from jpwr.output import fmt, write_json_atomic

PROG = "joulebench device-settings"
STATE_DIR_VARIABLE = "JOULEBENCH_DEVICE_SETTINGS_STATE_DIR"
INTERRUPTING_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1)


def _value(text: str | None, kind: Callable[[str], Any], setting: str, unit: str) -> Any:
    """Empty means 'the device's own setting' (the job script passes the sweep value as it is)."""
    if text is None or not text.strip():
        return None
    try:
        return kind(text.strip())
    except ValueError:
        raise ValidationError(f"{setting}={text!r} is not a number of {unit}",
                              f"give {setting} in {unit} ({'an integer' if kind is int else 'a number'}), or leave it "
                              "empty for the device's own setting") from None


def _request(args: argparse.Namespace) -> Request:
    return Request(_value(args.power_limit, float, "power_limit", "W"), _value(args.sm_clock, int, "sm_clock", "MHz"))


def _parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog=PROG, description="Probe, apply and restore GPU power limits and locked "
                                                   "SM clocks (docs/sweeps.md).")
    sub = parser.add_subparsers(dest="verb", required=True)
    verbs = {"probe": "can the settings be applied here? (reads only)",
             "apply": "check, save the prior values, set; roll back on failure",
             "restore": "put back what the state file says was changed",
             "hold": "apply, keep the settings until TERM/INT/HUP/USR1 or the parent exits, then restore"}
    for verb, text in verbs.items():
        p = sub.add_parser(verb, help=text, description=text)
        p.add_argument(f"--{PROFILE_KEY.replace('_', '-')}", dest="policy", default="off",
                       help=f"the profile's {PROFILE_KEY} key, {' or '.join(POLICIES)}: the site's opt-in "
                            "(default off)")
        p.add_argument("--zeusd-socket", default="", help="the profile's zeusd_socket: change settings through zeusd")
        p.add_argument("--vendor", default="nvidia", choices=VENDORS, help="whose library changes the settings: "
                                                                             "NVML (nvidia) or amdsmi (amd)")
        if verb != "restore":
            p.add_argument("--power-limit", default=None, metavar="W", help="empty: the device's own limit")
            p.add_argument("--sm-clock", default=None, metavar="MHz", help="empty: the device's own clocks")
            p.add_argument("--devices", default=None, help="NVML/amdsmi indices or GPU UUIDs, comma separated "
                                                           "(default: the job's visible devices, else every GPU)")
        if verb != "probe":
            p.add_argument("--state", default=None, help="state file (default <state-dir>/<job id>.<node>.json)")
            p.add_argument("--state-dir", default=os.environ.get(STATE_DIR_VARIABLE) or DEFAULT_STATE_DIR,
                           help=f"default ${STATE_DIR_VARIABLE}, else {DEFAULT_STATE_DIR} (the epilog must look in "
                                "the same place)")
            p.add_argument("--job-id", default=os.environ.get("SLURM_JOB_ID", "local"))
        if verb in ("apply", "hold"):
            p.add_argument("--record", default=None, help="write requested and read-back values (JSON) for the run "
                                                          "record; {node} becomes this node's name")
        if verb == "probe":
            p.add_argument("--login-node", action="store_true", help="the GPUs are on other nodes: check the site's "
                                                                     "policy and the route only (the validate step)")
    return parser


def _selectors(devices: str | None, vendor: str) -> list[str] | None:
    if devices:
        return [d.strip() for d in devices.split(",") if d.strip()]
    return job_devices(vendor).selector_list


def _describe(reading: Reading) -> str:
    def watts(mw: int | None) -> str:
        return fmt(None if mw is None else mw / 1000)

    limit_range = reading.power_limit_range_mw or (None, None)
    clocks = reading.supported_sm_clocks_mhz
    flags = {True: "yes", False: "no", None: "n/a"}
    return (f"power limit {watts(reading.power_limit_mw)} W (default {watts(reading.default_power_limit_mw)}, range "
            f"{watts(limit_range[0])}-{watts(limit_range[1])} W), SM clock {fmt(reading.sm_clock_mhz)} MHz "
            f"(supported {fmt(clocks[0] if clocks else None)}-{fmt(clocks[-1] if clocks else None)} MHz), held by a "
            f"clock setting: {flags[reading.clock_held_by_setting]}, persistence mode: "
            f"{flags[reading.persistence_mode]}, application clocks restricted to root: "
            f"{flags[reading.application_clocks_restricted]}")


def _print_probe(result: ProbeResult, request: Request) -> None:
    for device, reading in result.readings or ():
        print(f"device-settings: {device.label}: {_describe(reading)}")
    if result.note:
        print(f"device-settings: {result.note}")
    if result.authorization is None:
        print("device-settings: nothing requested: the devices keep their own settings")
        return
    for plan in result.plans:
        todo = [f"power limit {fmt(plan.power_limit_mw / 1000)} W"] if plan.power_limit_mw is not None else []
        todo += [f"SM clock locked at {plan.lock_mhz} MHz"] if plan.lock_mhz is not None else []
        print(f"device-settings: {plan.device.label}: would set {', '.join(todo)}"
              + "".join(f"; {note}" for note in plan.notes))
    print(f"device-settings: {request.names}: permitted {result.authorization.detail}")


def cmd_probe(args: argparse.Namespace) -> int:
    request = _request(args)
    result = probe(args.policy, request, Privileges.of_this_process(), args.zeusd_socket or None, args.vendor,
                   _selectors(args.devices, args.vendor), args.login_node)
    _print_probe(result, request)
    return ExitCode.OK


def _raise_on_signal(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def _apply_here(args: argparse.Namespace, request: Request, devices: Devices) -> tuple[Any, Path, dict[str, Any]]:
    """Authorise and apply on this node's devices (a signal meanwhile rolls back and exits), print what was set;
    returns the authorization, the state file and this node's record block."""
    node = node_name()
    path = state_path(args.state, args.state_dir, args.job_id, node)
    authorization = authorize(args.policy, request, Privileges.of_this_process(), args.zeusd_socket or None,
                              args.vendor)
    _, applied = apply(authorization, request, devices, _selectors(args.devices, args.vendor), path, args.job_id, node)
    for device in applied:
        locked = device["locked_sm_clock_mhz"]
        print(f"device-settings: device {device['index']} ({device['name']}, {device['uuid']}): power limit "
              f"{fmt(device['prior_power_limit_w'])} -> {fmt(device['power_limit_w'])} W"
              + (f", SM clock locked at {locked} MHz (reads {fmt(device['sm_clock_mhz_after_apply'])} MHz)"
                 if locked is not None else "") + "".join(f"; {note}" for note in device["notes"]), flush=True)
    print(f"device-settings: applied {request.names} {authorization.detail}; prior values in {path}", flush=True)
    return authorization, path, node_block(request, authorization.route, node, str(path), applied)


def _record_path(args: argparse.Namespace) -> Path | None:
    """--record, with {node} replaced: one file per node when every node runs the same command line (srun)."""
    return Path(str(args.record).replace("{node}", node_name())) if args.record else None


def cmd_apply(args: argparse.Namespace) -> int:
    check_policy(args.policy)
    request = _request(args)
    record = node_block(request, None, node_name(), None, [])
    if request.is_empty:
        print("device-settings: nothing requested: the devices keep their own settings")
    else:
        devices = open_devices(args.vendor)
        previous = {s: signal.signal(s, _raise_on_signal) for s in INTERRUPTING_SIGNALS}  # a signal rolls back
        try:
            _, _, record = _apply_here(args, request, devices)
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
            devices.close()
    if (path := _record_path(args)) is not None:
        write_json_atomic(path, record)
    return ExitCode.OK


def _wait_for_stop(watched_parent: int) -> str:
    """Block until a stop signal (held pending: none is lost) or until the process that started us is gone."""
    while True:
        info = signal.sigtimedwait(INTERRUPTING_SIGNALS, 1.0)
        if info is not None:
            return f"SIG{signal.Signals(info.si_signo).name.removeprefix('SIG')}"
        if os.getppid() != watched_parent:
            return "its parent (the job script or srun) exited"


def cmd_hold(args: argparse.Namespace) -> int:
    """Apply, hold the settings while the run goes on, restore when told to stop: the job script's guard.

    Living as long as the run, on the node itself, it restores on every way a job ends that leaves time for it: the
    job script's TERM after a normal end, a failure or its own stop budget, Slurm's TERM at the time limit or on
    scancel (sent to every step at once), USR1, or the job script vanishing. Only SIGKILL defeats it: then the
    epilog's `restore` reads the state file (docs/sweeps.md)."""
    check_policy(args.policy)
    request = _request(args)
    if request.is_empty:
        raise ValidationError("hold: no setting requested", "give --power-limit and/or --sm-clock (the job script "
                                                             "starts hold only for a point that asks for a setting)")
    watched = os.getppid()
    record_path = _record_path(args)
    devices = open_devices(args.vendor)
    previous = {s: signal.signal(s, _raise_on_signal) for s in INTERRUPTING_SIGNALS}  # during apply: roll back
    path: Path | None = None
    try:
        try:
            authorization, path, record = _apply_here(args, request, devices)
            if record_path is not None:
                write_json_atomic(record_path, record)  # the job script waits for this file: the run may start
            signal.pthread_sigmask(signal.SIG_BLOCK, INTERRUPTING_SIGNALS)
            stopped_by = _wait_for_stop(watched)
        except SystemExit as exc:
            if path is None or not path.exists():
                raise  # the signal came during apply, which rolled every device back
            # _raise_on_signal's code is 128 + the signal; any other exit is named as it came
            stopped_by = (f"signal {exc.code - 128} right after apply" if isinstance(exc.code, int)
                          else f"exit {exc.code!r} right after apply")
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
        print(f"device-settings: stopping ({stopped_by}); restoring", flush=True)
        try:
            restored = restore(SettingsState.load(path), devices, authorization)
        except Exception as exc:
            record["restore"] = {"status": "failed", "stopped_by": stopped_by, "detail": str(exc)}
            raise
        finally:
            if record_path is not None and "restore" not in record:
                record["restore"] = {"status": "restored", "stopped_by": stopped_by}
            if record_path is not None:
                write_json_atomic(record_path, record)
    finally:
        devices.close()
    print(f"device-settings: restored the prior settings of {len(restored)} device(s); removed {path}")
    return ExitCode.OK


def cmd_restore(args: argparse.Namespace) -> int:
    check_policy(args.policy)
    path = state_path(args.state, args.state_dir, args.job_id, node_name())
    if not path.exists() and not path.is_symlink():
        print(f"device-settings: nothing to restore (no state file {path})")
        return ExitCode.OK
    privileges = Privileges.of_this_process()
    check_owner(path, privileges.euid, os.environ.get("SLURM_JOB_UID"))
    state = SettingsState.load(path)
    vendor = vendor_of_route(state.route)  # the file says whose library changed the devices
    authorization = authorize(args.policy, Request.from_dict(state.request), privileges,
                              args.zeusd_socket or None, vendor)
    devices = open_devices(vendor)
    try:
        restored = restore(state, devices, authorization)
    finally:
        devices.close()
    for label in restored:
        print(f"device-settings: {label}: restored")
    print(f"device-settings: restored the prior settings of {len(restored)} device(s) {authorization.detail}; "
          f"removed {path}")
    return ExitCode.OK


def main(argv: Sequence[str] | None = None) -> int:
    debug, rest = take_debug_flag(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(rest)
    handlers = {"probe": cmd_probe, "apply": cmd_apply, "restore": cmd_restore, "hold": cmd_hold}
    return exit_code_of(PROG, lambda: handlers[args.verb](args), debug)


if __name__ == "__main__":
    sys.exit(main())
