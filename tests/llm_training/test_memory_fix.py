"""The memory refusal's fix (llm_training.memory.fit_fix): the largest micro-batch size that fits, full recompute
where it makes the asked MBS fit, and why selective recompute is never offered. On 800M at MBS 32 an H100 refused
with "use --micro-batch-size 1" while MBS 16 fits and ran at 79,710 tokens/s (issue 58)."""

from __future__ import annotations

import dataclasses
import re

import pytest

from jpwr.errors import ExitCode
from llm_training import memory
from llm_training.cli import build_parser, main
from llm_training.config import TrainConfig, resolve

H100_GIB = 79.2  # what torch reported for the H100 of issue 58's refusal


def _config(*args: str) -> TrainConfig:
    return resolve(build_parser().parse_args(["train", "--model", "800M", *args]), 1)


def _gib(cfg: TrainConfig) -> float:
    return memory.estimate_memory(cfg).total_gib


def _named_mbs(pattern: str, fix: str) -> int:
    found = re.search(pattern, fix)
    assert found, fix
    return int(found.group(1))


def test_the_fix_names_the_largest_mbs_that_fits_and_full_recompute_at_the_asked_one() -> None:
    asked = _config("--micro-batch-size", "32")
    assert _gib(asked) > H100_GIB
    fix = memory.fit_fix(asked, H100_GIB)
    named = _named_mbs(r"--micro-batch-size (\d+) \(estimate", fix)
    fitting = [mbs for mbs in range(1, 32) if 64 % mbs == 0
               and _gib(dataclasses.replace(asked, micro_batch_size=mbs)) <= H100_GIB]
    assert named == max(fitting) > 1
    assert f"estimate {_gib(dataclasses.replace(asked, micro_batch_size=named)):.1f} GiB" in fix
    full = dataclasses.replace(asked, recompute="full")
    assert _gib(full) <= H100_GIB and f"--recompute full (estimate {_gib(full):.1f} GiB) to keep MBS 32" in fix
    assert "selective" not in fix  # never offered: it saves almost nothing with SDPA


def test_selective_recompute_is_estimated_as_none_and_the_refusal_says_why(capsys: pytest.CaptureFixture) -> None:
    none = _config("--micro-batch-size", "32")
    selective = _config("--micro-batch-size", "32", "--recompute", "selective")
    assert memory.estimate_memory(selective) == memory.estimate_memory(none)
    code = main(["validate", "--device", "cuda", "--model", "800M", "--micro-batch-size", "32", "--recompute",
                 "selective", "--device-memory-gib", str(H100_GIB)])
    err = capsys.readouterr().err
    assert code == ExitCode.USAGE and "refused by the memory estimate" in err
    assert memory.SELECTIVE_NOTE in err and "--recompute full" in err


def test_full_recompute_with_a_smaller_mbs_when_neither_alone_fits() -> None:
    """A device too small for any MBS without recompute (weights, gradients, optimizer and MBS 1's activations and
    logits) but large enough for MBS 1 with full recompute: the fix names both options together."""
    asked = _config("--micro-batch-size", "8")
    mbs1, mbs1_full = (dataclasses.replace(asked, micro_batch_size=1, recompute=r) for r in ("none", "full"))
    device = (_gib(mbs1) + _gib(mbs1_full)) / 2
    assert _gib(mbs1_full) < device < _gib(mbs1)
    fix = memory.fit_fix(asked, device)
    assert fix.startswith("use --micro-batch-size ") and "--recompute full (estimate" in fix
    named = _named_mbs(r"--micro-batch-size (\d+) --recompute full", fix)
    assert _gib(dataclasses.replace(asked, micro_batch_size=named, recompute="full")) <= device
