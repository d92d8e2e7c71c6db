"""Not API: the selftest's known GPU load (bf16 matmuls), shared with `jpwr qualify` and the benchmarks scripts.

`jpwr selftest` and `jpwr qualify` run it against the sensor; scripts under benchmarks/ that check the meter on a
GPU (overhead, device counting, disturbance) run the same load so their numbers compare. It is a test load, not
part of the meter's API (docs/architecture.md, "The meter's API"): it may change with the selftest.
"""

from __future__ import annotations

import time
from typing import Any

MATMUL_N = 8192  # one bf16 product is 2·8192³ FLOP: ~1.6 ms on a GH100, long enough to keep the GPU busy


def matmul_operands(torch: Any, n: int = MATMUL_N) -> tuple[Any, Any]:
    """The two bf16 n² matrices on the current GPU that a matmul load multiplies (MATMUL_N: the steady load)."""
    return tuple(torch.randn(n, n, device="cuda", dtype=torch.bfloat16) for _ in range(2))


def matmuls_until(torch: Any, a: Any, b: Any, deadline: float) -> int:
    """Back-to-back products until the monotonic deadline, synced every 4 (a steady load); returns how many ran."""
    done = 0
    while time.monotonic() < deadline:
        for _ in range(4):
            a @ b
        torch.cuda.synchronize()
        done += 4
    return done
