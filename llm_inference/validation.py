"""Checks run before any device work (and by `python -m llm_inference validate` before submission).

Every failure is a jpwr.errors.ValidationError naming the offending value and the fix.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
from collections.abc import Callable
from pathlib import Path

from joulebench.sizing import MIN_SECONDS
from jpwr import ValidationError
from llm_inference import memory
from llm_inference.arrivals import Request, check_context, load_trace
from llm_inference.config import CPU_WINDOW_S, InferenceConfig
from llm_inference.decode_choice import DECODE_TUNINGS
from llm_inference.load_config import LoadConfig, counted_requests, rate_label
from llm_inference.presets import PRESETS, ModelPreset, preset_from_checkpoint
from llm_inference.tasks import TASKS, Task, batches_extent, draw_batches, longest_sequence


def model_shape(cfg: InferenceConfig | LoadConfig) -> ModelPreset:
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
    if cfg.engine == "hf" and cfg.decode_tuning != "auto":
        raise ValidationError(f"--decode-tuning {cfg.decode_tuning} chooses a compiled variant of the static "
                              "engine's decode step; --engine hf runs transformers' generate",
                              "leave --decode-tuning out, or use --engine static")
    _check_objective(cfg)
    if cfg.output_length is not None and cfg.output_length < 1:
        raise ValidationError(f"--output-length is {cfg.output_length}", "force at least one new token")
    for task in cfg.tasks:
        check_task_context(task, cfg.output_length, shape)
    if cfg.tensor_parallel > 1 and cfg.engine == "hf":
        raise ValidationError(f"--tensor-parallel {cfg.tensor_parallel} with --engine hf (transformers' generate runs "
                              "on one device)", "use --engine static (the default) for tensor parallelism")
    check_tensor_parallel(cfg.tensor_parallel, shape, cfg.energy_methods)
    return shape


def check_tensor_parallel(ranks: int, shape: ModelPreset, energy_methods: str | None) -> None:
    """The model's heads, KV heads and MLP columns split evenly over `ranks` (each rank holds whole KV heads with
    their query heads); several ranks are metered by the node's sampler, not in-process."""
    if ranks == 1:
        return
    for what, count in (("attention heads", shape.num_attention_heads), ("KV heads", shape.num_key_value_heads),
                        ("MLP columns", shape.intermediate_size)):
        if count % ranks:
            fits = [n for n in range(1, shape.num_key_value_heads + 1)
                    if not (shape.num_key_value_heads % n or shape.num_attention_heads % n
                            or shape.intermediate_size % n)]
            raise ValidationError(f"--tensor-parallel {ranks} does not divide the {count} {what} of {shape.name}",
                                  f"use --tensor-parallel {' or '.join(map(str, fits))}")
    if energy_methods:
        raise ValidationError(f"--energy-methods {energy_methods} with --tensor-parallel {ranks} (an in-process "
                              "sampler per rank would meter the node's GPUs once per rank)",
                              "meter the node once: `jpwr -- torchrun ...` or `jpwr serve` in the job script")


def check_node_devices(ranks: int, visible: int) -> None:
    """Tensor-parallel ranks fill the node's GPUs in equal groups (a job on part of a node gets its GPUs through
    CUDA_VISIBLE_DEVICES): N must divide the GPUs the node shows this job."""
    if visible % ranks or visible < ranks:
        raise ValidationError(f"--tensor-parallel {ranks} does not divide the {visible} GPU(s) this node shows",
                              f"use a --tensor-parallel that divides {visible}, or set CUDA_VISIBLE_DEVICES to "
                              f"{ranks} GPUs")


def check_decode_device(tuning: str, device_type: str) -> None:
    """A fused decode variant runs Triton kernels on a CUDA GPU (llm_inference/fused_decode.py): refused elsewhere, on
    the device the run resolves to, before the model is built."""
    variant = DECODE_TUNINGS.get(tuning)
    if variant is None or not variant.fused:
        return
    if device_type != "cuda":
        raise ValidationError(f"--decode-tuning {tuning} runs Triton kernels on a CUDA GPU, not on {device_type}",
                              "run it on a GPU, or leave --decode-tuning out")
    if importlib.util.find_spec("triton") is None:
        raise ValidationError(f"--decode-tuning {tuning} runs Triton kernels, and Triton is not installed",
                              "install torch's CUDA build (it brings Triton) or `pip install triton`")


def _check_objective(cfg: InferenceConfig) -> None:
    """--objective ranks the static engine's variants under --decode-tuning auto: nothing to rank otherwise."""
    if cfg.objective is None:
        return
    if cfg.engine == "hf":
        raise ValidationError(f"--objective {cfg.objective} ranks the static engine's compiled decode variants; "
                              "--engine hf runs transformers' generate",
                              "leave --objective out, or use --engine static")
    if cfg.decode_tuning != "auto":
        raise ValidationError(f"--objective {cfg.objective} and --decode-tuning {cfg.decode_tuning} conflict: the "
                              "objective chooses the variant, the pinned tuning overrides that choice",
                              f"keep one: --decode-tuning {cfg.decode_tuning} alone, or --objective {cfg.objective} "
                              "(with --decode-tuning auto)")


def check_objective_sensor(cfg: InferenceConfig, external_sampler: bool) -> None:
    """At the run's start (a JUBE validate step runs before the job's sampler exists): `--objective energy|edp`
    ranks the variants by the power a sampler measures; without one it would silently choose by speed."""
    if cfg.objective not in (None, "speed") and not (cfg.energy_methods or external_sampler):
        raise ValidationError(f"--objective {cfg.objective} ranks the decode variants by their measured power, and "
                              "this run has no jpwr sampler (it would choose by speed)",
                              "pass --energy-methods (e.g. nvml), or run under `jpwr -- ...` (validate: "
                              "--external-sampler)")


def check_task_context(task: str, output_length: int | None, shape: ModelPreset) -> None:
    """The task's longest request (prompt + output) within the model's positions (`run` and `load`)."""
    needed = longest_sequence(TASKS[task], output_length)
    if needed > shape.max_positions:
        raise ValidationError(
            f"task {task!r} needs up to {needed} positions (longest prompt + output) but {shape.name} "
            f"has {shape.max_positions}",
            "pick a task with shorter prompts, a smaller --output-length, or a model with more positions")


def check_memory(cfg: InferenceConfig, shape: ModelPreset, precision: str, memory_gib: float | None,
                 holder: str = "the device") -> None:
    """Refuse a batch size whose estimate exceeds the memory `holder` has (unknown memory: no check)."""
    if memory_gib is None:
        return
    for size in cfg.batch_sizes:
        estimate = run_estimate(cfg, shape, precision, size)
        if estimate.total_gib > memory_gib:
            fits = memory.largest_fitting_batch(lambda n: run_estimate(cfg, shape, precision, n).total_gib,
                                                memory_gib)
            tasks = ", ".join(repr(task) for task in cfg.tasks)
            raise ValidationError(
                f"batch size {size} of task{'s' if len(cfg.tasks) > 1 else ''} {tasks} on {shape.name} ({precision}, "
                f"engine {cfg.engine}) needs an estimated {estimate.total_gib:.1f} GiB (weights "
                f"{estimate.weights_gib:.1f}, KV cache {estimate.kv_cache_gib:.1f}, activations "
                f"{estimate.activations_gib:.1f}, CUDA graphs {estimate.graphs_gib:.1f}) but {holder} has "
                f"{memory_gib:.1f} GiB",
                f"use batch sizes up to {fits}" if fits else
                "use a smaller model or lower precision, or split the model over GPUs with --tensor-parallel N")


DRAWN_EXTENT_LIMIT = 1 << 20  # prompts drawn for a run's estimate; more: the task's longest prompt and output


def run_estimate(cfg: InferenceConfig, shape: ModelPreset, precision: str, size: int) -> memory.MemoryEstimate:
    """The memory estimate of a `run` batch size, sized by the batches the run will draw (same seed, same
    lengths), part by part the largest over the run's tasks: the engine keeps one task's larger cache while the
    next task's prefill runs."""
    def extent(task: Task) -> tuple[int, int]:
        if size * cfg.num_batches > DRAWN_EXTENT_LIMIT:  # drawing them would take long; their maxima near these
            return task.input_length.high, longest_sequence(task, cfg.output_length)
        return batches_extent(draw_batches(task, size, cfg.num_batches, cfg.seed, cfg.output_length))

    estimates = [memory.estimate_memory(shape, precision, size, *extent(TASKS[task]), cfg.engine, cfg.tensor_parallel)
                 for task in cfg.tasks]
    return memory.MemoryEstimate(**{field.name: max(getattr(e, field.name) for e in estimates)
                                    for field in dataclasses.fields(memory.MemoryEstimate)})


def check_launch(world_size: int, points: int, external_sampler: bool, tensor_parallel: int = 1,
                 nodes: int = 1) -> None:
    """One process per device: one, or one per tensor-parallel rank on one node; a sweep needs window names of its
    own, so not under one shared sampler."""
    if world_size != tensor_parallel:
        fix = (f"start {tensor_parallel} processes for --tensor-parallel {tensor_parallel}: torchrun "
               f"--nproc-per-node {tensor_parallel} -m llm_inference ..." if tensor_parallel > 1 else
               "run one process per device (no torchrun/srun -n>1), or pass --tensor-parallel N with N processes; "
               "sweep configurations as jobs")
        raise ValidationError(f"llm_inference started as {world_size} processes with --tensor-parallel "
                              f"{tensor_parallel}", fix)
    if nodes > 1:
        raise ValidationError(f"--tensor-parallel {tensor_parallel} over {nodes} nodes (every layer all-reduces "
                              "twice per token: the ranks must share a node)", "run the ranks on one node")
    if external_sampler and points > 1:
        raise ValidationError(
            f"{points} points (task and batch size, or rate) under one external jpwr sampler would merge their "
            "same-named windows",
            "run one point per job under `jpwr serve`/`jpwr --`, or meter in-process with --energy-methods")


# ---- `load` ----------------------------------------------------------------------------------------------
def check_load_config(cfg: LoadConfig) -> tuple[ModelPreset, list[Request] | None]:
    """Rates or a trace (not both), SLOs, rows and the longest request against the model's context; returns the
    model shape and the trace's requests (read once here: the memory check and the load use them)."""
    shape = model_shape(cfg)
    if cfg.trace is not None and cfg.rates:
        raise ValidationError("--trace and --rate/--rates both given (a trace's arrivals are its own)",
                              "leave --rate/--rates out to replay the trace, or drop --trace")
    if cfg.trace is None and not cfg.rates:
        raise ValidationError("no load given", "pass --rate R (requests/s, or max), --rates 1,2,4,max or --trace FILE")
    for rate in cfg.rates:
        if not rate > 0 or math.isnan(rate):
            raise ValidationError(f"rate {rate} is not a positive number of requests/s",
                                  "use --rate with a positive number, or max")
    for name, value in (("--slo-ttft-ms", cfg.slo_ttft_ms), ("--slo-tpot-ms", cfg.slo_tpot_ms)):
        if value is not None and not (value > 0 and math.isfinite(value)):
            raise ValidationError(f"{name} is {value}", f"give {name} as a positive number of milliseconds")
    if cfg.max_concurrency < 1:
        raise ValidationError(f"--max-concurrency is {cfg.max_concurrency}",
                              "use at least 1 (rows: the requests decoded together at most)")
    if cfg.server is not None and cfg.tensor_parallel > 1:
        raise ValidationError(f"--tensor-parallel {cfg.tensor_parallel} with a server target (it splits the "
                              "in-process engine)", "give the server its own tensor-parallel option in "
                                                    "--server-command, and leave --tensor-parallel out")
    check_tensor_parallel(cfg.tensor_parallel, shape, cfg.energy_methods)
    check_server(cfg)
    trace = None if cfg.trace is None else load_trace(cfg.trace, tokenizer(cfg), shape.vocab_size)
    if trace is None:
        check_task_context(cfg.task, cfg.output_length, shape)
    else:
        check_context(trace, shape.max_positions, shape.name)
    check_duration(cfg, trace)
    check_window_opens(cfg, trace)
    return shape, trace


def check_window_opens(cfg: LoadConfig, trace: list[Request] | None) -> None:
    """Refuse a load whose window can never open, which the run would meet only at its end (FAILED, NO_WINDOW): at
    `max` the window opens once every row is busy after the warm-up, so fewer counted requests than rows never
    open it; a trace needs a counted request after its warm-up ones."""
    if trace is not None:
        warmup = cfg.warmup_requests or 0
        if warmup >= len(trace):
            raise ValidationError(f"--trace {cfg.trace} has {len(trace)} requests and --warmup-requests {warmup} takes "
                                  "them all: no counted request opens the window",
                                  "lower --warmup-requests below the trace's requests, or replay a longer trace")
        return
    if cfg.requests is not None and cfg.requests < cfg.max_concurrency and any(math.isinf(r) for r in cfg.rates):
        raise ValidationError(f"--requests {cfg.requests} at --rate max never keeps the {cfg.max_concurrency} rows "
                              "busy at once after the warm-up: the window would never open",
                              f"raise --requests to at least {cfg.max_concurrency}, or lower --max-concurrency to "
                              f"{cfg.requests} or fewer")


def check_duration(cfg: LoadConfig, trace: list[Request] | None) -> None:
    """Refuse a load whose arrivals alone outlast --exit-duration-mins: the run would stop before its window closed
    (a very low rate waits minutes between arrivals). The least duration counted is the span of the counted
    requests' arrivals at the shortest window the run may choose, so nothing that could finish is refused."""
    if cfg.exit_duration_mins is None:
        return
    limit_s = 60.0 * cfg.exit_duration_mins
    limit = f"--exit-duration-mins {cfg.exit_duration_mins:g} stops the run after {limit_s:g} s"
    if trace is not None:
        if trace[-1].arrival_s > limit_s:
            raise ValidationError(f"--trace {cfg.trace}'s last request arrives at {trace[-1].arrival_s:g} s, but "
                                  f"{limit}", "raise --exit-duration-mins above the trace's span, or shorten the trace")
        return
    window_s = cfg.steady_seconds or (MIN_SECONDS if cfg.device == "cuda" else CPU_WINDOW_S)
    for rate in (r for r in cfg.rates if math.isfinite(r)):
        counted = counted_requests(cfg.requests, rate, window_s)
        least_s = (counted - 1 + (cfg.warmup_requests or 0)) / rate
        if least_s > limit_s:
            raise ValidationError(
                f"rate {rate_label(rate)}/s needs at least {least_s:g} s (the arrivals of its {counted} counted "
                f"requests alone), but {limit}",
                f"raise the rate or lower --requests, or raise --exit-duration-mins to at least "
                f"{math.ceil(least_s / 60) + 1}")


def check_server(cfg: LoadConfig) -> None:
    """An HTTP target's options: the template renders, a started server has a checkpoint to load, and the
    options of a started server are not given for an external one."""
    from llm_inference import server

    target = cfg.server
    if target is None:
        return
    if cfg.decode_tuning != "auto":
        raise ValidationError(f"--decode-tuning {cfg.decode_tuning} with a server target (it tunes the in-process "
                              "engine's decode step)", "leave --decode-tuning out for --url/--server-command")
    if target.command is None:
        given = [name for name, value in (("--server-port", target.port),
                                          ("--server-version-command", target.version_command)) if value is not None]
        if given:
            raise ValidationError(f"{', '.join(given)} given with --url (they belong to a server the load starts)",
                                  "drop them, or start the server with --server-command")
        return
    server.render(target.command, {name: "x" for name in server.PLACEHOLDERS})
    if target.version_command:
        server.render(target.version_command, {name: "x" for name in server.PLACEHOLDERS}, "--server-version-command")
    if "{model}" in target.command and cfg.checkpoint is None:
        raise ValidationError("--server-command loads {model}, but no --checkpoint is given (a preset is not a "
                              "checkpoint a server can load)",
                              "save one with `python -m llm_inference save-checkpoint --preset "
                              f"{cfg.preset} --out DIR` and pass --checkpoint DIR")


def tokenizer(cfg: LoadConfig) -> Callable[[str], list[int]] | None:
    """The checkpoint's tokenizer for a trace's text prompts (presets have none)."""
    if cfg.checkpoint is None:
        return None
    from transformers import AutoTokenizer

    encode: Callable[[str], list[int]] = AutoTokenizer.from_pretrained(cfg.checkpoint).encode
    return encode


def load_lengths(cfg: LoadConfig, trace: list[Request] | None) -> tuple[int, int]:
    """(longest prompt, longest prompt + output) of the load's requests: the trace's, or the task's bounds."""
    if trace is not None:
        return max(r.input_tokens for r in trace), max(r.input_tokens + r.output_tokens for r in trace)
    task = TASKS[cfg.task]
    return task.input_length.high, longest_sequence(task, cfg.output_length)


def check_load_memory(cfg: LoadConfig, shape: ModelPreset, precision: str, memory_gib: float | None,
                      trace: list[Request] | None, holder: str = "the device") -> None:
    """Refuse more rows than the memory estimate admits (unknown memory: no check), naming the most it admits.
    A server's memory is its own business: no check."""
    if memory_gib is None or cfg.server is not None:
        return
    prompt, sequence = load_lengths(cfg, trace)

    def estimate(rows: int) -> memory.MemoryEstimate:
        return memory.estimate_memory(shape, precision, rows, prompt, sequence, "static", cfg.tensor_parallel)

    def fits(rows: int) -> bool:
        return estimate(rows).total_gib <= memory_gib

    if fits(cfg.max_concurrency):
        return
    needed = estimate(cfg.max_concurrency)
    admitted = _largest(fits, cfg.max_concurrency)
    raise ValidationError(
        f"--max-concurrency {cfg.max_concurrency} on {shape.name} ({precision}) needs an estimated "
        f"{needed.total_gib:.1f} GiB (KV cache {needed.kv_cache_gib:.1f} GiB for {sequence} positions a row) but "
        f"{holder} has {memory_gib:.1f} GiB",
        f"use --max-concurrency {admitted} or fewer (the most the estimate admits)" if admitted else
        "use a smaller model or lower precision")


def _largest(fits: Callable[[int], bool], above: int) -> int:
    """The largest n < `above` with fits(n) (fits is monotone), 0 when none."""
    low, high = 0, above  # fits(low) or low == 0; not fits(high)
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low
