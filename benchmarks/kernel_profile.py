#!/usr/bin/env python3
"""Where training (and inference) time goes on one GPU: torch.profiler over a few iterations, kernels grouped.

    PYTHONPATH=. python benchmarks/kernel_profile.py --workload llm --out prof.txt -- --model 800M [train options]
    PYTHONPATH=. python benchmarks/kernel_profile.py --workload resnet50 --out prof_resnet.txt -- \\
        --compile --global-batch-size 256 --precision bf16 [python -m resnet50 train options]
    PYTHONPATH=. python benchmarks/kernel_profile.py --workload inference --out prof_llama8b_512.txt --warmup 1 \
        --steps 1 -- --preset llama-8b --task chat --batch-sizes 512 [python -m llm_inference run options]

Options after `--` are the workload's own: `python -m llm_training train` builds the GPT Trainer,
`python -m resnet50 train` the torchvision ResNet-50 torch backend (--framework pytorch is implied;
the profiler only sees torch), `python -m llm_inference run` one generate call of the static engine per step
(prefill and decode of one batch). All get --device cuda. The script runs --warmup steps, then
profiles --steps steps and writes: the device time per category, the top kernels by total device
time, and the idle share of the profiled span. One process, no jpwr sampler: this explains a
throughput number, it does not replace the metered runs of llm_h100.py / resnet50_h100.py.

With --intervals-out FILE the script also writes every profiled kernel's interval on the node's monotonic
clock, for `joulebench attribute RUN_DIR --profile FILE` (the kernel-class fit). Run it then under a sampler
that reads the counter often, e.g. `python -m jpwr --interval 20 --counter-interval 20 --out DIR -- python
benchmarks/kernel_profile.py ... --intervals-out DIR/kernels.json`: the profiled steps are marked as the
window --window (default `profiled`) and DIR holds its trace. The profiler's clock is mapped onto the
monotonic clock through two anchors taken right after a device sync, before and after the steps.

Kernel categories: joulebench.analysis.kernel_classes (shared with `joulebench attribute --profile`).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.common import split_at_double_dash, unless_given  # noqa: E402 (needs REPO on sys.path)
from joulebench.analysis.kernel_classes import category  # noqa: E402 (needs REPO on sys.path)
from joulebench.boundary import exit_code_of  # noqa: E402 (needs REPO on sys.path)
from joulebench.launch import LaunchEnv  # noqa: E402 (needs REPO on sys.path)
from jpwr import ADDR_ENV, ValidationError, WindowMeter  # noqa: E402 (needs REPO on sys.path)
from jpwr.output import write_json_atomic  # noqa: E402 (needs REPO on sys.path)
from jpwr.phases import PhaseRecorder  # noqa: E402 (needs REPO on sys.path)
from resnet50.config import TrainConfig, check_devices, check_static  # noqa: E402 (imports no torch)


@dataclasses.dataclass
class Workload:
    """One training step to profile, what to release afterwards, and the resolved settings for the header."""

    step: Callable[[], object]
    close: Callable[[], None]
    settings: str
    mark_phases: Callable[[PhaseRecorder], None]  # the driver's own phase marking (jpwr_overhead.py toggles it)


def require_cuda(device: str) -> None:
    """The report is CUDA kernel time: a CPU run would profile nothing."""
    if device != "cuda":
        raise ValidationError(f"--device {device}: the kernel profile needs CUDA kernels", "leave --device out")


def build_llm(argv: Sequence[str]) -> Workload:
    """The Trainer of `python -m llm_training train --device cuda ARGV`."""
    from joulebench.torch_device import resolve_device
    from llm_training import distributed
    from llm_training.cli import build_parser, resolve_checked
    from llm_training.train import Trainer

    train_args = build_parser().parse_args(unless_given(["train", "--device", "cuda"], argv))
    launch = LaunchEnv.from_env()
    cfg = resolve_checked(train_args, launch.world_size)
    require_cuda(cfg.device)
    device = resolve_device(cfg.device)
    distributed.init_distributed(launch, device, cfg)
    trainer = Trainer(cfg, device)
    return Workload(trainer.step, distributed.shutdown_distributed,
                    f"{cfg.micro_batch_size=} {cfg.global_batch_size=}", trainer.mark_phases)


def resnet50_config(argv: Sequence[str]) -> TrainConfig:
    """`python -m resnet50 train --framework pytorch --device cuda ARGV` resolved and checked (no device)."""
    from resnet50.cli import build_parser

    config = TrainConfig.from_args(build_parser().parse_args(
        unless_given(["train", "--framework", "pytorch", "--device", "cuda"], argv)))
    if config.framework != "pytorch":
        raise ValidationError(f"--framework {config.framework}: the kernel profile uses torch.profiler",
                              "pass --framework pytorch or leave --framework out")
    require_cuda(config.device)
    check_static(config)
    return config


def build_resnet50(argv: Sequence[str]) -> Workload:
    """The torch backend of `python -m resnet50 train`, created the way resnet50.driver.train does."""
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
                    f"compile_mode={config.compile_mode} channels_last={config.channels_last} data={config.data}",
                    backend.mark_phases)


def build_inference(argv: Sequence[str]) -> Workload:
    """One batch of `python -m llm_inference run --device cuda ARGV` per step, the static engine made as the driver
    makes it (llm_inference.runner.make_engine): its prefill and every decode step of one generate call (issue 59's
    question is where a decode step's time goes at the batch that costs least per token). One task, one batch size,
    and no objective that needs a sampler (none runs here)."""
    import torch

    from llm_inference.cli import build_parser
    from llm_inference.config import resolve
    from llm_inference.engine import make_inputs
    from llm_inference.runner import make_engine
    from llm_inference.tasks import TASKS, draw_batches
    from llm_inference.validation import check_config, resolve_precision

    cfg = resolve(build_parser().parse_args(unless_given(["run", "--device", "cuda"], argv)))
    require_cuda(cfg.device)
    if cfg.engine != "static" or cfg.tensor_parallel != 1:
        raise ValidationError(f"--engine {cfg.engine} --tensor-parallel {cfg.tensor_parallel}: the profile runs the "
                              "static engine on one GPU", "leave --engine and --tensor-parallel out")
    if len(cfg.tasks) > 1 or len(cfg.batch_sizes) > 1:
        raise ValidationError(f"tasks {', '.join(cfg.tasks)} and batch sizes {', '.join(map(str, cfg.batch_sizes))}: "
                              "a profile is of one batch shape", "pass one --task and one --batch-sizes value")
    if cfg.objective not in (None, "speed"):
        raise ValidationError(f"--objective {cfg.objective} without a sampler (the profile meters nothing)",
                              "leave --objective out, or pin the variant with --decode-tuning")
    shape = check_config(cfg)
    if not torch.cuda.is_available():
        raise ValidationError("--device cuda: no CUDA GPU is visible here", "run it on a GPU machine")
    device = torch.device("cuda")
    precision = resolve_precision(cfg.precision, "cuda")
    batch = draw_batches(TASKS[cfg.tasks[0]], cfg.batch_sizes[0], 1, cfg.seed, cfg.output_length)[0]
    engine = make_engine(cfg, shape, precision, device, None)
    engine.prepare([batch])
    inputs = make_inputs(batch, shape.vocab_size, cfg.seed, device)

    def step() -> None:
        engine.generate(inputs, batch.output_length)
        engine.sync()

    return Workload(step, lambda: None, f"preset={shape.name} task={cfg.tasks[0]} batch={batch.size} "
                    f"output_length={batch.output_length} {precision} decode_tuning={cfg.decode_tuning}",
                    lambda phases: None)


WORKLOADS: dict[str, Callable[[Sequence[str]], Workload]] = {"llm": build_llm, "resnet50": build_resnet50,
                                                             "inference": build_inference}


def parse_args(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    """This script's options, and the workload's options (everything after the first `--`)."""
    own, workload_argv = split_at_double_dash(argv)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", choices=sorted(WORKLOADS), required=True)
    parser.add_argument("--out", required=True, help="text report path")
    parser.add_argument("--warmup", type=int, default=4, help="unprofiled steps first (default 4)")
    parser.add_argument("--steps", type=int, default=2, help="profiled steps (default 2)")
    parser.add_argument("--top", type=int, default=15, help="kernels listed by device time (default 15)")
    parser.add_argument("--intervals-out", help="also write each kernel's interval (JSON) for joulebench attribute "
                                                "--profile; needs a jpwr sampler (run under `jpwr -- ...`)")
    parser.add_argument("--window", default="profiled", help="window marked around the profiled steps")
    args = parser.parse_args(own)
    if args.steps < 1 or args.warmup < 0:
        raise ValidationError(f"--steps {args.steps} / --warmup {args.warmup}",
                              "pass --steps 1 or more and --warmup 0 or more")
    if args.intervals_out and not os.environ.get(ADDR_ENV):
        raise ValidationError("--intervals-out without a jpwr sampler (the kernels could not be joined with energy)",
                              "run under `python -m jpwr --interval 20 --counter-interval 20 --out DIR -- ...`")
    return args, workload_argv


ANCHOR = "joulebench_clock_anchor"
KERNEL_FILE_KIND = "joulebench.kernel_intervals"


def clock_anchor(torch: Any) -> int:
    """Monotonic time of a profiler event recorded right after a device sync (`torch` passed in: no import here)."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    with torch.profiler.record_function(ANCHOR):
        return time.monotonic_ns()


def kernel_intervals(events: Sequence[Any], anchors_ns: Sequence[int], device_type: Any) -> dict[str, Any]:
    """Kernels of `device_type` as (name index, start, end) on the monotonic clock: the profiler's times (us from
    its own start) are mapped linearly through the two anchor events, whose monotonic times are `anchors_ns`."""
    marks = sorted(e.time_range.start for e in events if e.name == ANCHOR)
    if len(marks) != 2 or len(anchors_ns) != 2:
        raise RuntimeError(f"expected 2 clock anchors in the profile, found {len(marks)}")
    (us_a, us_b), (ns_a, ns_b) = marks, anchors_ns
    scale = (ns_b - ns_a) / (us_b - us_a) if us_b > us_a else 1000.0
    names: dict[str, int] = {}
    index, starts, ends = [], [], []
    for e in events:
        if e.device_type == device_type and e.name != ANCHOR:
            index.append(names.setdefault(e.name, len(names)))
            starts.append(round(ns_a + (e.time_range.start - us_a) * scale))
            ends.append(round(ns_a + (e.time_range.end - us_a) * scale))
    return {"kind": KERNEL_FILE_KIND, "clock": "monotonic ns, mapped through two synced anchors",
            "names": list(names), "name_index": index, "t0_ns": starts, "t1_ns": ends}


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
    meter = WindowMeter.open(LaunchEnv.from_env(), sync=torch.cuda.synchronize) if args.intervals_out else None
    anchors: list[int] = []
    try:
        for _ in range(args.warmup):
            workload.step()
        torch.cuda.synchronize()
        start = time.perf_counter()
        with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
            anchors.append(clock_anchor(torch))
            if meter is not None:
                meter.begin(args.window, 0)
            for _ in range(args.steps):
                workload.step()
            if meter is not None:
                meter.end(args.window, args.steps, {"steps": float(args.steps)})
            anchors.append(clock_anchor(torch))
        span_us = (time.perf_counter() - start) * 1e6 / args.steps
    finally:
        workload.close()
        if meter is not None:
            meter.close()
    if args.intervals_out:
        data = {**kernel_intervals(prof.events(), anchors, torch.autograd.DeviceType.CUDA), "window": args.window,
                "steps": args.steps, "local_rank": LaunchEnv.from_env().local_rank, "workload": args.workload,
                "config": workload_argv}
        write_json_atomic(args.intervals_out, data)
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
