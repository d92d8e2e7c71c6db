"""jube/jbport.py: the ranks' rendezvous port is free and outside the kernel's ephemeral range."""

from __future__ import annotations

import random
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.driver_helpers import jbport
from tests.jube.conftest import JUBE_DIR


def test_the_script_prints_a_free_span_below_the_ephemeral_range() -> None:
    done = subprocess.run([sys.executable, str(JUBE_DIR / "jbport.py"), "--span", "4"],
                          capture_output=True, text=True, check=True)
    first = int(done.stdout)
    assert first >= jbport.LOWEST_PORT and first + 3 < jbport.ephemeral_low()
    assert jbport.span_is_free(first, 4)


def test_a_port_with_a_listener_is_never_picked() -> None:
    first = jbport.pick_port(3, jbport.ephemeral_low(), random.Random(0))
    with socket.socket() as busy:
        busy.bind(("", first + 1))
        busy.listen()
        for seed in range(10):
            assert jbport.pick_port(1, low=first + 3, rng=random.Random(seed), lowest=first) in (first, first + 2)
        with pytest.raises(OSError, match=f"no 2 consecutive free ports between {first} and {first + 2}"):
            jbport.pick_port(2, low=first + 3, rng=random.Random(0), lowest=first)


@pytest.mark.parametrize(("text", "low"), [("20000\t60999\n", 20000), ("", 32768), ("garbage", 32768)])
def test_the_ephemeral_low_end_is_read_or_defaults(tmp_path: Path, text: str, low: int) -> None:
    path = tmp_path / "ip_local_port_range"
    path.write_text(text)
    assert jbport.ephemeral_low(path) == low
    assert jbport.ephemeral_low(tmp_path / "absent") == 32768


def test_a_span_below_one_is_a_usage_error() -> None:
    done = subprocess.run([sys.executable, str(JUBE_DIR / "jbport.py"), "--span", "0"], capture_output=True, text=True)
    assert done.returncode == 2 and "--span must be at least 1" in done.stderr
