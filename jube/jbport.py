#!/usr/bin/env python3
"""Job side: a rendezvous port for the ranks (MASTER_PORT), free now and not one the kernel hands out itself.

    jbport.py --span N      # print P such that P .. P+N-1 are free (TF workers listen on P + rank)

A port the kernel picked with bind(("", 0)) comes from its ephemeral range, the range every outgoing
connection on the node also draws from: between this pick and rank 0's listen, another job's connection can
take it (seen in CI: two jobs side by side, EADDRINUSE). Ports below that range are never handed out
implicitly, so only another listener could take one, and a random start makes two jobs' picks unlikely to
meet. Stdlib only: it runs with the profile's Python outside any container.
"""

from __future__ import annotations

import argparse
import random
import socket
import sys
from pathlib import Path

LOWEST_PORT = 10000  # above the well-known and most registered service ports
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
DEFAULT_EPHEMERAL_LOW = 32768  # Linux's default low end, used where the range cannot be read


def ephemeral_low(path: Path = EPHEMERAL_RANGE) -> int:
    """The lowest port the kernel gives to unbound sockets on this node."""
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return DEFAULT_EPHEMERAL_LOW


def span_is_free(first: int, span: int) -> bool:
    """True if every port of first .. first+span-1 can be bound for listening right now."""
    for port in range(first, first + span):
        with socket.socket() as sock:
            try:
                sock.bind(("", port))
            except OSError:
                return False
    return True


def pick_port(span: int, low: int, rng: random.Random, lowest: int = LOWEST_PORT) -> int:
    """A first port of `span` free ports in lowest .. low-1, tried in random order."""
    candidates = list(range(lowest, low - span + 1))
    rng.shuffle(candidates)
    for first in candidates:
        if span_is_free(first, span):
            return first
    raise OSError(f"no {span} consecutive free ports between {lowest} and {low - 1}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--span", type=int, default=1, help="consecutive ports needed (default 1)")
    args = parser.parse_args(argv)
    if args.span < 1:
        parser.error(f"--span must be at least 1, got {args.span}")
    try:
        print(pick_port(args.span, ephemeral_low(), random.SystemRandom()))
    except OSError as exc:
        print(f"jbport: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
