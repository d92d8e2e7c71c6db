"""Checks run before any device work (and by `python -m llm_training validate` before submission).

Every failure is a jpwr.errors.ValidationError naming the offending values and a fix.
"""

from __future__ import annotations

import os
from pathlib import Path

from joulebench.sizing import check_warmup_for_timing
from jpwr import ValidationError
from llm_training.config import CUDA_GRAPH_WARMUP, TrainConfig
from llm_training.presets import MODEL_SHAPES


def check_model_name(model: str) -> None:
    if model not in MODEL_SHAPES:
        raise ValidationError(
            f"unknown model preset --model {model!r}", f"use one of {', '.join(MODEL_SHAPES)}"
        )


def _positive(name: str, value: int | float | None) -> None:
    if value is None or value <= 0:
        raise ValidationError(f"{name} is {value}", f"set {name} to a positive number")


def check_layout(world_size: int, nodes: int | None, devices_per_node: int | None) -> None:
    _positive("world size", world_size)
    if nodes is not None and devices_per_node is not None and nodes * devices_per_node != world_size:
        raise ValidationError(
            f"--nodes {nodes} × --devices-per-node {devices_per_node} = {nodes * devices_per_node} "
            f"is not --world-size {world_size}",
            "give a world size equal to nodes × devices per node (or omit --world-size)",
        )


def check_config(cfg: TrainConfig) -> None:
    """Parallel layout, batch arithmetic, shapes, run length and data; raises the first problem found."""
    for name, value in (
        ("--tensor-parallel", cfg.tensor_parallel), ("--pipeline-parallel", cfg.pipeline_parallel),
        ("--micro-batch-size", cfg.micro_batch_size), ("--global-batch-size", cfg.global_batch_size),
        ("--seq-length", cfg.seq_length), ("--num-layers", cfg.num_layers), ("--hidden-size", cfg.hidden_size),
        ("--num-attention-heads", cfg.num_attention_heads), ("--ffn-hidden-size", cfg.ffn_hidden_size),
        ("--vocab-size", cfg.vocab_size), ("--log-interval", cfg.log_interval),
        *((("--iterations", cfg.iterations),) if cfg.iterations is not None else ()),
    ):
        _positive(name, value)
    model_parallel = cfg.tensor_parallel * cfg.pipeline_parallel
    if cfg.world_size % model_parallel != 0:
        raise ValidationError(
            f"world size {cfg.world_size} is not divisible by TP {cfg.tensor_parallel} × PP {cfg.pipeline_parallel}"
            f" = {model_parallel}, so TP·PP·DP cannot equal the world size",
            f"use a world size that is a multiple of {model_parallel}, or change --tensor-parallel/--pipeline-parallel",
        )
    if cfg.num_layers % cfg.pipeline_parallel != 0:
        raise ValidationError(
            f"{cfg.num_layers} layers cannot be split evenly over --pipeline-parallel {cfg.pipeline_parallel}",
            "choose a pipeline-parallel size that divides the number of layers",
        )
    if cfg.num_attention_heads % cfg.tensor_parallel != 0:
        raise ValidationError(
            f"{cfg.num_attention_heads} attention heads cannot be split over --tensor-parallel {cfg.tensor_parallel}",
            "choose a tensor-parallel size that divides the number of heads",
        )
    if cfg.hidden_size % cfg.num_attention_heads != 0:
        raise ValidationError(
            f"--hidden-size {cfg.hidden_size} is not divisible by --num-attention-heads {cfg.num_attention_heads}",
            "make the hidden size a multiple of the head count",
        )
    if (cfg.hidden_size // cfg.num_attention_heads) % 2:  # RoPE rotates pairs of a head's dimensions
        raise ValidationError(
            f"the head dimension --hidden-size {cfg.hidden_size} / --num-attention-heads {cfg.num_attention_heads} = "
            f"{cfg.hidden_size // cfg.num_attention_heads} is odd, and rotary embeddings rotate pairs of dimensions",
            "make the hidden size an even multiple of the head count",
        )
    if cfg.ffn_hidden_size % cfg.tensor_parallel != 0:
        raise ValidationError(
            f"--ffn-hidden-size {cfg.ffn_hidden_size} is not divisible by --tensor-parallel {cfg.tensor_parallel}",
            "choose a tensor-parallel size that divides the FFN size",
        )
    per_step = cfg.micro_batch_size * cfg.data_parallel
    if cfg.global_batch_size % per_step != 0:
        raise ValidationError(
            f"--global-batch-size {cfg.global_batch_size} is not divisible by --micro-batch-size "
            f"{cfg.micro_batch_size} × data-parallel size {cfg.data_parallel} = {per_step}",
            f"use a global batch size that is a multiple of {per_step}, e.g. "
            f"{max(1, cfg.global_batch_size // per_step) * per_step}",
        )
    if cfg.sequence_parallel and cfg.seq_length % cfg.tensor_parallel != 0:
        raise ValidationError(
            f"--seq-length {cfg.seq_length} is not divisible by --tensor-parallel {cfg.tensor_parallel} "
            "(sequence parallel splits the sequence over TP ranks)",
            "use a sequence length divisible by the TP size, or --no-sequence-parallel",
        )
    check_warmup_for_timing(cfg.warmup_iterations, cfg.iterations is not None, cfg.steady_seconds, cfg.device)
    if cfg.exit_duration_mins is not None and cfg.exit_duration_mins <= 0:
        raise ValidationError(
            f"--exit-duration-mins {cfg.exit_duration_mins}", "give a positive number of minutes (or omit it)"
        )
    check_optimizer(cfg)
    check_cuda_graphs(cfg)
    if cfg.data_path is not None:
        check_data_path(cfg.data_path)


def check_optimizer(cfg: TrainConfig) -> None:
    """What argparse's ranges cannot see: values that come from a preset, and pairs that must agree."""
    if cfg.min_lr > cfg.lr:
        raise ValidationError(f"--min-lr {cfg.min_lr:g} is above --lr {cfg.lr:g}: the schedule would decay upwards",
                              "use --min-lr <= --lr (the preset's ratio is 0.1)")
    for name, value in (("--adam-beta1", cfg.adam_beta1), ("--adam-beta2", cfg.adam_beta2),
                        ("--attention-dropout", cfg.attention_dropout), ("--hidden-dropout", cfg.hidden_dropout)):
        if not 0.0 <= value < 1.0:
            raise ValidationError(f"{name} {value:g} is outside [0, 1)", f"pass {name} as a number in [0, 1)")
    for name, value in (("--lr", cfg.lr), ("--adam-eps", cfg.adam_eps)):
        if not value > 0.0:
            raise ValidationError(f"{name} {value:g} is not positive", f"pass {name} > 0")
    if cfg.clip_grad < 0.0:
        raise ValidationError(f"--clip-grad {cfg.clip_grad:g} is negative", "pass --clip-grad >= 0 (0 turns it off)")
    if cfg.lr_warmup_samples >= cfg.lr_decay_samples:  # Megatron's scheduler asserts this
        raise ValidationError(f"--lr-warmup-samples {cfg.lr_warmup_samples} is not below --lr-decay-samples "
                              f"{cfg.lr_decay_samples}: the warm-up would never end",
                              "use fewer warm-up samples than decay samples")


def check_cuda_graphs(cfg: TrainConfig) -> None:
    """What megatron-core's own CUDA graphs cannot take (it would assert deep inside the first step): recompute with
    dropout (graphed layers take no recompute; a graphed step no recomputed attention with attention dropout), too
    few warm-up iterations to record the graphs before the measured window, and the replays of single phases."""
    if cfg.cuda_graphs == "none":
        return
    flag = f"--cuda-graphs {cfg.cuda_graphs}"
    if cfg.cuda_graphs == "layers" and cfg.recompute != "none":
        raise ValidationError(f"{flag} with --recompute {cfg.recompute}: megatron graphs a layer only without "
                              "recompute (full recompute needs a whole-step graph, selective would recompute graphed "
                              "attention with dropout)", "use --recompute none, or --cuda-graphs step with --recompute "
                              "full")
    if cfg.cuda_graphs == "step" and cfg.recompute == "selective" and cfg.attention_dropout > 0:
        raise ValidationError(f"{flag} with --recompute selective and --attention-dropout {cfg.attention_dropout:g}: "
                              "megatron cannot replay recomputed attention's dropout inside a graph",
                              "use --recompute none or full, or --attention-dropout 0")
    needed = CUDA_GRAPH_WARMUP + 2  # eager calls, the recording call, one replay: all before the measured window
    if cfg.warmup_iterations < needed:
        raise ValidationError(f"{flag} with --warmup-iterations {cfg.warmup_iterations}: megatron runs "
                              f"{CUDA_GRAPH_WARMUP} eager steps, then records the graphs, which would land in the "
                              "measured window", f"give --warmup-iterations {needed} or more")
    if cfg.cuda_graphs == "step" and cfg.replay_phases_s:
        raise ValidationError(f"{flag} with --replay-phases: the step replays as one graph, so forward, backward "
                              "and the optimizer cannot run alone", "use --cuda-graphs layers or none to replay phases")


def check_data_path(prefix: str) -> None:
    missing = [p for p in (Path(prefix + ".bin"), Path(prefix + ".idx")) if not p.is_file()]
    if missing:
        raise ValidationError(
            f"--data-path {prefix!r}: {', '.join(str(p) for p in missing)} not found",
            "pass the dataset prefix without extension (files PREFIX.bin and PREFIX.idx), made with "
            "`python -m llm_training preprocess`, or omit --data-path for mock data",
        )


def check_precision(precision: str, device_type: str, cuda_capability: tuple[int, int] | None = None,
                    is_rocm: bool = False) -> None:
    """bf16 needs compute capability 8.0+ on NVIDIA; fp16/fp32 run everywhere (CPU included, slowly)."""
    if precision == "bf16" and device_type == "cuda" and not is_rocm and cuda_capability is not None \
            and cuda_capability < (8, 0):
        major, minor = cuda_capability
        raise ValidationError(
            f"--precision bf16 on a GPU of compute capability {major}.{minor} (bf16 needs 8.0 or newer)",
            "use --precision fp16",
        )


def check_attention_backend(backend: str, device_type: str) -> None:
    """cuDNN and memory-efficient SDPA kernels exist only on GPUs; pinning one on the CPU cannot run."""
    if device_type == "cpu" and backend in ("cudnn", "efficient"):
        raise ValidationError(
            f"--attention-backend {backend} on the CPU (that SDPA kernel is GPU-only)",
            "use --attention-backend auto, math or flash on the CPU",
        )


def check_on_device(cfg: TrainConfig, device_type: str, ranks_per_node: int, device_memory_gib: float | None,
                    cuda_capability: tuple[int, int] | None = None, is_rocm: bool = False) -> None:
    """Every check of a configuration on the device it runs on, the one implementation of `validate` and of `train`
    (which calls it once torch has chosen the device): precision and attention kernels, and memory: on the CPU the
    estimate is host memory, once per rank on the node (refused where the kernel would kill the run mid-way); on a
    GPU the device's, where it is known. `validate --device auto` (JUBE's default) resolves the device as the run
    does on this host, so that a CPU run is held to the host's memory there too."""
    from joulebench.host_memory import available_gib
    from llm_training import memory

    check_precision(cfg.precision, device_type, cuda_capability, is_rocm)
    check_attention_backend(cfg.attention_backend, device_type)
    if cfg.cuda_graphs != "none" and device_type != "cuda":
        raise ValidationError(f"--cuda-graphs {cfg.cuda_graphs} on the {device_type}: CUDA graphs record GPU work",
                              "use --cuda-graphs none (the default) off GPUs")
    if cfg.cuda_graphs != "none" and "expandable_segments:True" in os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "") \
            and os.environ.get("NCCL_GRAPH_REGISTER") != "0":
        raise ValidationError(f"--cuda-graphs {cfg.cuda_graphs} with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
                              ": megatron refuses it before Blackwell (illegal memory access in NCCL)",
                              "export NCCL_GRAPH_REGISTER=0, or drop expandable_segments")
    if cfg.compile_cache is not None and not cfg.compiles(device_type):
        raise ValidationError(f"--compile-cache {cfg.compile_cache} but nothing is compiled on the {device_type} "
                              "(bias, RoPE and cross-entropy fusions off)",
                              "drop --compile-cache, or turn a fusion on (e.g. --rope-fusion)")
    if device_type == "cpu":
        memory.check_host(cfg, ranks_per_node, available_gib())
    memory.check_fit(cfg, device_memory_gib)
