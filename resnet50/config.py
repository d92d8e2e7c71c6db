"""Run configuration of the ResNet-50 benchmark and every check that can fail before device work.

One dataclass for both backends, so the JUBE workflow passes the same options whatever the
framework. Checks raise `ValidationError(problem, fix)`; the batch check refuses a global batch
that does not split evenly over the devices (CARAML silently floors it and then reports the
wrong batch).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import os
from pathlib import Path
from typing import Any

from joulebench.lifecycle import default_out_dir, new_run_id
from joulebench.loop import LoopSpec
from joulebench.sizing import check_warmup_for_timing
from joulebench.torch_device import no_gpu_error
from jpwr import ValidationError
from resnet50.flops import resnet50_flops

FRAMEWORKS = ("pytorch", "tensorflow")
PRECISIONS = ("bf16", "fp16", "fp32")
DEVICES = ("auto", "cuda", "cpu")
DATA_FORMATS = ("jpeg", "tfrecord")
# who computes the training-mode batch norms of the torch backend: inductor (torch.compile's fusions, or ATen's
# kernels in eager runs) or our own Triton kernels with the residual add and ReLU fused (resnet50.bn_kernels, CUDA
# only), with triton-conv also the 1x1 convolutions as our GEMM that measures the batch statistics (resnet50.conv_stats)
BN_KERNELS = ("inductor", "triton", "triton-conv")
STRIDE = 32  # ResNet-50's overall stride: its last stage sees 1x1 maps at images up to this size
MIN_IMAGE_SIZE = 32  # Keras ResNet50 refuses smaller inputs; five stride-2 stages need it anyway
VARIANT_OF = {"tensorflow": "v1", "pytorch": "v1.5"}
DEFAULT_DATA_FORMAT = {"tensorflow": "tfrecord", "pytorch": "jpeg"}
CPU_ITERATIONS = 100  # measured iterations of a CPU run without --iterations (tf_cnn_benchmarks' --num_batches)
MOMENTUM = 0.9
WEIGHT_DECAY = 5e-5  # MLPerf ResNet-50 value; applied the same way in both backends (decoupled, on all weights)
# torch.compile on CUDA by default: CUDA graphs (reduce-overhead) with inductor's per-kernel launch tuning, the
# fastest measured on one H100 (docs/perf-notes.md: eager 3,966, compile 5,631, this 5,910 img/s; minutes of warm-up
# the first time, inductor's cache shortens later runs). Forced on the CPU (--compile) the mode stays "default".
CUDA_COMPILE_MODE = "reduce-overhead"
CPU_COMPILE_MODE = "default"
# warm-up iterations a compiled run needs: the first call traces and compiles forward and backward (and runs them
# without a graph), the second records the CUDA graphs (reduce-overhead), replays start at the third; both must end
# before the steady window opens
MIN_COMPILE_WARMUP = 2
CDT_ENV = "TORCHINDUCTOR_COORDINATE_DESCENT_TUNING"  # inductor's own switch: honoured where the option is left auto


@dataclasses.dataclass
class TrainConfig:
    """Resolved options of one run (argparse names, with defaults filled in)."""

    framework: str
    global_batch_size: int = 256
    precision: str = "bf16"
    image_size: int = 224
    iterations: int | None = None  # measured iterations; None: sized by time (accelerators) or CPU_ITERATIONS
    warmup_iterations: int = 10
    steady_seconds: float | None = None  # None: auto (joulebench.sizing)
    idle_baseline: bool = True
    exit_duration_mins: float | None = None
    data: str = "synthetic"
    data_format: str | None = None
    channels_last: bool = True
    compile: bool | None = None  # None: auto, on for pytorch on CUDA (resolve_compile)
    compile_mode: str | None = None  # None: reduce-overhead on CUDA, default on the CPU; eager runs keep None
    coordinate_descent_tuning: bool | None = None  # inductor's; None: on when compiling on CUDA
    compile_cache: str | None = None  # --compile-cache: a directory, "none", or None for the default (compile_cache)
    bn_kernels: str = "inductor"  # BN_KERNELS
    xla: bool = False
    device: str = "auto"
    out_dir: str | None = None
    run_id: str | None = None
    energy_methods: str | None = None
    log_to: tuple[str, ...] = ()  # --log-to: tools the run logs to (joulebench.exports)
    log_interval: int = 10
    caraml_output: bool = False
    seed: int = 42
    lr: float = 0.1
    data_workers: int = 4
    replay_phases: float = 0.0  # > 0: after training, each phase alone for this many seconds (pytorch)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> TrainConfig:
        fields = {f.name for f in dataclasses.fields(cls)}
        config = cls(**{k: v for k, v in vars(args).items() if k in fields})
        if config.data_format is None:
            config.data_format = DEFAULT_DATA_FORMAT[config.framework]
        if config.run_id is None:
            config.run_id = new_run_id("resnet50", config.framework)
        if config.out_dir is None:
            config.out_dir = default_out_dir("resnet50", config.run_id)
        return config

    def loop_spec(self) -> LoopSpec:
        """What joulebench's shared training loop needs: counts, window sizing, work per step (all replicas)."""
        return LoopSpec(iterations=self.iterations, warmup_iterations=self.warmup_iterations,
                        steady_seconds=self.steady_seconds, cpu_iterations=CPU_ITERATIONS,
                        log_interval=self.log_interval, work_unit="images", work_per_step=float(self.global_batch_size))

    @property
    def compile_label(self) -> str:
        """What compiled the step, for the record: "eager", the torch.compile mode, "xla" or "tf.function"."""
        if self.framework == "tensorflow":
            return "xla" if self.xla else "tf.function"
        return str(self.compile_mode) if self.compile else "eager"

    @property
    def synthetic(self) -> bool:
        return self.data == "synthetic"

    @property
    def variant(self) -> str:
        return VARIANT_OF[self.framework]

    def per_device_batch(self, devices: int) -> int:
        return self.global_batch_size // devices

    def to_dict(self, devices: int | None = None) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data.update(resnet50_flops(self.variant, self.image_size).to_dict())
        data.update(momentum=MOMENTUM, weight_decay=WEIGHT_DECAY, optimizer="SGD with momentum")
        if devices is not None:
            data.update(devices=devices, per_device_batch_size=self.per_device_batch(devices))
        return data


def check_static(config: TrainConfig) -> None:
    """Checks that need neither a framework nor a device."""
    _positive("--global-batch-size", config.global_batch_size)
    if config.iterations is not None:
        _positive("--iterations", config.iterations)
    _positive("--log-interval", config.log_interval)
    if config.warmup_iterations < 0:
        raise ValidationError(f"--warmup-iterations {config.warmup_iterations} is negative", "pass 0 or more")
    check_warmup_for_timing(config.warmup_iterations, config.iterations is not None, config.steady_seconds,
                            config.device)
    if config.image_size < MIN_IMAGE_SIZE:
        raise ValidationError(
            f"--image-size {config.image_size} is below {MIN_IMAGE_SIZE}", f"pass --image-size {MIN_IMAGE_SIZE} or more"
        )
    if config.lr <= 0:
        raise ValidationError(f"--lr {config.lr} is not positive", "pass a learning rate > 0, e.g. --lr 0.1")
    if config.exit_duration_mins is not None and config.exit_duration_mins <= 0:
        raise ValidationError(
            f"--exit-duration-mins {config.exit_duration_mins} is not positive", "pass minutes > 0 or leave it out"
        )
    if config.data_workers < 0:
        raise ValidationError(f"--data-workers {config.data_workers} is negative", "pass 0 or more")
    _check_framework_options(config)
    if not config.synthetic:
        _check_data_dir(config)


def check_devices(config: TrainConfig, devices: int, device_kind: str) -> None:
    """Checks that need the device count ("cpu" or "cuda" kind) of the whole run; resolves the compile defaults
    that depend on the device kind first (resolve_compile)."""
    resolve_compile(config, device_kind)
    if devices <= 0:
        raise ValidationError(f"{devices} devices", "run on at least one device")
    if config.global_batch_size % devices:
        lower = config.global_batch_size - config.global_batch_size % devices
        raise ValidationError(
            f"--global-batch-size {config.global_batch_size} does not divide evenly over {devices} devices "
            f"(would leave {config.global_batch_size % devices} images unassigned)",
            f"pass a multiple of {devices}, e.g. --global-batch-size {lower or devices} or {lower + devices}",
        )
    if config.framework == "pytorch" and config.global_batch_size == devices and config.image_size <= STRIDE:
        raise ValidationError(
            f"one image per device at --image-size {config.image_size} leaves the last stage's batch norm a single "
            "value per channel, which PyTorch refuses to train on",
            f"use --image-size {STRIDE + 1} or more, or at least 2 images per device",
        )
    if config.device == "cuda" and device_kind != "cuda":
        raise no_gpu_error()
    if config.bn_kernels != "inductor":
        _check_triton_batch_norm(config.bn_kernels, device_kind)
    if config.framework == "tensorflow" and device_kind == "cpu" and not config.channels_last:
        raise ValidationError(
            "--no-channels-last with TensorFlow on CPU (TF's CPU convolutions support only NHWC)",
            "drop --no-channels-last, or run on GPUs",
        )


def resolve_compile(config: TrainConfig, device_kind: str) -> None:
    """Fill in --compile, --compile-mode and --coordinate-descent-tuning where left auto (idempotent), and refuse
    compilation whose first calls would land in the measured window.

    pytorch: compile on CUDA, eager on the CPU; on CUDA mode reduce-overhead (CUDA graphs) with inductor's
    coordinate-descent tuning, on the CPU mode default with the tuning as inductor's environment variable says.
    tensorflow: never torch.compile (its --xla is separate)."""
    if config.framework != "pytorch":
        config.compile = False
        return
    cuda = device_kind == "cuda"
    if config.compile is None:
        config.compile = cuda
    if not config.compile:
        if given := _compile_option_given(config):
            why = "--no-compile" if cuda else "on the CPU compilation is off unless --compile is given"
            raise ValidationError(f"{given} without compilation ({why})",
                                  f"add --compile, or drop {given}")
        return
    if config.compile_mode is None:
        config.compile_mode = CUDA_COMPILE_MODE if cuda else CPU_COMPILE_MODE
    if config.coordinate_descent_tuning is None:
        config.coordinate_descent_tuning = cuda or os.environ.get(CDT_ENV) == "1"
    if config.warmup_iterations < MIN_COMPILE_WARMUP:
        default = " (the default on GPUs)" if cuda else ""
        raise ValidationError(
            f"--warmup-iterations {config.warmup_iterations} with torch.compile{default}: compilation and CUDA-graph "
            "recording take the first calls and would land in the measured window",
            f"give at least {MIN_COMPILE_WARMUP} warm-up iterations (--warmup-iterations {MIN_COMPILE_WARMUP}), "
            "or --no-compile for eager")


def _compile_option_given(config: TrainConfig) -> str | None:
    """The first torch.compile option the user set (not left auto), for the refusals where nothing compiles."""
    if config.compile_mode is not None:
        return "--compile-mode"
    if config.compile_cache is not None:
        return "--compile-cache"
    return "--coordinate-descent-tuning" if config.coordinate_descent_tuning is not None else None


def _check_triton_batch_norm(bn_kernels: str, device_kind: str) -> None:
    """Our Triton batch-norm kernels run on CUDA GPUs only, and need Triton (CUDA torch wheels bring it)."""
    if device_kind != "cuda":
        raise ValidationError(f"--bn-kernels {bn_kernels} on the CPU (its Triton kernels need a CUDA GPU)",
                              f"drop --bn-kernels {bn_kernels} (CPU runs keep inductor)")
    if importlib.util.find_spec("triton") is None:
        raise ValidationError(f"--bn-kernels {bn_kernels} but Triton is not installed",
                              "install torch's CUDA wheel (it brings triton), or pass --bn-kernels inductor")


def _positive(flag: str, value: int) -> None:
    if value <= 0:
        raise ValidationError(f"{flag} {value} is not positive", f"pass {flag} 1 or more")


def _check_framework_options(config: TrainConfig) -> None:
    if config.framework == "pytorch":
        if config.xla:
            raise ValidationError("--xla with --framework pytorch", "use --compile for torch.compile, or drop --xla")
        if config.data_format == "tfrecord":
            raise ValidationError(
                "--data-format tfrecord with --framework pytorch (no TFRecord reader in the torch backend)",
                "pass an ImageFolder JPEG tree with --data-format jpeg, or use --framework tensorflow",
            )
    else:
        if config.compile:
            raise ValidationError("--compile with --framework tensorflow", "use --xla for XLA compilation")
        if given := _compile_option_given(config):
            raise ValidationError(f"{given} with --framework tensorflow (torch.compile options)",
                                  f"drop {given}; use --xla for XLA compilation")
        if config.bn_kernels != "inductor":
            raise ValidationError(f"--bn-kernels {config.bn_kernels} with --framework tensorflow (torch backend's "
                                  "batch norm)", "drop --bn-kernels, or use --framework pytorch")
        if config.replay_phases:
            raise ValidationError("--replay-phases with --framework tensorflow (its step is one compiled function "
                                  "without phase marks)", "use --framework pytorch, or drop --replay-phases")
        if config.data_format == "jpeg":
            raise ValidationError(
                "--data-format jpeg with --framework tensorflow (the TF backend reads ImageNet TFRecords)",
                "convert the tree to TFRecords, or use --framework pytorch for JPEG trees",
            )


def tfrecord_pattern(data_dir: str | Path, subset: str = "train") -> str:
    """File pattern of a subset in the layout tf_cnn_benchmarks reads (`train-00000-of-01024`)."""
    return str(Path(data_dir) / f"{subset}-*-of-*")


def jpeg_root(data_dir: str | Path) -> Path:
    """ImageFolder root: `<dir>/train` when present (ImageNet layout), else `<dir>` itself."""
    path = Path(data_dir)
    return path / "train" if (path / "train").is_dir() else path


def _check_data_dir(config: TrainConfig) -> None:
    path = Path(config.data)
    if not path.is_dir():
        raise ValidationError(
            f"--data {config.data} is not a directory", "pass an existing data directory or --data synthetic"
        )
    if config.data_format == "tfrecord":
        if not list(path.glob("train-*-of-*")):
            raise ValidationError(
                f"--data {config.data} holds no TFRecord shards named train-*-of-*",
                "point --data at an ImageNet TFRecord directory, or create a small one with "
                "`python -m resnet50 make-data --format tfrecord DIR`",
            )
        return
    root = jpeg_root(path)
    if not any(p.is_dir() for p in root.iterdir()):
        raise ValidationError(
            f"--data {config.data} has no class sub-directories (ImageFolder layout: <class>/<image>.jpg)",
            "point --data at an ImageNet JPEG tree, or make one: `python -m resnet50 make-data --format jpeg DIR`",
        )
