#!/usr/bin/env python3
"""Where GPT training time goes on one GPU: torch.profiler over a few iterations, kernels grouped.

    PYTHONPATH=. python benchmarks/llm_profile.py --out prof.txt -- --model 800M [train options]

Builds the same Trainer as `python -m llm_training train` (options after `--` are train's), runs
--warmup steps, then profiles --steps steps and writes: the top kernels by total device time and
the device time per category (GEMM, attention, optimizer, communication, elementwise/other), plus
the idle share of the profiled span. One process, no jpwr sampler: this explains a throughput
number, it does not replace the metered runs of llm_h100.py.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

# First match wins; patterns are matched against lower-cased kernel names.
CATEGORIES = [
    ("attention", r"flash|fmha|sdpa|cudnn.*attn|attention|efficient_attention"),
    ("gemm", r"gemm|sm90_xmma|cutlass|nvjet|cublas|matmul"),
    ("optimizer", r"adam|multi_tensor|foreach|l2norm"),
    ("communication", r"nccl"),
    ("memcpy/memset", r"memcpy|memset"),
    ("triton (compiled fusions)", r"triton"),
    ("elementwise/other", r".*"),
]


def category(name: str) -> str:
    lowered = name.lower()
    return next(label for label, pattern in CATEGORIES if re.search(pattern, lowered))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="text report path")
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--top", type=int, default=15)
    args, train_argv = parser.parse_known_args()
    train_argv = [a for a in train_argv if a != "--"]

    import torch
    from torch.profiler import ProfilerActivity, profile

    from jpwr.launch import LaunchEnv
    from jpwr.torch_device import resolve_device
    from llm_training import distributed
    from llm_training.cli import build_parser, resolve_checked
    from llm_training.train import Trainer

    train_args = build_parser().parse_args(["train", "--device", "cuda", *train_argv])
    launch = LaunchEnv.from_env()
    cfg = resolve_checked(train_args, launch.world_size)
    device = resolve_device(cfg.device)
    distributed.init_distributed(launch, device, cfg)
    trainer = Trainer(cfg, device)
    for _ in range(args.warmup):
        trainer.step()
    torch.cuda.synchronize()
    start = time.perf_counter()
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        for _ in range(args.steps):
            trainer.step()
        torch.cuda.synchronize()
    span_us = (time.perf_counter() - start) * 1e6 / args.steps

    kernels: dict[str, list[float]] = {}
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            entry = kernels.setdefault(event.name, [0.0, 0])
            entry[0] += event.device_time / args.steps
            entry[1] += 1
    total = sum(t for t, _ in kernels.values())
    by_category: dict[str, float] = {}
    for name, (t, _) in kernels.items():
        by_category[category(name)] = by_category.get(category(name), 0.0) + t
    lines = [f"config: {' '.join(train_argv)}; {cfg.micro_batch_size=} {cfg.global_batch_size=}",
             f"per iteration: wall {span_us / 1e3:.1f} ms (profiler on), kernel time {total / 1e3:.1f} ms, "
             f"device idle {max(0.0, 1 - total / span_us):.1%}", "", "category | ms/iter | share"]
    for label, t in sorted(by_category.items(), key=lambda kv: -kv[1]):
        lines.append(f"{label} | {t / 1e3:.1f} | {t / total:.1%}")
    lines += ["", f"top {args.top} kernels | ms/iter | calls/iter | share | category"]
    for name, (t, calls) in sorted(kernels.items(), key=lambda kv: -kv[1][0])[: args.top]:
        lines.append(f"{name[:110]} | {t / 1e3:.1f} | {calls / args.steps:.0f} | {t / total:.1%} | {category(name)}")
    text = "\n".join(lines) + "\n"
    Path(args.out).write_text(text)
    print(text, flush=True)
    distributed.shutdown_distributed()
    return 0


if __name__ == "__main__":
    sys.exit(main())
