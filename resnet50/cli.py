"""Command line: `python -m resnet50 {train,validate,make-data}` (names fixed by the JUBE workflow)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from joulebench.arguments import (
    COUNT,
    COUNT_OR_ZERO,
    LEARNING_RATE,
    LOG_INTERVAL,
    MINUTES,
    NODES,
    SECONDS_OR_ZERO,
    SEED,
    SIZE,
    Number,
    method_names,
    state_ranges,
)
from joulebench.boundary import exit_code_of
from joulebench.compile_cache import add_compile_cache_argument
from joulebench.exports.targets import add_log_to
from joulebench.launch import LaunchEnv
from joulebench.progress import Heartbeat
from joulebench.sizing import add_window_arguments
from jpwr import ValidationError
from jpwr.errors import ArgumentParser, take_debug_flag
from resnet50.config import (
    BN_KERNELS,
    CDT_ENV,
    CPU_ITERATIONS,
    DATA_FORMATS,
    DEVICES,
    FRAMEWORKS,
    MIN_IMAGE_SIZE,
    PRECISIONS,
    TrainConfig,
    check_devices,
    check_static,
)
from resnet50.flops import resnet50_flops

PIXELS = Number(int, 1, 2**14)  # square image sides; training refuses below MIN_IMAGE_SIZE (validate says so)


def _add_run_options(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--framework", choices=FRAMEWORKS, required=True)
    add("--global-batch-size", type=SIZE, default=256, help="images per step over all devices (default 256)")
    add("--precision", choices=PRECISIONS, default="bf16", help="mixed precision compute type (default bf16)")
    add("--image-size", type=PIXELS, default=224, help=f"square input images (default 224; at least {MIN_IMAGE_SIZE})")
    add("--iterations", type=COUNT, default=None,
        help="measured iterations, warm-up not included, as tf_cnn_benchmarks' --num_batches; fixes the steady "
             f"window (default: sized by --steady-seconds on accelerators, {CPU_ITERATIONS} on the CPU)")
    add("--warmup-iterations", type=COUNT_OR_ZERO, default=10,
        help="iterations before the measured window; they time the step (default 10; 0 = none)")
    add_window_arguments(parser, cpu_default=f"on the CPU {CPU_ITERATIONS} iterations")
    add("--exit-duration-mins", type=MINUTES, default=None, help="end the steady window after this many minutes")
    add("--data", default="synthetic", help="'synthetic' or a data directory (default synthetic)")
    add("--data-format", choices=DATA_FORMATS, default=None,
        help="tfrecord (tensorflow default) or jpeg ImageFolder tree (pytorch default)")
    add("--data-workers", type=Number(int, 0, 1024), default=4,
        help="torch DataLoader worker processes per rank (default 4; 0 = load in the training process)")
    add("--channels-last", action=argparse.BooleanOptionalAction, default=True, help="NHWC layout (default on)")
    add("--compile", action=argparse.BooleanOptionalAction, default=None,
        help="torch.compile the model (pytorch; default: on GPUs, off on the CPU; --no-compile: eager)")
    add("--compile-mode", default=None,
        help="torch.compile mode, e.g. default, max-autotune (default: reduce-overhead = CUDA graphs on GPUs, "
             "default on the CPU)")
    add("--coordinate-descent-tuning", action=argparse.BooleanOptionalAction, default=None,
        help="inductor's per-kernel launch-config tuning of compiled kernels (default: on when compiling on GPUs; "
             f"on the CPU as {CDT_ENV} says)")
    add_compile_cache_argument(parser)
    add("--bn-kernels", choices=BN_KERNELS, default="inductor",
        help="pytorch training-mode batch norm: inductor (torch.compile's fusions; ATen's eager), triton (our "
             "kernels with residual add and ReLU fused, CUDA only; docs/resnet50.md) or triton-conv (triton, and the "
             "1x1 convolutions as our GEMM that also measures the batch statistics) (default inductor)")
    add("--xla", action="store_true", help="XLA-compile the training step (tensorflow)")
    add("--device", choices=DEVICES, default="auto")
    add("--out-dir", default=None, help="run directory (default runs/resnet50/<run-id>)")
    add("--run-id", default=None)
    add("--energy-methods", type=method_names, default=None,
        help="in-process jpwr methods for single-process runs, e.g. pynvml")
    add("--log-interval", type=LOG_INTERVAL, default=10,
        help="progress line every N iterations (default 10); a stop (SIGTERM, --exit-duration-mins) waits for the next")
    add_log_to(parser)
    add("--caraml-output", action="store_true", help="also print tf_cnn_benchmarks' `total images/sec:` line")
    add("--seed", type=SEED, default=42)
    add("--lr", type=LEARNING_RATE, default=0.1, help="SGD learning rate (default 0.1)")
    add("--replay-phases", type=SECONDS_OR_ZERO, default=0.0, metavar="SECONDS",
        help="pytorch: after training, run forward, forward+backward, the optimizer step and the whole step each "
             "alone for SECONDS (>= 30 counter updates, 3 s on an H100) in windows replay/<phase>, the replay "
             "estimator of `joulebench attribute` (needs a jpwr sampler; default 0 = off)")


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog="python -m resnet50", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    _add_run_options(sub.add_parser("train", help="train ResNet-50 and write a run record"))
    validate = sub.add_parser("validate", help="check a configuration without touching a device")
    _add_run_options(validate)
    validate.add_argument("--world-size", type=NODES, default=None, help="data-parallel devices of the planned run")
    validate.add_argument("--nodes", type=NODES, default=None)
    validate.add_argument("--devices-per-node", type=NODES, default=None)
    make = sub.add_parser("make-data", help="write a tiny data set of noise images for tests")
    make.add_argument("out", type=Path)
    make.add_argument("--format", choices=DATA_FORMATS, required=True)
    make.add_argument("--images", type=Number(int, 1, 10**6), default=32, help="training images (default 32)")
    make.add_argument("--classes", type=Number(int, 1, 1000), default=4, help="classes of a JPEG tree (default 4)")
    make.add_argument("--shards", type=Number(int, 1, 1024), default=2, help="TFRecord shards (default 2)")
    make.add_argument("--image-size", type=PIXELS, default=64, help="square images (default 64)")
    make.add_argument("--seed", type=SEED, default=0, help="noise seed (default 0)")
    return state_ranges(parser)


def validate(args: argparse.Namespace) -> int:
    """Run every check that does not need a device and print the planned layout."""
    config = TrainConfig.from_args(args)
    check_static(config)
    if args.world_size is not None:
        devices = args.world_size
    elif args.nodes is not None or args.devices_per_node is not None:
        devices = (args.nodes or 1) * (args.devices_per_node or 1)
    else:
        devices = LaunchEnv.from_env().world_size
    check_devices(config, devices, "cpu" if config.device == "cpu" else "cuda")
    flops = resnet50_flops(config.variant, config.image_size)
    print(
        f"OK: {config.framework} {flops.to_dict()['architecture']}, global batch {config.global_batch_size} = "
        f"{devices} devices x {config.per_device_batch(devices)}, {config.precision}, {config.image_size} px, "
        f"{config.warmup_iterations} warm-up + {_measured(config)} measured iterations, {_compiled(config)}, "
        f"{flops.training / 1e9:.2f} GFLOP per training image"
    )
    return 0


def _compiled(config: TrainConfig) -> str:
    if config.framework == "pytorch" and config.compile:
        tuning = ", coordinate-descent tuning" if config.coordinate_descent_tuning else ""
        return f"torch.compile mode {config.compile_mode}{tuning}{_batch_norm(config)}"
    return config.compile_label + _batch_norm(config)


BATCH_NORM_LABELS = {"triton": ", batch norm by own Triton kernels",
                     "triton-conv": ", batch norm by own Triton kernels, its statistics in the 1x1 convolutions"}


def _batch_norm(config: TrainConfig) -> str:
    return BATCH_NORM_LABELS.get(config.bn_kernels, "")


def _measured(config: TrainConfig) -> str:
    if config.iterations is not None:
        return str(config.iterations)
    if config.steady_seconds is not None:
        return f"{config.steady_seconds:g} s of"
    return f"time-sized (auto; {CPU_ITERATIONS} on the CPU)"


def make_data(args: argparse.Namespace) -> int:
    if args.images <= 0 or args.classes <= 0 or args.shards <= 0 or args.image_size <= 0:
        raise ValidationError("--images, --classes, --shards and --image-size must be positive", "pass values >= 1")
    library = "TensorFlow" if args.format == "tfrecord" else "torchvision"
    with Heartbeat(lambda text: print(text, flush=True)) as beat:  # TensorFlow's import took 20 s on a cold machine
        beat.begin(f"make-data: {args.images} {args.format} images")
        beat.say(f"make-data: loading {library}, then writing {args.images} {args.format} images under {args.out}")
        if args.format == "tfrecord":
            from resnet50.tf_data import write_tfrecords

            written = write_tfrecords(args.out, args.images, args.shards, args.image_size, args.seed)
        else:
            from resnet50.torch_data import write_jpeg_tree

            per_class = max(1, args.images // args.classes)
            written = write_jpeg_tree(args.out, args.classes, per_class, args.image_size, args.seed)
        beat.say(f"wrote {written} {args.format} images under {args.out}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    debug, rest = take_debug_flag(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(rest)

    def command() -> int:
        if args.command == "train":
            from resnet50.driver import train

            return train(TrainConfig.from_args(args))
        if args.command == "validate":
            return validate(args)
        return make_data(args)

    # ValidationError (64), OutputDirError (73), OSError (74), a missing extra (69)
    return exit_code_of("resnet50", command, debug, torch_extra="resnet-pytorch")


if __name__ == "__main__":
    sys.exit(main())
