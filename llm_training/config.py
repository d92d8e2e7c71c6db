"""The resolved configuration of one run: preset shape + profile settings + command-line overrides.

Resolution needs the world size (data-parallel size and derived global batch) but no device, so
`validate` can run on a login node. Checks live in llm_training.validation.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from joulebench.arguments import (
    COUNT,
    COUNT_OR_ZERO,
    FACTOR,
    LEARNING_RATE,
    LOG_INTERVAL,
    LOSS_SCALE,
    MINUTES,
    NODES,
    POSITIVE_FACTOR,
    PROBABILITY,
    SECONDS_OR_ZERO,
    SEED,
    SIZE,
    Number,
    method_names,
)
from joulebench.compile_cache import add_compile_cache_argument
from joulebench.exports.targets import add_log_to
from joulebench.lifecycle import default_out_dir, new_run_id
from joulebench.loop import LoopSpec
from joulebench.sizing import add_window_arguments
from llm_training import presets
from llm_training.presets import ModelShape, RunSettings

SAMPLES = Number(int, 1, 10**12)  # learning-rate schedules in samples: CARAML's decay alone is 1.3e8

PRECISIONS = ("bf16", "fp16", "fp32")
CPU_ITERATIONS = 45  # measured iterations of a CPU run without --iterations (50 with the default warm-up): quick in CI
RECOMPUTE = ("none", "selective", "full")
DEVICES = ("auto", "cuda", "cpu")
ATTENTION_BACKENDS = ("auto", "flash", "cudnn", "efficient", "math")
# --cuda-graphs: megatron-core's own ("local") CUDA graphs, no Transformer Engine: each TransformerLayer's forward and
# backward ("layers", megatron's CudaGraphManager) or the whole forward-backward of a step ("step", megatron's
# FullCudaGraphWrapper; the optimizer stays outside)
CUDA_GRAPHS = ("none", "layers", "step")
CUDA_GRAPH_WARMUP = 2  # eager calls before megatron records the graphs (the first compiles the fused kernels)
MBS_FROM_OPTION = "--micro-batch-size"
MBS_FROM_PRESET = "preset"  # the profile's; llm_training.memory.choose_micro_batch may raise it on a GPU


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Everything a run uses; recorded verbatim in the run record's `config`."""

    model: str
    profile: str  # "default" or "caraml"
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    ffn_hidden_size: int
    seq_length: int
    vocab_size: int
    padded_vocab_size: int
    eod_token: int
    world_size: int
    tensor_parallel: int
    pipeline_parallel: int
    data_parallel: int
    sequence_parallel: bool
    micro_batch_size: int
    global_batch_size: int
    micro_batch_size_from: str  # why this MBS: MBS_FROM_OPTION, MBS_FROM_PRESET, or the device-memory choice's text
    precision: str
    recompute: str
    iterations: int | None  # measured steady iterations, warm-up not included; None: sized by time (or the CPU default)
    warmup_iterations: int
    steady_seconds: float | None  # None: auto (joulebench.sizing)
    idle_baseline: bool
    exit_duration_mins: float | None
    device: str
    data_path: str | None
    out_dir: str
    run_id: str
    energy_methods: str | None
    log_to: tuple[str, ...]  # --log-to: tools the run logs to (joulebench.exports)
    log_interval: int
    seed: int
    lr: float
    min_lr: float
    lr_warmup_samples: int
    lr_decay_samples: int
    weight_decay: float
    clip_grad: float
    adam_beta1: float
    adam_beta2: float
    adam_eps: float
    init_method_std: float
    attention_dropout: float
    hidden_dropout: float
    initial_loss_scale: float
    loss_scale_window: int
    loss_scale_hysteresis: int
    min_loss_scale: float
    overfit_batch: bool
    overlap_grad_reduce: bool | None  # None: on when DP > 1
    bias_fusion: bool | None  # None: on for CUDA, off for CPU (torch.compile on CPU is slow to build)
    attention_backend: str  # SDPA kernel choice; "auto" lets torch pick
    rope_fusion: bool | None  # None: on for CUDA (torch.compile of megatron's RoPE), off for CPU
    cross_entropy_fusion: bool | None  # None: on for CUDA (llm_training.cross_entropy, compiled)
    fused_optimizer: bool | None  # None: on for CUDA (torch's fused AdamW kernel instead of foreach)
    replay_phases_s: float = 0.0  # > 0: after training, each phase alone this long (joulebench.phases.replay_phases)
    compile_cache: str | None = None  # --compile-cache: a directory, "none", or None for the default (compile_cache)
    cuda_graphs: str = "none"  # CUDA_GRAPHS

    @property
    def num_microbatches(self) -> int:
        return self.global_batch_size // (self.micro_batch_size * self.data_parallel)

    @property
    def micro_batches_in_flight(self) -> int:
        """Micro-batches whose activations a device holds at once in training: 1F1B keeps up to PP in flight on the
        first stage, one without a pipeline. The memory estimate and the forward replay both size by it."""
        return min(self.pipeline_parallel, max(self.num_microbatches, 1))

    @property
    def tokens_per_iteration(self) -> int:
        return self.global_batch_size * self.seq_length

    @property
    def shape(self) -> ModelShape:
        return ModelShape(
            self.model, self.num_layers, self.hidden_size, self.num_attention_heads, self.ffn_hidden_size,
            self.seq_length, self.vocab_size, self.eod_token,
        )

    def compiles(self, device_type: str) -> bool:
        """Whether a fusion that torch.compile builds is on (bias, RoPE, cross-entropy): then the compile caches and
        the compile seconds apply."""
        return any(on_for_cuda(choice, device_type)
                   for choice in (self.bias_fusion, self.rope_fusion, self.cross_entropy_fusion))

    def loop_spec(self) -> LoopSpec:
        """What joulebench's shared training loop needs: counts, window sizing, tokens per step (all replicas)."""
        return LoopSpec(iterations=self.iterations, warmup_iterations=self.warmup_iterations,
                        steady_seconds=self.steady_seconds, cpu_iterations=CPU_ITERATIONS,
                        log_interval=self.log_interval, work_unit="tokens",
                        work_per_step=float(self.tokens_per_iteration))

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["num_microbatches"] = self.num_microbatches
        data["tokens_per_iteration"] = self.tokens_per_iteration
        return data


def on_for_cuda(choice: bool | None, device_type: str) -> bool:
    """An optional speed-up's setting: the user's --x/--no-x, else on for CUDA (compiling on a CPU is slow)."""
    return device_type == "cuda" if choice is None else choice


def _pick(override: Any, default: Any) -> Any:
    return default if override is None else override


def settings_for(model: str, caraml: bool) -> RunSettings:
    table = presets.CARAML_SETTINGS if caraml else presets.DEFAULT_SETTINGS
    return table[model]


def resolve(args: argparse.Namespace, world_size: int) -> TrainConfig:
    """Combine preset, profile and overrides. Call llm_training.validation.check_model_name first."""
    shape = presets.MODEL_SHAPES[args.model]
    settings = settings_for(args.model, args.caraml)
    run_id = args.run_id or new_run_id("llm", args.model)
    tp = _pick(args.tensor_parallel, settings.tensor_parallel)
    pp = _pick(args.pipeline_parallel, settings.pipeline_parallel)
    model_parallel = tp * pp
    dp = world_size // model_parallel if model_parallel > 0 and world_size % model_parallel == 0 else 0
    mbs = _pick(args.micro_batch_size, settings.micro_batch_size)
    gbs = args.global_batch_size
    if gbs is None:
        if settings.global_batch_size is not None:
            gbs = settings.global_batch_size
        elif settings.samples_per_replica is not None:
            gbs = max(dp, 1) * settings.samples_per_replica
        else:
            gbs = mbs * max(dp, 1) * (settings.microbatches_per_replica or 1)
    sequence_parallel = _pick(args.sequence_parallel, settings.sequence_parallel) and tp > 1
    vocab = _pick(args.vocab_size, shape.vocab_size)
    return TrainConfig(
        model=args.model, profile="caraml" if args.caraml else "default",
        num_layers=_pick(args.num_layers, shape.num_layers), hidden_size=_pick(args.hidden_size, shape.hidden_size),
        num_attention_heads=_pick(args.num_attention_heads, shape.num_attention_heads),
        ffn_hidden_size=_pick(args.ffn_hidden_size, shape.ffn_hidden_size),
        seq_length=_pick(args.seq_length, shape.seq_length), vocab_size=vocab,
        padded_vocab_size=presets.padded_vocab_size(vocab, max(tp, 1)),
        eod_token=min(shape.eod_token, vocab - 1), world_size=world_size,
        tensor_parallel=tp, pipeline_parallel=pp, data_parallel=dp, sequence_parallel=sequence_parallel,
        micro_batch_size=mbs, global_batch_size=gbs,
        micro_batch_size_from=MBS_FROM_PRESET if args.micro_batch_size is None else MBS_FROM_OPTION,
        precision=_pick(args.precision, settings.precision), recompute=_pick(args.recompute, settings.recompute),
        iterations=args.iterations, warmup_iterations=args.warmup_iterations, steady_seconds=args.steady_seconds,
        idle_baseline=args.idle_baseline,
        exit_duration_mins=args.exit_duration_mins, device=args.device, data_path=args.data_path,
        out_dir=args.out_dir or default_out_dir("llm_training", run_id), run_id=run_id,
        energy_methods=args.energy_methods, log_to=args.log_to,
        log_interval=args.log_interval, seed=args.seed,
        lr=_pick(args.lr, settings.lr), min_lr=_pick(args.min_lr, settings.min_lr),
        lr_warmup_samples=_pick(args.lr_warmup_samples, settings.lr_warmup_samples),
        lr_decay_samples=_pick(args.lr_decay_samples, settings.lr_decay_samples),
        weight_decay=args.weight_decay, clip_grad=args.clip_grad,
        adam_beta1=args.adam_beta1, adam_beta2=args.adam_beta2, adam_eps=args.adam_eps,
        init_method_std=args.init_method_std, attention_dropout=args.attention_dropout,
        hidden_dropout=args.hidden_dropout, initial_loss_scale=args.initial_loss_scale,
        loss_scale_window=args.loss_scale_window, loss_scale_hysteresis=args.loss_scale_hysteresis,
        min_loss_scale=args.min_loss_scale, overfit_batch=args.overfit_batch,
        overlap_grad_reduce=args.overlap_grad_reduce, bias_fusion=args.bias_fusion,
        attention_backend=args.attention_backend,
        rope_fusion=args.rope_fusion, cross_entropy_fusion=args.cross_entropy_fusion,
        fused_optimizer=args.fused_optimizer, replay_phases_s=args.replay_phases, compile_cache=args.compile_cache,
        cuda_graphs=args.cuda_graphs,
    )


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """Options shared by `train` and `validate` (validate must accept exactly what train accepts)."""
    p = presets
    g = parser.add_argument_group("model and parallelism")
    g.add_argument("--model", default="800M", help=f"preset: {', '.join(p.MODEL_SHAPES)}")
    g.add_argument("--caraml", action="store_true", help="use CARAML's exact run settings instead of the fastest")
    g.add_argument("--tensor-parallel", type=NODES)
    g.add_argument("--pipeline-parallel", type=NODES)
    g.add_argument("--sequence-parallel", action=argparse.BooleanOptionalAction, default=None)
    g.add_argument("--micro-batch-size", type=SIZE)
    g.add_argument("--global-batch-size", type=SIZE)
    g.add_argument("--seq-length", type=SIZE)
    g.add_argument("--num-layers", type=SIZE)
    g.add_argument("--hidden-size", type=SIZE)
    g.add_argument("--num-attention-heads", type=SIZE)
    g.add_argument("--ffn-hidden-size", type=SIZE)
    g.add_argument("--vocab-size", type=SIZE, help="tokenizer vocabulary before padding (GPT-2: 50257)")
    g.add_argument("--precision", choices=PRECISIONS)
    g.add_argument("--recompute", choices=RECOMPUTE)
    g.add_argument("--overlap-grad-reduce", action=argparse.BooleanOptionalAction, default=None,
                   help="overlap the data-parallel gradient reduce-scatter with backward (default: on when DP > 1)")
    g.add_argument("--bias-fusion", action=argparse.BooleanOptionalAction, default=None,
                   help="megatron's torch.compile bias+GeLU / bias+dropout fusions (default: on for CUDA)")
    g.add_argument("--attention-backend", choices=ATTENTION_BACKENDS, default="auto",
                   help="pin the SDPA kernel for core attention (default auto: torch's choice, cuDNN on H100)")
    g.add_argument("--rope-fusion", action=argparse.BooleanOptionalAction, default=None,
                   help="torch.compile megatron's unfused RoPE into one kernel per direction (default: on for CUDA)")
    g.add_argument("--cross-entropy-fusion", action=argparse.BooleanOptionalAction, default=None,
                   help="two-pass compiled cross-entropy instead of megatron's fp32-softmax one; same math "
                        "(default: on for CUDA)")
    g.add_argument("--fused-optimizer", action=argparse.BooleanOptionalAction, default=None,
                   help="torch's fused AdamW kernel instead of its foreach one (default: on for CUDA)")
    add_compile_cache_argument(g)
    g.add_argument("--cuda-graphs", choices=CUDA_GRAPHS, default="none",
                   help="megatron-core's own CUDA graphs (no Transformer Engine; GPUs, --recompute none): layers = "
                        "each transformer layer's forward and backward, step = the whole forward-backward (the "
                        "optimizer outside); default none")
    r = parser.add_argument_group("run control")
    r.add_argument("--iterations", type=COUNT, default=None,
                   help="measured iterations, warm-up not included (Megatron's --train-iters = warm-up + this); "
                        "fixes the steady window. Default: sized by --steady-seconds on accelerators, "
                        f"{CPU_ITERATIONS} on the CPU")
    r.add_argument("--warmup-iterations", type=COUNT_OR_ZERO, default=5,
                   help="first iterations left out of the measured window; they time the step (default 5; 0 = none: "
                        "the first measured iteration times it)")
    add_window_arguments(r, cpu_default=f"on the CPU {CPU_ITERATIONS} iterations")
    r.add_argument("--exit-duration-mins", type=MINUTES, help="stop cleanly after this many minutes of training")
    r.add_argument("--device", choices=DEVICES, default="auto")
    r.add_argument("--data-path", help="Megatron dataset prefix (PREFIX.bin/.idx); mock data when omitted")
    r.add_argument("--overfit-batch", action="store_true", help="train on the first global batch every step")
    r.add_argument("--out-dir", help="run directory (default runs/llm_training/<run-id>)")
    r.add_argument("--run-id")
    r.add_argument("--energy-methods", type=method_names,
                   help="in-process jpwr metering (single process only), e.g. pynvml")
    r.add_argument("--replay-phases", type=SECONDS_OR_ZERO, default=0.0, metavar="SECONDS",
                   help="after training, run forward, forward+backward, the optimizer step and the whole step each "
                        "alone for SECONDS (>= 30 counter updates, 3 s on an H100) in windows replay/<phase>: "
                        "the replay estimator of `joulebench attribute` (needs a jpwr sampler; default 0 = off)")
    r.add_argument("--log-interval", type=LOG_INTERVAL, default=5,
                   help="progress line every N iterations (default 5); a stop (SIGTERM, --exit-duration-mins) waits "
                        "for the next")
    add_log_to(r)
    r.add_argument("--seed", type=SEED, default=p.SEED)
    o = parser.add_argument_group("optimizer (CARAML's values by default)")
    o.add_argument("--lr", type=LEARNING_RATE, help="peak learning rate")
    o.add_argument("--min-lr", type=FACTOR, help="learning rate at the end of the decay (0 = decay to zero)")
    o.add_argument("--lr-warmup-samples", type=Number(int, 0, SAMPLES.high),
                   help="samples of linear learning-rate warm-up, fewer than --lr-decay-samples (0 = none)")
    o.add_argument("--lr-decay-samples", type=SAMPLES, help="samples of cosine decay to --min-lr")
    o.add_argument("--weight-decay", type=FACTOR, default=p.WEIGHT_DECAY, help="AdamW weight decay (0 = off)")
    o.add_argument("--clip-grad", type=FACTOR, default=p.CLIP_GRAD, help="gradient-norm clip (0 = off)")
    o.add_argument("--adam-beta1", type=PROBABILITY, default=p.ADAM_BETA1, help="0 = no momentum")
    o.add_argument("--adam-beta2", type=PROBABILITY, default=p.ADAM_BETA2,
                   help="0 = the last gradient's square only")
    o.add_argument("--adam-eps", type=POSITIVE_FACTOR, default=p.ADAM_EPS)
    o.add_argument("--init-method-std", type=POSITIVE_FACTOR, default=p.INIT_METHOD_STD)
    o.add_argument("--attention-dropout", type=PROBABILITY, default=p.DROPOUT, help="0 = no dropout")
    o.add_argument("--hidden-dropout", type=PROBABILITY, default=p.DROPOUT, help="0 = no dropout")
    o.add_argument("--initial-loss-scale", type=LOSS_SCALE, default=p.INITIAL_LOSS_SCALE)
    o.add_argument("--loss-scale-window", type=COUNT, default=p.LOSS_SCALE_WINDOW)
    o.add_argument("--loss-scale-hysteresis", type=COUNT, default=p.LOSS_SCALE_HYSTERESIS)
    o.add_argument("--min-loss-scale", type=LOSS_SCALE, default=p.MIN_LOSS_SCALE)
