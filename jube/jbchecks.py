"""Checks of a sweep point's numbers, the profile's switches and its time limit, before anything is submitted.

Why here: the validate step (jbprofile.py) must refuse a point that cannot run with a reason naming the value and
the fix, the same way for every workflow. A point's own mistake is PointRefused (an INVALID row, the other points
run), a profile's is ConfigError (the whole workflow stops). Standard library only (Python >= 3.10).
"""

from __future__ import annotations

import math

import jbslurm
from jbsystems import ConfigError, PointRefused, override_variable

DEVICE_SETTINGS_POLICIES = ("off", "allowed")
# Valid numbers of the workflow parameters and profile keys the driver arguments come from:
# (kind, minimum, whether the minimum itself is allowed).
NUMBERS = {
    "nodes": (int, 1, True), "devices_per_node": (int, 1, True),
    "batch_devices": (int, 1, True), "cpu_threads_per_node": (int, 0, True),
    "global_batch_size": (int, 1, True), "micro_batch_size": (int, 1, True), "tensor_parallel": (int, 1, True),
    "pipeline_parallel": (int, 1, True), "seq_length": (int, 1, True), "iterations": (int, 1, True),
    "warmup_iterations": (int, 0, True), "image_size": (int, 1, True), "batch_size": (int, 1, True),
    "log_interval": (int, 1, True), "steady_seconds": (float, 0.0, False), "min_window_s": (float, 0.0, False),
    "min_steady_s": (float, 0.0, True), "startup_s": (float, 0.0, True), "power_limit": (float, 0.0, False),
    "sm_clock": (int, 1, True), "max_concurrency": (int, 1, True), "slo_ttft_ms": (float, 0.0, False),
    "slo_tpot_ms": (float, 0.0, False), "admit_divisor": (int, 1, True),
}
STOP_MARGIN = (0.10, 10, 300)  # the job stops its run this share of the time limit early, within [10 s, 5 min]
TIGHT = 1.5  # a stop budget below this many times start-up + minimum steady window is worth a warning


def number(value: str, what: str, key: str) -> int | float:
    """`value` as the kind of number `key` takes, refusing NaN, infinity and values below its minimum."""
    kind, minimum, inclusive = NUMBERS[key]
    wanted = f"a {'whole ' if kind is int else 'finite '}number {'>=' if inclusive else '>'} {minimum}"
    try:
        parsed = kind(value)
    except ValueError:
        raise PointRefused(f"{what}={value!r} is not a number", f"set {what} to {wanted}") from None
    if not math.isfinite(parsed) or parsed < minimum or (parsed == minimum and not inclusive):
        raise PointRefused(f"{what}={value} is out of range", f"set {what} to {wanted}")
    return parsed


def check_local_layout(nodes: int, per_node: int, profile: dict[str, str]) -> None:
    """`local` runs its ranks on this host: one node identity with the job's devices (data parallel, issue 43), or
    several identities (issue 21) of per_node GPUs each, as a cluster's nodes: no more GPUs than the host has."""
    gpus = profile.get("local_gpus")
    if profile["vendor"] != "cpu" and gpus is not None and nodes * per_node > int(gpus):
        asked = f"nodes={nodes} x devices_per_node={per_node}" if nodes > 1 else f"devices_per_node={per_node}"
        fix = f"use nodes x devices_per_node <= {gpus}" if nodes > 1 else f"use devices_per_node <= {gpus}"
        raise PointRefused(f"the local system has {gpus} GPU(s) this job may use, the point asks for {asked}",
                           f"{fix} on this machine (or free more GPUs: CUDA_VISIBLE_DEVICES / HIP_VISIBLE_DEVICES)")


def devices_per_node(profile: dict[str, str], value: dict[str, str], nodes: int) -> int:
    """The point's devices (ranks) per node: the point's own devices_per_node, else the profile's, where `all` (local
    only) is every GPU the job may use here, one process on a host without one. More than a node has is refused."""
    written = profile["devices_per_node"].strip().lower()
    local = profile["launcher"] == "local"
    if written == "all" and not local:
        raise ConfigError(f"profile key devices_per_node = all on {profile['system']}, which is not a local system",
                          "set devices_per_node to the number of accelerators of a node")
    gpus = int(profile.get("local_gpus") or 0) if local and profile["vendor"] != "cpu" else None
    if written == "all":
        node_has = gpus if gpus is not None else 1
    else:
        node_has = int(number(written, "devices_per_node", "devices_per_node"))
    if not value.get("devices_per_node"):
        return 1 if local and nodes > 1 and written == "all" else node_has  # node identities: one GPU each
    asked = int(number(value["devices_per_node"], "devices_per_node", "devices_per_node"))
    if not local and asked > node_has:
        raise PointRefused(f"devices_per_node={asked} is more than a node of {profile['system']} has "
                           f"(devices_per_node = {node_has})", f"use devices_per_node <= {node_has}")
    return asked


def batch_scaling(profile: dict[str, str], value: dict[str, str], devices: int, reference_nodes: int,
                  key: str) -> tuple[str, str]:
    """(the rule, the profile batch for a point of `devices` devices in all): weak keeps the per-device batch of the
    profile's `key`, written for `reference_nodes` nodes of batch_devices each; strong keeps the batch; a point's own
    global_batch_size is used as given."""
    rule = profile["scaling"].strip().lower()
    if rule not in ("weak", "strong"):
        raise ConfigError(f"profile key scaling = {rule!r} is neither weak nor strong",
                          "set scaling = weak (the per-device batch stays, docs/jube.md) or strong (the batch stays)")
    written = profile.get(key, "")
    if value.get("global_batch_size"):
        return "strong", written
    if not written:  # the driver's preset: micro-batches per replica, so the per-device batch stays
        return "weak", written
    if rule == "strong":
        return rule, written
    per_node = int(number(profile["batch_devices"] or profile["devices_per_node"], "batch_devices", "batch_devices"))
    reference = reference_nodes * per_node
    gbs = int(number(written, key, "global_batch_size"))
    if gbs * devices % reference:
        raise PointRefused(f"weak scaling: {key} = {gbs} for {reference} device(s) has no whole per-device batch on "
                           f"{devices}", "set global_batch_size for this point, or scaling = strong")
    return rule, str(gbs * devices // reference)


def local_node_devices(profile: dict[str, str]) -> str:
    value = profile["local_node_devices"].strip().lower()
    if value not in ("own", "all"):
        raise ConfigError(f"profile key local_node_devices = {value!r} is neither own nor all",
                          "set local_node_devices = own (each node identity's sampler meters its GPU) or all")
    return value


def device_settings_policy(profile: dict[str, str]) -> str:
    """The site's opt-in for power-limit and clock sweeps; a typo must not mean either."""
    value = profile["device_settings"].strip().lower()
    if value not in DEVICE_SETTINGS_POLICIES:
        raise ConfigError(f"profile key device_settings = {value!r} is neither off nor allowed",
                          "set device_settings = off (the default) or, where the admins allow sweeps, allowed "
                          "(docs/sweeps.md)")
    return value


def check_site_names(profile: dict[str, str]) -> None:
    """`partition` and `account` are one Slurm name each (sbatch --partition=NAME); whitespace is a typo."""
    for key in ("partition", "account"):
        if len(profile[key].split()) > 1:
            raise ConfigError(f"profile key {key} = {profile[key]!r} is not one Slurm name",
                              f"set {key} to one name, or a comma list without spaces for partitions "
                              f"({override_variable(profile['system'], key)})")


def yes_or_no(value: str, key: str) -> str:
    """A profile switch: yes or no, nothing else (a typo must not silently mean either)."""
    if value.strip().lower() not in ("yes", "no"):
        raise ConfigError(f"profile key {key} = {value!r} is neither yes nor no", f"set {key} = yes or {key} = no")
    return value.strip().lower()


def stop_margin_s(limit_s: int) -> int:
    """How long before its time limit a job stops its run, leaving time for the samplers and the record."""
    share, low, high = STOP_MARGIN
    return int(min(high, max(low, share * limit_s)))


def limit_for_budget(budget_s: float) -> int:
    """The shortest time limit whose stop budget (limit minus margin) is at least `budget_s`, in whole minutes."""
    share, low, high = STOP_MARGIN
    limit = max(budget_s + low, min(budget_s / (1 - share), budget_s + high))
    return int(math.ceil(limit / 60.0) * 60)


def check_time_limit(limit_s: int, startup_s: float, steady_s: float, what: str, system: str) -> str:
    """Refuse a limit that cannot hold start-up, warm-up and the minimum steady window; a warning when tight."""
    margin = stop_margin_s(limit_s)
    budget, needed = limit_s - margin, startup_s + steady_s
    detail = (f"time limit {jbslurm.hms(limit_s)} leaves {budget} s before the job stops its run ({margin} s are "
              f"kept for the record), for about {startup_s:g} s of start-up and warm-up of {what} and a {steady_s:g} s "
              "minimum steady window")
    if budget < needed:
        raise PointRefused(detail, f"set time_limit to at least {jbslurm.hms(limit_for_budget(needed))} "
                                   f"({override_variable(system, 'time_limit')}), or shorten the run (steady_seconds)")
    if budget < TIGHT * needed:
        return f"tight time limit: {detail}; it may stop before the steady window is long enough"
    return ""
