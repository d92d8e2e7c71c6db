"""The resolved configuration of one invocation: model, tasks, batch sizes, run control.

Resolution needs no device, so `validate` runs on a login node; checks are in validation.py.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from joulebench.arguments import COUNT, COUNT_OR_ZERO, MINUTES, SEED, SIZE, SameMeaning, comma_list, method_names
from joulebench.compile_cache import add_compile_cache_argument
from joulebench.exports.targets import add_log_to
from joulebench.lifecycle import default_out_dir, new_run_id
from joulebench.sizing import add_window_arguments
from llm_inference.decode_choice import DECODE_TUNINGS, DEFAULT_OBJECTIVE, OBJECTIVES
from llm_inference.memory import ENGINES
from llm_inference.presets import PRESETS
from llm_inference.tasks import TASKS

PRECISIONS = ("auto", "bf16", "fp16", "fp32")
DEVICES = ("auto", "cuda", "cpu")
ATTENTION = ("sdpa", "eager")
CPU_WINDOW_S = 3.0  # prefill/steady window length of a CPU run without --steady-seconds


@dataclasses.dataclass(frozen=True)
class InferenceConfig:
    """Everything one invocation uses; each point's run record stores it with its own task and batch size."""

    preset: str
    checkpoint: str | None
    tasks: tuple[str, ...]
    batch_sizes: tuple[int, ...]
    num_batches: int  # distinct batches drawn per point; the windows cycle over them
    output_length: int | None  # override of the task's output length distribution
    steady_seconds: float | None  # prefill and steady windows last at least this long; None: auto (joulebench.sizing)
    idle_baseline: bool  # cool down and meter idle power once, before the first point (jpwr.idle)
    warmup_batches: int
    exit_duration_mins: float | None  # stop cleanly (TIMEOUT) this long after the start, like the training drivers
    precision: str  # resolved against the device at run time ("auto": bf16 on GPUs, fp32 on CPUs)
    engine: str  # "static" (compact model code, static KV cache, CUDA graphs) or "hf" (transformers generate)
    attention: str
    device: str
    seed: int
    decode_tuning: str  # "auto" (chosen per batch shape at set-up, by the objective) or a DECODE_TUNING_CHOICES variant
    out_dir: str
    run_id: str
    energy_methods: str | None
    log_to: tuple[str, ...] = ()  # --log-to: tools each record's window figures go to (joulebench.exports)
    tensor_parallel: int = 1  # ranks (GPUs) the model's heads and MLP columns are split over (torchrun processes)
    objective: str | None = None  # --objective: how --decode-tuning auto chooses; None = not given (speed)

    @property
    def points(self) -> list[tuple[str, int]]:
        """(task, batch size) pairs in run order: tasks outer, batch sizes ascending inner."""
        return [(task, size) for task in self.tasks for size in self.batch_sizes]

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["tasks"] = list(self.tasks)
        data["batch_sizes"] = list(self.batch_sizes)
        return data


def _int_list(text: str) -> tuple[int, ...]:
    """A sweep of batch sizes: each at least 1, none twice (a repeated point would overwrite its record)."""
    values = tuple(int(SIZE(part)) for part in comma_list(text, "batch size", "1,8,64"))
    repeated = sorted({v for v in values if values.count(v) > 1})
    if repeated:
        raise argparse.ArgumentTypeError(f"{text!r} lists {', '.join(map(str, repeated))} more than once")
    return values


def _name_list(text: str) -> tuple[str, ...]:
    return tuple(comma_list(text, "task", "chat,code"))


# The static engine's compiled decode variants (llm_inference.static_engine.DECODE_TUNINGS) and "auto".
DECODE_TUNING_CHOICES = ("auto", *DECODE_TUNINGS)


def add_model_arguments(parser: argparse.ArgumentParser, engines: bool = True) -> None:
    """The model options of `run` and `load` (`engines`: the choice of engine and attention, `run` only)."""
    m = parser.add_argument_group("model")
    m.add_argument("--preset", default="llama-1b", help=f"architecture with random weights: {', '.join(PRESETS)}")
    m.add_argument("--checkpoint", help="local Hugging Face checkpoint directory (config.json + weights) "
                                        "instead of a preset's random weights")
    m.add_argument("--precision", choices=PRECISIONS, default="auto", help="auto: bf16 on GPUs, fp32 on CPUs")
    m.add_argument("--decode-tuning", choices=DECODE_TUNING_CHOICES, default="auto",
                   help="compiled variant of the decode step (GPU): auto = the faster replayed step per batch shape "
                        "(static engine; the continuous engine runs default), default, coordinate-descent "
                        "(inductor's per-kernel tuning: faster llama batch-1 steps on an H100, at more power), or "
                        "fused (Llama at batch 1 on one GPU: six Triton kernels per layer; other shapes: default)")
    add_compile_cache_argument(m)
    m.add_argument("--tensor-parallel", type=COUNT, default=1, metavar="N",
                   help="split the model's heads and MLP columns over N GPUs of one node (static and continuous "
                        "engines): start N processes, e.g. torchrun --nproc-per-node N -m llm_inference ...")
    m.add_argument("--objective", choices=OBJECTIVES, default=None,
                   help="how --decode-tuning auto chooses the variant per batch shape (static engine): speed = the "
                        f"faster replayed step (default: {DEFAULT_OBJECTIVE}), energy = the least energy per step "
                        "(replayed time × metered power; needs --energy-methods or `jpwr --`), edp = energy × time")
    if engines:
        m.add_argument("--engine", choices=ENGINES, default="static",
                       help="static: own model code, static KV cache, decode steps replayed as CUDA graphs "
                            "(default); hf: transformers generate (the baseline)")
        m.add_argument("--attention", choices=ATTENTION, default="sdpa",
                       help="transformers attention implementation (--engine hf; the static engine uses SDPA)")


def add_control_arguments(parser: argparse.ArgumentParser, window_help: str, default_out: str) -> None:
    """The run-control options of `run` and `load`."""
    r = parser.add_argument_group("run control")
    add_window_arguments(r, cpu_default=f"{CPU_WINDOW_S:g} s on the CPU; {window_help}", aliases=("--min-window-s",))
    r.add_argument("--exit-duration-mins", type=MINUTES, default=None,
                   help="stop cleanly at the next call boundary this many minutes after the start (status TIMEOUT)")
    r.add_argument("--device", choices=DEVICES, default="auto")
    r.add_argument("--out-dir", help=f"run directory (default {default_out})")
    r.add_argument("--run-id")
    r.add_argument("--energy-methods", type=method_names,
                   help="in-process jpwr metering (single process only), e.g. nvml")
    add_log_to(r)


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """Options shared by `run` and `validate` (validate accepts exactly what run accepts)."""
    add_model_arguments(parser)
    w = parser.add_argument_group("workload")
    w.add_argument("--task", type=_name_list, default=("chat",),
                   help=f"task or comma-separated tasks: {', '.join(TASKS)}")
    keep = "one: --batch-sizes for a sweep (e.g. 1,8), or --batch-size for one point"
    w.add_argument("--batch-size", type=SIZE, action=SameMeaning, same_as=("--batch-sizes",), keep=keep,
                   help="one batch size (requests per generate call)")
    w.add_argument("--batch-sizes", type=_int_list, action=SameMeaning, same_as=("--batch-size",), keep=keep,
                   help="sweep, e.g. 1,2,4,8 (one run record per point)")
    w.add_argument("--num-batches", type=COUNT, default=2, help="distinct batches drawn per point")
    w.add_argument("--output-length", type=SIZE, help="force this many new tokens instead of the task's draw")
    w.add_argument("--seed", type=SEED, default=1234, help="seed of the batches drawn")
    w.add_argument("--warmup-batches", type=COUNT_OR_ZERO, default=1,
                   help="generate calls before the measured windows (0 = none)")
    add_control_arguments(parser, "the prefill and steady windows each repeat their batches in whole passes until "
                                  "at least this long", "runs/llm_inference/<run-id>")


def resolve(args: argparse.Namespace) -> InferenceConfig:
    """Combine options (--batch-sizes or --batch-size, never both: SameMeaning), and 1 is the default."""
    sizes = args.batch_sizes or ((args.batch_size,) if args.batch_size is not None else (1,))
    run_id = args.run_id or new_run_id("inf", args.preset)
    return InferenceConfig(
        preset=args.preset, checkpoint=args.checkpoint, tasks=tuple(args.task), batch_sizes=tuple(sizes),
        num_batches=args.num_batches, output_length=args.output_length, steady_seconds=args.steady_seconds,
        idle_baseline=args.idle_baseline,
        warmup_batches=args.warmup_batches, exit_duration_mins=args.exit_duration_mins, precision=args.precision,
        engine=args.engine, attention=args.attention, decode_tuning=args.decode_tuning,
        device=args.device, seed=args.seed, out_dir=args.out_dir or default_out_dir("llm_inference", run_id),
        run_id=run_id,
        energy_methods=args.energy_methods, log_to=args.log_to, tensor_parallel=args.tensor_parallel,
        objective=args.objective,
    )
