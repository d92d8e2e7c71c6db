"""Memory-fit estimate per device, to warn before launch when a configuration will not fit.

A first-order model (Korthikanti et al. 2022, arXiv 2205.05198, with flash-style attention that
never stores s×s scores), meant to catch configurations off by large factors, not to predict the
allocator's peak to the last GiB:

* weights: 2 B/param in bf16/fp16, 4 B in fp32; gradients 4 B/param (reduced in fp32);
  Adam with the distributed optimizer: fp32 master copy (half precision only) + two moments, split over DP;
* activations per layer and micro-batch: s·b·h·(10 + 24/t) bytes (34/t with sequence parallel),
  2·s·b·h with full recompute; half again as many bytes in fp32; selective recompute counts as none: megatron
  recomputes only core attention, and Korthikanti's saving there (the 5·a·s/h score-matrix term) is what
  flash/cuDNN SDPA never stores (SELECTIVE_NOTE); the first pipeline stage holds
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
from llm_training.presets import padded_vocab_size

GIB = 1024**3
CONTEXT_OVERHEAD_GIB = 1.5
FRAGMENTATION = 1.10
# The MBS chosen by memory must have an estimate within this share of the device memory. The estimate already
# carries the +10 % and 1.5 GiB above and overshot the measured peaks of GPT-800M on one H100 80GB (79.6 GiB) by
# ~16 % (MBS 8: 43.7 GiB estimated, 37.5 measured; MBS 16: 69.2 and 59.8); the 10 % left is for what it does not
# count (NCCL buffers, another process on the GPU). At 85 % that H100 would not get MBS 16 (69.2 > 67.7 GiB).
MBS_MEMORY_SHARE = 0.90
# (estimate, measured peak allocated) in GiB of the runs above. `validate --device-memory-gib` refuses only where even
# the estimate less its largest measured overshoot exceeds the device (800M MBS 8 runs on 40 GB cards though its
# estimate is 43.7 GiB); between that and the estimate it warns. Measured on 800M only: 13B's peaks are not yet.
MEASURED_ESTIMATES_AND_PEAKS = ((43.7, 37.5), (69.2, 59.8))
ESTIMATE_OVER_PEAK = max(estimate / peak for estimate, peak in MEASURED_ESTIMATES_AND_PEAKS)


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


def _layout(cfg: TrainConfig) -> str:
    return (f"{cfg.model} with TP={cfg.tensor_parallel} PP={cfg.pipeline_parallel} DP={cfg.data_parallel} "
            f"MBS={cfg.micro_batch_size} {cfg.precision} recompute={cfg.recompute}")


def _need(cfg: TrainConfig, device_memory_gib: float) -> str:
    """The estimate by kind against the capacity: both numbers, so a refusal can be checked by hand."""
    est = estimate_memory(cfg)
    return (f"{_layout(cfg)} needs about {est.total_gib:.1f} GiB per device (weights {est.weights_gib:.1f}, "
            f"gradients {est.gradients_gib:.1f}, optimizer {est.optimizer_gib:.1f}, activations "
            f"{est.activations_gib:.1f}, logits {est.logits_gib:.1f}) but the device has {device_memory_gib:.1f} GiB")


def _fits(cfg: TrainConfig, device_memory_gib: float) -> bool:
    return estimate_memory(cfg).total_gib <= device_memory_gib


LAYOUTS_NAMED = 3  # a refusal names at most this many layouts that fit, those that keep the most data parallelism


def _layouts_that_fit(cfg: TrainConfig, device_memory_gib: float) -> list[str]:
    """Other TP × PP splits of the same devices (heads, FFN and layers divide evenly) that fit by the estimate, the
    smallest model-parallel size (the most data parallelism) first, at most LAYOUTS_NAMED."""
    fitting: list[tuple[int, int, str]] = []
    world = cfg.world_size
    for tp in (n for n in range(1, world + 1) if world % n == 0):
        for pp in (n for n in range(1, world // tp + 1) if world // tp % n == 0):
            dp = world // (tp * pp)
            if (cfg.num_attention_heads % tp or cfg.ffn_hidden_size % tp
                    or cfg.num_layers % pp or cfg.global_batch_size % (cfg.micro_batch_size * dp)
                    or (tp, pp) == (cfg.tensor_parallel, cfg.pipeline_parallel)):
                continue
            other = dataclasses.replace(cfg, tensor_parallel=tp, pipeline_parallel=pp, data_parallel=dp,
                                        padded_vocab_size=padded_vocab_size(cfg.vocab_size, tp),
                                        sequence_parallel=cfg.sequence_parallel and tp > 1)
            if _fits(other, device_memory_gib):
                fitting.append((tp * pp, pp, f"--tensor-parallel {tp} --pipeline-parallel {pp} "
                                f"({estimate_memory(other).total_gib:.1f} GiB)"))
    return [text for _, _, text in sorted(fitting)[:LAYOUTS_NAMED]]


def _largest_mbs_that_fits(cfg: TrainConfig, device_memory_gib: float) -> TrainConfig | None:
    """The largest MBS below the asked one that divides the samples per replica (the GBS stays) and fits."""
    per_replica = cfg.global_batch_size // max(cfg.data_parallel, 1)
    for mbs in range(cfg.micro_batch_size - 1, 0, -1):
        smaller = dataclasses.replace(cfg, micro_batch_size=mbs)
        if per_replica % mbs == 0 and _fits(smaller, device_memory_gib):
            return smaller
    return None


def _option(cfg: TrainConfig, *flags: str) -> str:
    return f"{' '.join(flags)} (estimate {estimate_memory(cfg).total_gib:.1f} GiB)"


# Why --recompute selective is never offered: megatron recomputes only core attention, and SDPA (flash, cuDNN) keeps
# no s×s score matrix, so little is saved (its output, ~2·s·b·h bytes per layer, which the estimate does not count).
SELECTIVE_NOTE = ("--recompute selective recomputes only core attention, whose SDPA kernels store no score matrix: "
                  "it saves almost nothing here")


def fit_fix(cfg: TrainConfig, device_memory_gib: float) -> str:
    """The levers that fit by the estimate: the largest smaller MBS (the GBS kept), and full recompute where it makes
    the asked MBS fit; else the largest MBS that fits with full recompute; else another TP × PP split of the same
    devices; none of them: more devices (the weights, gradients and optimizer state alone are too large)."""
    smaller = _largest_mbs_that_fits(cfg, device_memory_gib)
    full = dataclasses.replace(cfg, recompute="full") if cfg.recompute != "full" else None
    levers = [_option(smaller, f"--micro-batch-size {smaller.micro_batch_size}")] if smaller else []
    if full is not None and _fits(full, device_memory_gib):
        levers.append(_option(full, "--recompute full") + f" to keep MBS {cfg.micro_batch_size} (slower: every "
                      "layer's forward runs twice)")
    elif full is not None and not smaller and (both := _largest_mbs_that_fits(full, device_memory_gib)):
        levers.append(_option(both, f"--micro-batch-size {both.micro_batch_size}", "--recompute full"))
    note = f"; {SELECTIVE_NOTE}" if cfg.recompute == "selective" else ""
    if levers:
        return "use " + ", or ".join(levers) + note
    layouts = _layouts_that_fit(cfg, device_memory_gib)
    if layouts:
        return f"no MBS or recompute change fits; on these {cfg.world_size} devices use " + " or ".join(layouts) + note
    return (f"no MBS, recompute or TP × PP split of {cfg.world_size} devices fits by the estimate: use more devices "
            "(raise --tensor-parallel/--pipeline-parallel with the world size) or devices with more memory")


def fit_warning(cfg: TrainConfig, device_memory_gib: float | None) -> str | None:
    """A warning line when the estimate exceeds the device memory, else None (also when memory is unknown). The run
    itself only warns: the estimate is first-order (it overshot 800M's measured peaks by ~16 %)."""
    if device_memory_gib is None or _fits(cfg, device_memory_gib):
        return None
    return f"WARNING: {_need(cfg, device_memory_gib)}: {fit_fix(cfg, device_memory_gib)}"


def check_fit(cfg: TrainConfig, device_memory_gib: float | None) -> None:
    """`validate --device-memory-gib N`: refuse, before anything is submitted, a layout that cannot fit even if the
    estimate overshoots as much as measured, naming the estimate, the capacity and a change that fits (unknown
    memory: no check; a smaller excess only warns, fit_warning)."""
    if device_memory_gib is None:
        return
    lowest = estimate_memory(cfg).total_gib / ESTIMATE_OVER_PEAK
    if lowest > device_memory_gib:
        raise ValidationError(
            f"refused by the memory estimate: {_need(cfg, device_memory_gib)}, and even less the estimate's largest "
            f"measured overshoot ({ESTIMATE_OVER_PEAK:.2f}x) it is {lowest:.1f} GiB", fit_fix(cfg, device_memory_gib))


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
