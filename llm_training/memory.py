"""Memory-fit estimate per device, to warn before launch when a configuration will not fit.

A first-order model (Korthikanti et al. 2022, arXiv 2205.05198, with flash-style attention that
never stores s×s scores), meant to catch configurations off by large factors, not to predict the
allocator's peak to the last GiB:

* weights: 2 B/param in bf16/fp16, 4 B in fp32; gradients 4 B/param (reduced in fp32);
  Adam with the distributed optimizer: fp32 master copy (half precision only) + two moments, split over DP;
* activations per layer and micro-batch: s·b·h·(10 + 24/t) bytes (34/t with sequence parallel),
  2·s·b·h with full recompute; half again as many bytes in fp32; the first pipeline stage holds
  min(PP, micro-batches) micro-batches in flight (1F1B);
* logits on the last stage: s·b·V/t elements at 8 B (fp32 logits and their gradient);
* +10 % and 1.5 GiB for the CUDA context, workspaces and fragmentation.

The same estimate picks the default profile's micro-batch size on a GPU (`choose_micro_batch`).
"""

from __future__ import annotations

import dataclasses

from joulebench.host_memory import HOST
from jpwr import ValidationError
from llm_training.config import MBS_FROM_PRESET, TrainConfig, settings_for
from llm_training.flops import parameter_count

GIB = 1024**3
CONTEXT_OVERHEAD_GIB = 1.5
FRAGMENTATION = 1.10
# The MBS chosen by memory must have an estimate within this share of the device memory. The estimate already
# carries the +10 % and 1.5 GiB above and overshot the measured peaks of GPT-800M on one H100 80GB (79.6 GiB) by
# ~16 % (MBS 8: 43.7 GiB estimated, 37.5 measured; MBS 16: 69.2 and 59.8); the 10 % left is for what it does not
# count (NCCL buffers, another process on the GPU). At 85 % that H100 would not get MBS 16 (69.2 > 67.7 GiB).
MBS_MEMORY_SHARE = 0.90


@dataclasses.dataclass(frozen=True)
class MemoryEstimate:
    """Estimated bytes on the most loaded device, by kind (GiB)."""

    weights_gib: float
    gradients_gib: float
    optimizer_gib: float
    activations_gib: float
    logits_gib: float

    @property
    def total_gib(self) -> float:
        parts = self.weights_gib + self.gradients_gib + self.optimizer_gib + self.activations_gib + self.logits_gib
        return parts * FRAGMENTATION + CONTEXT_OVERHEAD_GIB


def estimate_memory(cfg: TrainConfig) -> MemoryEstimate:
    t, p, d = cfg.tensor_parallel, cfg.pipeline_parallel, max(cfg.data_parallel, 1)
    h, s, b = cfg.hidden_size, cfg.seq_length, cfg.micro_batch_size
    embedding = cfg.padded_vocab_size * h
    layers_params = parameter_count(cfg.shape, cfg.padded_vocab_size) - embedding
    params = layers_params / (p * t) + embedding / t
    half = cfg.precision in ("bf16", "fp16")
    weights = params * (2 if half else 4)
    gradients = params * 4
    optimizer = params * (12 if half else 8) / d
    if cfg.recompute == "full":
        per_layer = 2.0 * s * b * h / (t if cfg.sequence_parallel else 1)
    else:
        per_layer = s * b * h * (34.0 / t if cfg.sequence_parallel else 10.0 + 24.0 / t)
    if not half:
        per_layer *= 1.5
    activations = per_layer * (cfg.num_layers / p) * cfg.micro_batches_in_flight
    logits = s * b * cfg.padded_vocab_size / t * 8.0
    return MemoryEstimate(weights / GIB, gradients / GIB, optimizer / GIB, activations / GIB, logits / GIB)


def choose_micro_batch(cfg: TrainConfig, device_memory_gib: float | None) -> TrainConfig:
    """The profile's MBS doubled while the global batch per replica stays a whole number of micro-batches, the
    estimate fits MBS_MEMORY_SHARE of the device memory and the preset's max_micro_batch_size allows; the GBS is
    kept (fewer micro-batches). Only an MBS from the preset changes (--micro-batch-size wins) and only where the
    device memory is known (None: CPU, or `validate` without --device-memory-gib). `micro_batch_size_from` says
    why."""
    cap = settings_for(cfg.model, cfg.profile == "caraml").max_micro_batch_size
    if cfg.micro_batch_size_from != MBS_FROM_PRESET or cap is None:
        return cfg
    if device_memory_gib is None:
        return dataclasses.replace(cfg, micro_batch_size_from=f"{MBS_FROM_PRESET}: no device memory to choose by")
    limit = device_memory_gib * MBS_MEMORY_SHARE
    chosen, chosen_gib = cfg, estimate_memory(cfg).total_gib
    per_replica = cfg.global_batch_size // max(cfg.data_parallel, 1)
    stop = f"MBS cap {cap}"
    while chosen.micro_batch_size * 2 <= cap:
        mbs = chosen.micro_batch_size * 2
        if per_replica % mbs:
            stop = f"MBS {mbs} does not divide the {per_replica} samples per replica"
            break
        bigger = dataclasses.replace(cfg, micro_batch_size=mbs)
        gib = estimate_memory(bigger).total_gib
        if gib > limit:
            stop = f"MBS {mbs} would need {gib:.1f} GiB > {MBS_MEMORY_SHARE:.0%} ({limit:.1f} GiB)"
            break
        chosen, chosen_gib = bigger, gib
    how = "chosen by memory" if chosen is not cfg else f"{MBS_FROM_PRESET}, kept by memory"
    return dataclasses.replace(chosen, micro_batch_size_from=(
        f"{how}: estimate {chosen_gib:.1f} GiB of {device_memory_gib:.1f} GiB; {stop}"))


def fit_warning(cfg: TrainConfig, device_memory_gib: float | None) -> str | None:
    """A warning line when the estimate exceeds the device memory, else None (also when memory is unknown)."""
    if device_memory_gib is None:
        return None
    est = estimate_memory(cfg)
    if est.total_gib <= device_memory_gib:
        return None
    return (
        f"WARNING: {cfg.model} with TP={cfg.tensor_parallel} PP={cfg.pipeline_parallel} DP={cfg.data_parallel} "
        f"MBS={cfg.micro_batch_size} {cfg.precision} recompute={cfg.recompute} needs about {est.total_gib:.1f} GiB "
        f"per device (weights {est.weights_gib:.1f}, gradients {est.gradients_gib:.1f}, optimizer "
        f"{est.optimizer_gib:.1f}, activations {est.activations_gib:.1f}, logits {est.logits_gib:.1f}) but the "
        f"device has {device_memory_gib:.1f} GiB: lower --micro-batch-size, use --recompute full, or raise "
        "--tensor-parallel/--pipeline-parallel"
    )


def check_host(cfg: TrainConfig, ranks_per_node: int, available_gib: float | None) -> None:
    """On the CPU the estimate is host memory, once per rank on the node: refuse a run the kernel would kill
    mid-way (unknown availability: no check)."""
    per_rank = estimate_memory(cfg).total_gib
    need = per_rank * ranks_per_node
    if available_gib is None or need <= available_gib:
        return
    ranks = f" ({ranks_per_node} ranks × {per_rank:.1f} GiB)" if ranks_per_node > 1 else ""
    raise ValidationError(
        f"{cfg.model} (MBS {cfg.micro_batch_size}, sequence {cfg.seq_length}, {cfg.precision}) needs an estimated "
        f"{need:.1f} GiB{ranks} on the CPU but {HOST} has {available_gib:.1f} GiB",
        "use a smaller --model, --micro-batch-size or --seq-length, or fewer ranks per node")
