"""Checks run before any device work (and by `python -m llm_inference validate` before submission).

Every failure is a jpwr.errors.ValidationError naming the offending value and the fix.
"""

from __future__ import annotations

import json
from pathlib import Path

from jpwr import ValidationError
from llm_inference import memory
from llm_inference.config import InferenceConfig
from llm_inference.presets import PRESETS, ModelPreset, preset_from_checkpoint
from llm_inference.tasks import TASKS, longest_sequence


def model_shape(cfg: InferenceConfig) -> ModelPreset:
    """The preset's shape, or the local checkpoint's (read from its config.json, no transformers needed)."""
    if cfg.checkpoint is not None:
        config_file = Path(cfg.checkpoint) / "config.json"
        if not config_file.is_file():
            raise ValidationError(f"--checkpoint {cfg.checkpoint!r} has no config.json",
                                  "pass a Hugging Face checkpoint directory (config.json and weights), "
                                  "or leave --checkpoint out to use a preset with random weights")
        try:
            return preset_from_checkpoint(json.loads(config_file.read_text()), Path(cfg.checkpoint).name)
        except (KeyError, ValueError, TypeError) as exc:
            raise ValidationError(f"{config_file} does not describe a Llama- or GPT-2-style model ({exc!r})",
                                  "use a decoder-only checkpoint of those families, or a preset") from exc
    if cfg.preset not in PRESETS:
        raise ValidationError(f"unknown preset --preset {cfg.preset!r}", f"use one of {', '.join(PRESETS)}")
    return PRESETS[cfg.preset]


def resolve_precision(precision: str, device_type: str) -> str:
    """auto: bf16 on GPUs (what inference servers run), fp32 on CPUs (bf16 matmuls are slow there)."""
    if precision != "auto":
        return precision
    return "bf16" if device_type == "cuda" else "fp32"


def check_config(cfg: InferenceConfig) -> ModelPreset:
    """Names, numbers and position limits; returns the model shape. Memory is checked per device."""
    shape = model_shape(cfg)
    if not cfg.tasks:
        raise ValidationError("no task given (--task is empty)", f"use one or more of {', '.join(TASKS)}")
    for task in cfg.tasks:
        if task not in TASKS:
            raise ValidationError(f"unknown task --task {task!r}", f"use one of {', '.join(TASKS)}")
    if not cfg.batch_sizes or any(size <= 0 for size in cfg.batch_sizes):
        raise ValidationError(f"batch sizes {list(cfg.batch_sizes)} include a value below 1 (or none)",
                              "give positive batch sizes, e.g. --batch-sizes 1,2,4,8")
    for name, value, lowest in (("--num-batches", cfg.num_batches, 1), ("--warmup-batches", cfg.warmup_batches, 0)):
        if value < lowest:
            raise ValidationError(f"{name} is {value}", f"set {name} to at least {lowest}")
    if cfg.engine == "static" and cfg.attention != "sdpa":
        raise ValidationError(f"--attention {cfg.attention} selects a transformers attention implementation, which "
                              "the static engine does not use (it runs SDPA on its own KV cache)",
                              "leave --attention out, or use --engine hf")
    if cfg.output_length is not None and cfg.output_length < 1:
        raise ValidationError(f"--output-length is {cfg.output_length}", "force at least one new token")
    for task in cfg.tasks:
        needed = longest_sequence(TASKS[task], cfg.output_length)
        if needed > shape.max_positions:
            raise ValidationError(
                f"task {task!r} needs up to {needed} positions (longest prompt + output) but {shape.name} "
                f"has {shape.max_positions}",
                "pick a task with shorter prompts, a smaller --output-length, or a model with more positions")
    return shape


def check_memory(cfg: InferenceConfig, shape: ModelPreset, precision: str, memory_gib: float | None) -> None:
    """Refuse a batch size whose estimate exceeds the device memory (unknown memory: no check)."""
    if memory_gib is None:
        return
    for task_name in cfg.tasks:
        task = TASKS[task_name]
        prompt, sequence = task.input_length.high, longest_sequence(task, cfg.output_length)
        for size in cfg.batch_sizes:
            estimate = memory.estimate_memory(shape, precision, size, prompt, sequence, cfg.engine)
            if estimate.total_gib > memory_gib:
                fits = memory.largest_fitting_batch(shape, precision, prompt, sequence, memory_gib, cfg.engine)
                raise ValidationError(
                    f"batch size {size} of task {task_name!r} on {shape.name} ({precision}, engine {cfg.engine}) "
                    f"needs an estimated {estimate.total_gib:.1f} GiB (weights {estimate.weights_gib:.1f}, KV "
                    f"cache {estimate.kv_cache_gib:.1f}, activations {estimate.activations_gib:.1f}, CUDA graphs "
                    f"{estimate.graphs_gib:.1f}) but the device has {memory_gib:.1f} GiB",
                    f"use batch sizes up to {fits}" if fits else "use a smaller model or lower precision")


def check_launch(world_size: int, points: int, external_sampler: bool) -> None:
    """One process on one device; a sweep needs window names of its own, so not under one shared sampler."""
    if world_size != 1:
        raise ValidationError(f"llm_inference started as {world_size} processes",
                              "run one process per device (no torchrun/srun -n>1); sweep configurations as jobs")
    if external_sampler and points > 1:
        raise ValidationError(
            f"{points} (task, batch size) points under one external jpwr sampler would merge their "
            "same-named windows",
            "run one point per job under `jpwr serve`/`jpwr --`, or meter in-process with --energy-methods")
