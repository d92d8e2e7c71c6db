"""Running the drivers as users do (python -m ..., real subprocesses) and reading what they wrote."""

from __future__ import annotations

import importlib.util
import json
import random
import subprocess
from collections.abc import Sequence
from pathlib import Path

_JBPORT = Path(__file__).resolve().parents[1] / "jube" / "jbport.py"
_spec = importlib.util.spec_from_file_location("jbport", _JBPORT)
jbport = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(jbport)


def free_port(count: int = 1) -> int:
    """A port p such that p .. p+count-1 are free now (TF workers listen on consecutive ports): the job script's
    own pick (jube/jbport.py), below the ephemeral range, so no outgoing connection takes it before the listen."""
    return jbport.pick_port(count, jbport.ephemeral_low(), random.SystemRandom())


def run_cmd(cmd: Sequence[str], env: dict[str, str], cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run(list(cmd), env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)


def read_record(out_dir: Path) -> dict:
    return json.loads((out_dir / "run_record.json").read_text())


def summaries(stdout: str) -> list[dict[str, str]]:
    """key=value pairs of every JOULEBENCH_RESULT line; the last stdout line must be one."""
    lines = stdout.strip().splitlines()
    assert lines[-1].startswith("JOULEBENCH_RESULT "), f"last stdout line is not a summary: {lines[-1]!r}"
    return [dict(item.split("=", 1) for item in line.split()[1:])
            for line in lines if line.startswith("JOULEBENCH_RESULT ")]


def parse_summary(stdout: str) -> dict[str, str]:
    """The JOULEBENCH_RESULT line that ends stdout, as key=value pairs."""
    return summaries(stdout)[-1]


def with_options(base: Sequence[str], *pairs: str) -> list[str]:
    """`base` with each option of `pairs` (option, value, option, value ...) set to that value instead of the base's:
    a command line gives an option once (one given twice with different values is refused, issue 61)."""
    values = dict(zip(pairs[::2], pairs[1::2], strict=True))
    out: list[str] = []
    skip = False
    for word in base:
        if skip:
            skip = False
            continue
        if word in values:
            skip = True
            continue
        out.append(word)
    return [*out, *(part for option, value in values.items() for part in (option, value))]
