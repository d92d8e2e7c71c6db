#!/usr/bin/env python3
"""Where training time goes on one GPU: torch.profiler over a few iterations, kernels grouped.

    PYTHONPATH=. python benchmarks/kernel_profile.py --workload llm --out prof.txt -- --model 800M [train options]
    PYTHONPATH=. python benchmarks/kernel_profile.py --workload resnet50 --out prof_resnet.txt -- \\
        --compile --global-batch-size 256 --precision bf16 [python -m resnet50 train options]

Options after `--` are the workload's own: `python -m llm_training train` builds the GPT Trainer,
`python -m resnet50 train` the torchvision ResNet-50 torch backend (--framework pytorch is implied;
the profiler only sees torch). Both get --device cuda. The script runs --warmup steps, then
profiles --steps steps and writes: the device time per category, the top kernels by total device
time, and the idle share of the profiled span. One process, no jpwr sampler: this explains a
throughput number, it does not replace the metered runs of llm_h100.py / resnet50_h100.py.

Categories (first match wins, on lower-cased kernel names): attention comes first so cuDNN's
SDPA kernels ("..._sdpa_..._flash_fprop_...") are not taken for convolutions; convolution comes
before gemm because cuDNN's convolutions are implicit GEMMs named "sm90_xmma_fprop_implicit_gemm..."
or "cutlass_..._s16816fprop_..."; it skips Triton kernels, whose names list the fused ATen ops
("triton_poi_fused_convolution_..." is an epilogue, not a convolution). Inductor fusions that
contain a batch norm ("triton_red_fused__native_batch_norm_legit_functional_relu_0") get their own
row "triton (batch-norm fusions)": a fused kernel also does the ReLU/add, so counting it as
batchnorm would overstate BN, yet lumping it with the other fusions would hide that compiled
ResNet time is mostly BN. "batchnorm" itself is the eager kernels (ATen batch_norm_*, cuDNN
bn_fw/bn_bw/batchnorm_*); "welford" is not a pattern since layer-norm kernels use Welford too.
GPT's kernels land where they did before the ResNet rows existed.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.common import split_at_double_dash  # noqa: E402 (needs REPO on sys.path)
from jpwr.errors import ValidationError, exit_code_of  # noqa: E402 (needs REPO on sys.path)
from resnet50.config import TrainConfig, check_devices, check_static  # noqa: E402 (imports no torch)

# First match wins; patterns are matched against lower-cased kernel names (see the docstring for the order).
CATEGORIES = [
    ("attention", r"flash|fmha|sdpa|cudnn.*attn|attention|efficient_attention"),
    ("convolution", r"^(?!triton).*(conv(?!ert)|implicit_gemm|fprop|dgrad|wgrad|winograd)"),
    ("gemm", r"gemm|sm90_xmma|cutlass|nvjet|cublas|matmul"),
    ("optimizer", r"adam|multi_tensor|foreach|l2norm"),
    ("communication", r"nccl"),
    ("memcpy/memset", r"memcpy|memset"),
    ("triton (batch-norm fusions)", r"^triton.*batch_norm"),
    ("triton (compiled fusions)", r"triton"),
    ("batchnorm", r"batch_norm|batchnorm|bn_fw|bn_bw"),
    ("elementwise/other", r".*"),
]


def category(name: str) -> str:
    lowered = name.lower()
    return next(label for label, pattern in CATEGORIES if re.search(pattern, lowered))


@dataclasses.dataclass
class Workload:
    """One training step to profile, what to release afterwards, and the resolved settings for the header."""

    step: Callable[[], object]
    close: Callable[[], None]
    settings: str


def require_cuda(device: str) -> None:
    """The report is CUDA kernel time: a CPU run would profile nothing."""
    if device != "cuda":
        raise ValidationError(f"--device {device}: the kernel profile needs CUDA kernels", "leave --device out")


def build_llm(argv: Sequence[str]) -> Workload:
    """The Trainer of `python -m llm_training train --device cuda ARGV`."""
    from joulebench.launch import LaunchEnv
    from joulebench.torch_device import resolve_device
    from llm_training import distributed
    from llm_training.cli import build_parser, resolve_checked
    from llm_training.train import Trainer

    train_args = build_parser().parse_args(["train", "--device", "cuda", *argv])
    launch = LaunchEnv.from_env()
    cfg = resolve_checked(train_args, launch.world_size)
    require_cuda(cfg.device)
    device = resolve_device(cfg.device)
    distributed.init_distributed(launch, device, cfg)
    trainer = Trainer(cfg, device)
    return Workload(trainer.step, distributed.shutdown_distributed,
                    f"{cfg.micro_batch_size=} {cfg.global_batch_size=}")


def resnet50_config(argv: Sequence[str]) -> TrainConfig:
    """`python -m resnet50 train --framework pytorch --device cuda ARGV` resolved and checked (no device)."""
    from resnet50.cli import build_parser

    config = TrainConfig.from_args(build_parser().parse_args(["train", "--framework", "pytorch", "--device", "cuda",
                                                              *argv]))
    if config.framework != "pytorch":
        raise ValidationError(f"--framework {config.framework}: the kernel profile uses torch.profiler",
                              "pass --framework pytorch or leave --framework out")
    require_cuda(config.device)
    check_static(config)
    return config


def build_resnet50(argv: Sequence[str]) -> Workload:
    """The torch backend of `python -m resnet50 train`, created the way resnet50.driver.train does."""
    from joulebench.launch import LaunchEnv
    from resnet50.backend import load_backend

    config = resnet50_config(argv)
    launch = LaunchEnv.from_env()
    module = load_backend(config.framework)
    devices, device_kind = module.discover(config, launch)
    check_devices(config, devices, device_kind)  # --device cuda without a GPU is a ValidationError here
    backend = module.create(config, launch)
    return Workload(backend.train_step, backend.close,
                    f"global_batch_size={config.global_batch_size} per_device_batch="
                    f"{config.per_device_batch(devices)} precision={config.precision} compile={config.compile} "
                    f"compile_mode={config.compile_mode} channels_last={config.channels_last} data={config.data}")


WORKLOADS: dict[str, Callable[[Sequence[str]], Workload]] = {"llm": build_llm, "resnet50": build_resnet50}


def parse_args(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    """This script's options, and the workload's options (everything after the first `--`)."""
    own, workload_argv = split_at_double_dash(argv)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", choices=sorted(WORKLOADS), required=True)
    parser.add_argument("--out", required=True, help="text report path")
    parser.add_argument("--warmup", type=int, default=4, help="unprofiled steps first (default 4)")
    parser.add_argument("--steps", type=int, default=2, help="profiled steps (default 2)")
    parser.add_argument("--top", type=int, default=15, help="kernels listed by device time (default 15)")
    args = parser.parse_args(own)
    if args.steps < 1 or args.warmup < 0:
        raise ValidationError(f"--steps {args.steps} / --warmup {args.warmup}",
                              "pass --steps 1 or more and --warmup 0 or more")
    return args, workload_argv


def report(kernels: dict[str, tuple[float, float]], span_us: float, header: str, top: int) -> str:
    """The text report from {kernel name: (device us per step, calls per step)}."""
    total = sum(t for t, _ in kernels.values())
    by_category: dict[str, float] = {}
    for name, (t, _) in kernels.items():
        label = category(name)
        by_category[label] = by_category.get(label, 0.0) + t
    lines = [header,
             f"per iteration: wall {span_us / 1e3:.1f} ms (profiler on), kernel time {total / 1e3:.1f} ms, "
             f"device idle {max(0.0, 1 - total / span_us):.1%}", "", "category | ms/iter | share"]
    for label, t in sorted(by_category.items(), key=lambda kv: -kv[1]):
        lines.append(f"{label} | {t / 1e3:.1f} | {t / total:.1%}")
    lines += ["", f"top {top} kernels | ms/iter | calls/iter | share | category"]
    for name, (t, calls) in sorted(kernels.items(), key=lambda kv: -kv[1][0])[:top]:
        lines.append(f"{name[:110]} | {t / 1e3:.1f} | {calls:.0f} | {t / total:.1%} | {category(name)}")
    return "\n".join(lines) + "\n"


def profile_workload(args: argparse.Namespace, workload_argv: list[str]) -> int:
    import torch
    from torch.profiler import ProfilerActivity, profile

    workload = WORKLOADS[args.workload](workload_argv)
    try:
        for _ in range(args.warmup):
            workload.step()
        torch.cuda.synchronize()
        start = time.perf_counter()
        with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
            for _ in range(args.steps):
                workload.step()
            torch.cuda.synchronize()
        span_us = (time.perf_counter() - start) * 1e6 / args.steps
    finally:
        workload.close()
    kernels: dict[str, tuple[float, float]] = {}
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            t, calls = kernels.get(event.name, (0.0, 0.0))
            kernels[event.name] = (t + event.device_time / args.steps, calls + 1 / args.steps)
    if not kernels:
        print("kernel_profile: error: the profiler recorded no CUDA kernels", file=sys.stderr)
        return 1
    header = f"workload: {args.workload}; config: {' '.join(workload_argv)}; {workload.settings}"
    text = report(kernels, span_us, header, args.top)
    Path(args.out).write_text(text)
    print(text, flush=True)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    def command() -> int:
        args, workload_argv = parse_args(sys.argv[1:] if argv is None else argv)
        return profile_workload(args, workload_argv)

    return exit_code_of("kernel_profile", command)


if __name__ == "__main__":
    sys.exit(main())
