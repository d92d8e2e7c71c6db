"""Pieces the GPU benchmark scripts share: which GPUs a run may use, the printed table, argv splitting."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from jpwr.output import fmt


def first_gpus_env(processes: int, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """A copy of `base` (default os.environ) with CUDA_VISIBLE_DEVICES limited to `processes` devices.

    jpwr meters every device the job may use; without a restriction a 1-GPU run on a 2-GPU machine
    counts the idle second GPU in its energy (seen on nvidia-h200-x2, 2026-11-22: +80 W).

    A restriction the caller already set is kept, so sites and schedulers stay in control.
    """
    env = dict(os.environ if base is None else base)
    env.setdefault("CUDA_VISIBLE_DEVICES", ",".join(str(i) for i in range(processes)))
    env.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")  # CUDA's index order = NVML's, so jpwr meters the same GPUs
    return env


def markdown_table(rows: Sequence[Mapping[str, object]], header: Sequence[str], digits: int = 6) -> str:
    """Rows as a Markdown table; numbers through jpwr.output.fmt, so missing values print as n/a."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        cells = [v if isinstance(v, str) else fmt(v, digits) for v in (row.get(label) for label in header)]  # type: ignore[arg-type]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def split_at_double_dash(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """(the script's own options, the workload driver's options): argv split at its first `--`."""
    argv = list(argv)
    split = argv.index("--") if "--" in argv else len(argv)
    return argv[:split], argv[split + 1:]
