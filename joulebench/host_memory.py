"""Host memory before work: the memory the kernel says is available now, read once, for validate's CPU check.

Why: a CPU run that validate called fitting was killed by the kernel's out-of-memory killer after 95 s, with no
word from the driver: a process killed by SIGKILL cannot say why it ended. On the CPU the drivers' memory estimates
are host memory, so `validate --device cpu` compares them with MemAvailable before any work. The parent of a killed
rank (`jpwr --`, the JUBE job) names the signal; a driver started bare cannot (docs/llm_training.md, docs/jube.md).
"""

from __future__ import annotations

import os
from pathlib import Path

GIB = 1024**3
MEMINFO = Path("/proc/meminfo")
MEMINFO_ENV = "JOULEBENCH_MEMINFO"  # another file in meminfo's format (tests: a fake one, at the OS boundary)
HOST = "this host (MemAvailable)"  # the holder a memory refusal names


def available_gib() -> float | None:
    """MemAvailable in GiB; None where it cannot be read (not Linux, a kernel before 3.14, an unreadable file):
    then validate checks nothing rather than refusing on a guess."""
    path = Path(os.environ.get(MEMINFO_ENV) or MEMINFO)
    try:
        text = path.read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        name, _, value = line.partition(":")
        fields = value.split()
        if name == "MemAvailable" and len(fields) == 2 and fields[0].isdigit() and fields[1] == "kB":
            return int(fields[0]) * 1024 / GIB
    return None
