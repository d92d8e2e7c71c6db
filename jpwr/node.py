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


def node_name(environ: Mapping[str, str] | None = None) -> str:
    """This node's name: Slurm's node name where set (unique per test node), else the hostname."""
    env = os.environ if environ is None else environ
    return env.get("SLURMD_NODENAME") or env.get("JPWR_NODE_NAME") or socket.gethostname()


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

    if not value or "/" in value or "\\" in value or ".." in value or value.strip() != value:
        raise ValidationError(f"{what} {value!r} cannot be used as a file name (separators, '..' or blanks)", fix)
    return value
