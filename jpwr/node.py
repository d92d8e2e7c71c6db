"""This node's name, as the sampler, its socket and the run record all spell it.

Slurm's node name where set (test "nodes" of a local Slurm cluster share one host and one
hostname), else JPWR_NODE_NAME (several node identities on one host without Slurm), else the hostname.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from pathlib import Path

BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


NODE_NAME_VARIABLES = ("SLURMD_NODENAME", "JPWR_NODE_NAME")  # where node_name looks first, in order


def node_name(environ: Mapping[str, str] | None = None) -> str:
    """This node's name: Slurm's node name where set (unique per test node), else the hostname."""
    env = os.environ if environ is None else environ
    return next((env[v] for v in NODE_NAME_VARIABLES if env.get(v)), None) or socket.gethostname()


def directory_node_name(environ: Mapping[str, str] | None = None) -> str:
    """node_name, checked as the directory it names (<out>/<node>/, a sampler's socket): a name that is no file name
    (`.`, `..`, a separator) is refused naming the variable it came from, before anything is written."""
    env = os.environ if environ is None else environ
    variable = next((v for v in NODE_NAME_VARIABLES if env.get(v)), None)
    return check_file_name(node_name(env), f"node name (from {variable or 'the hostname'})",
                           f"set {variable or 'JPWR_NODE_NAME'} to a name without '/', blanks, '.' or '..'")


def boot_id() -> str:
    """This host's boot id (new at every boot): what tells node identities on one host (JPWR_NODE_NAME, a local
    Slurm's test nodes) from real nodes; the hostname where /proc does not give it."""
    try:
        return BOOT_ID.read_text().strip() or socket.gethostname()
    except OSError:
        return socket.gethostname()


def host_id() -> str:
    """This host, whatever node name it goes by: its hostname and boot id."""
    return f"{socket.gethostname()}:{boot_id()}"


def check_file_name(value: str, what: str, fix: str) -> str:
    """A name that becomes a directory or socket file name (node names, run ids): no separators, no `..`."""
    from jpwr.errors import ValidationError

    if not value or "/" in value or "\\" in value or ".." in value or value.strip() != value or value == ".":
        raise ValidationError(f"{what} {value!r} cannot be used as a file name (separators, '.', '..' or blanks)",
                              fix)
    return value
