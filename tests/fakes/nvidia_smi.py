"""A fake `nvidia-smi -L` (a hardware boundary): the GPUs of the fake pynvml beside it (JPWR_FAKE_NVML_TRACE,
JPWR_FAKE_NVML_DEVICES), one line each as the real tool prints them, so that a test's nvidia-smi and NVML agree.

    python tests/fakes/nvidia_smi.py -L          (tests put a `nvidia-smi` wrapper of this first on PATH)
"""

from __future__ import annotations

import sys

import pynvml  # the fake: tests/fakes is first on PYTHONPATH


def main(argv: list[str]) -> int:
    if argv != ["-L"]:
        print(f"fake nvidia-smi: only -L is faked, not {' '.join(argv) or 'no option'}", file=sys.stderr)
        return 2
    pynvml.nvmlInit()
    for index in range(pynvml.nvmlDeviceGetCount()):
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        print(f"GPU {index}: {pynvml.nvmlDeviceGetName(handle)} (UUID: {pynvml.nvmlDeviceGetUUID(handle)})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
