"""The fixed keys of the run record's `metrics`, `meter` and `requests` blocks, as TypedDicts (docs/run-record.md).

Types only: the blocks stay plain dicts in memory and in the JSON, so that a record reads and writes exactly as
before; mypy checks every key a driver writes or a reader reads against the lists below. All are total=False: a
record of an earlier schema, a run without a steady window (metrics is then `{"work_unit": ...}` and the driver's
own keys) or a failed run lacks keys, and a reader asks with `.get`. tests/test_record_types.py checks that every
key of every shipped record is declared here, so the lists cannot drift from what the drivers write.

`metrics` is a union, one type per driver (Metrics): the steady figures (SteadyFigures) and the sections of keys
more than one driver writes are declared once and combined into each driver's type; which type a record's block
is follows from its benchmark (metrics_type), and a reader of a driver's own key narrows to it first
(joulebench.record.driver_metrics).

A block the code holds as a dataclass (joulebench.launch.LaunchEnv, joulebench.sizing.SteadyPlan and WindowLength,
jpwr.IdleBaseline) is declared here field for field; tests/test_record_types.py keeps the two alike. Keys named after
a work unit are declared for the units the drivers use (`WORK_UNITS`); `config`, `software` and `requests.energy`
(the per-request fit, docs/attribution.md) stay open dicts. A dict becomes one of these types
through joulebench.record_shape.checked_block (the reader's shape check), never a cast.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Required, TypedDict, final

from joulebench.compile_cache import CompileAutotune, CompileCacheFigures, CompilePhases

# The work units of the drivers' steady windows: steady_metrics names four figures after them (tokens_per_s, ...).
WORK_UNITS = ("tokens", "images", "output_tokens")


class DeviceFigures(TypedDict):
    """One GPU's figures over the steady window (joulebench.record.per_device_figures): a straggling rank shows."""

    node: str | None
    index: int | None
    uuid: str | None
    name: str
    energy_j: float | None
    mean_power_w: float | None
    utilization_gpu: float | None  # mean fraction of time a kernel ran, 0-1


class SteadyFigures(TypedDict, total=False):
    """The shared headline figures of the steady window, declared once here (joulebench.record.steady_metrics
    computes them; docs/run-record.md says what each means)."""

    window: str
    work_unit: str
    iterations: int
    duration_s: float
    time_per_iteration_s: float | None
    model_flops_per_unit: float | None
    model_tflops_per_device: float | None
    peak_tflops_per_device: float | None
    mfu: float | None
    energy_wh: float | None
    mean_power_w_per_device: float | None
    energy_method: str | None
    energy_coverage: float | None
    energy_error_bound_j: float | None
    energy_unavailable_reason: str | None
    energy_devices: int | None
    energy_warning: str | None
    idle_power_w: float | None
    dynamic_energy_wh: float | None
    dynamic_energy_error_bound_j: float | None
    energy_untrusted_reason: str | None
    partial_mean_power_w_per_device: float | None
    per_device: list[DeviceFigures]  # each device of the headline
    outside_job_devices: int | None  # a whole-node request: the node's devices the job was not bound to
    outside_job_energy_j: float | None  # ... and their energy over the same window, never in the headline
    # the work rate, per device, per Wh and partial per Wh, named after the work unit: one set per WORK_UNITS
    tokens_per_s: float | None
    tokens_per_s_per_device: float | None
    tokens_per_wh: float | None
    partial_tokens_per_wh: float | None
    images_per_s: float | None
    images_per_s_per_device: float | None
    images_per_wh: float | None
    partial_images_per_wh: float | None
    output_tokens_per_s: float | None
    output_tokens_per_s_per_device: float | None
    output_tokens_per_wh: float | None
    partial_output_tokens_per_wh: float | None


class BatchFigures(TypedDict, total=False):
    """The batch a step or generation worked on (llm_training, resnet50, llm_inference run)."""

    global_batch_size: int


class DeviceCount(TypedDict, total=False):
    """The devices that did the work (resnet50, llm_inference run and load)."""

    devices: int | None  # None: the record names none (a load against a server without --server-devices)


class ModelFigures(TypedDict, total=False):
    """The model's size, FLOP count and memory (llm_training, llm_inference run)."""

    parameters: int
    flops_formula: str
    warmup_duration_s: float | None
    memory_estimate_gib: float
    peak_memory_allocated_gib: float | None


class CompileFigures(TypedDict, total=False):
    """What compiling the step cost and reused (llm_training, resnet50)."""

    compile_s: float | None  # the warm-up window of a compiled run (joulebench.compile_cache.compile_seconds)
    compile_cache: CompileCacheFigures | None  # where the compile caches were and what this run reused


class GenerationFigures(TypedDict, total=False):
    """An inference run's and a load's common figures (llm_inference)."""

    requests_per_s: float | None  # a load: the served rate
    ttft_p90_s: float | None
    energy_per_output_token_j: float | None
    energy_per_output_token_error_bound_j: float | None


class LossPoint(TypedDict):
    iteration: int
    loss: float


@final
class TrainingMetrics(SteadyFigures, BatchFigures, ModelFigures, CompileFigures, total=False):
    """llm_training's `metrics` (llm_training/train.py)."""

    loss_curve: list[LossPoint]
    skipped_updates: int
    caraml_x4_flops_per_token: float
    caraml_x4_tflops_per_device: float | None
    caraml_x4_note: str
    tokens_per_iteration: int
    warmup_iterations: int


class WarmupExcluded(TypedDict):
    iterations: int
    duration_s: float


class ResNetFlopsFigures(TypedDict, total=False):
    """resnet50.flops.FlopCount.to_dict: the model and the FLOP counts of one image."""

    architecture: str
    variant: str
    image_size: int
    flops_per_image_forward: float
    flops_per_image_training: float
    flops_convention: str


@final
class ResNetMetrics(SteadyFigures, BatchFigures, DeviceCount, CompileFigures, ResNetFlopsFigures, total=False):
    """resnet50's `metrics` (resnet50/driver.py)."""

    per_device_batch_size: int
    precision: str
    framework: str
    warmup_excluded: WarmupExcluded | None
    compile_mode: str
    warmup_s: float | None
    first_step_s: float | None
    compile_phases_s: CompilePhases | None  # first_step_s by torch's compile timers (joulebench.compile_cache)
    compile_autotune: CompileAutotune | None  # the first step's Triton autotuning (null on the CPU)
    losses: list[list[float]]  # [step, loss] pairs
    loss_first: float | None
    loss_last: float | None
    iterations_completed: int


@final
class InferenceRunMetrics(SteadyFigures, BatchFigures, DeviceCount, ModelFigures, GenerationFigures, total=False):
    """llm_inference run's `metrics`: static batches (llm_inference/runner.py, llm_inference/metrics.py)."""

    batch_size: int
    input_tokens_per_s: float | None
    prefill_call_s: float | None
    prefill_input_tokens_per_s: float | None
    ttft_median_s: float | None
    per_token_latency_median_s: float | None
    per_token_latency_p90_s: float | None
    energy_j: float | None
    energy_per_request_j: float | None
    mean_power_w: float | None
    prefill_energy_j: float | None
    prefill_energy_error_bound_j: float | None
    prefill_energy_method: str | None
    prefill_energy_per_call_j: float | None
    prefill_energy_per_input_token_j: float | None
    decode_energy_j: float | None
    decode_energy_per_token_j: float | None
    decode_energy_per_token_error_bound_j: float | None
    decode_energy_note: str
    steady_idle_energy_j: float | None
    steady_dynamic_energy_j: float | None
    steady_idle_share: float | None
    prefill_dynamic_energy_j: float | None
    decode_dynamic_energy_j: float | None
    decode_dynamic_energy_per_token_j: float | None
    decode_dynamic_energy_per_token_error_bound_j: float | None
    idle_split_unavailable_reason: str | None
    prefill_passes: int
    steady_passes: int
    engine_setup_s: float
    warmup_note: str
    latents: dict[str, dict[str, float]] | None  # per window: latent means (utilisation, clocks, memory ...)
    latents_unavailable_reason: str | None
    utilization_gpu: float | None
    memory_used_gib: float | None
    sm_clock_mhz: float | None


@final
class LoadMetrics(SteadyFigures, DeviceCount, GenerationFigures, total=False):
    """llm_inference load's `metrics`, engine and server alike (llm_inference/load_plan.py, request_metrics.py):
    one offered rate; `rate` is what tells it from a run's (metrics_type)."""

    rate: str
    max_concurrency: int
    task: str
    engine: str
    count: int
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    tpot_p50_s: float | None
    tpot_p90_s: float | None
    tpot_p99_s: float | None
    e2e_p50_s: float | None
    e2e_p90_s: float | None
    e2e_p99_s: float | None
    queue_p50_s: float | None
    queue_p90_s: float | None
    queue_p99_s: float | None
    slo_attained_share: float | None
    goodput_requests_per_s: float | None
    slo_ttft_ms: float | None
    slo_tpot_ms: float | None
    requests_counted: int
    requests_finished: int
    offered_requests_per_s: float | None  # the counted arrivals' rate over their span (None at `max`)
    requests_served_in_window: int | None  # requests that finished inside the window (the served rate's count)
    served_window_s: float | None  # the counted requests over the served rate: goodput's denominator
    queue_drained: bool | None  # the client's or engine's queue emptied at least once in the window's second half
    window_counter_periods: float | None  # the window's length in the energy counter's update periods
    overload: str | None  # queue_never_drained, short_window (comma-joined) or none; None: not judged
    overload_note: str | None  # the queue never drained or the window is short, in words (None: nothing to say)
    window_rule: str
    mean_decode_rows: float | None  # occupied rows per decode step
    mean_computed_rows: float | None  # rows a decode step computed (its row bucket)
    computed_rows_per_occupied_row: float | None  # the row buckets' waste over the window (1.0: none)
    moved_requests_per_decode_step: float | None  # cache rows copied to lower a step's row bucket
    prefill_steps: int
    decode_steps: int
    energy_per_request_p50_j: float | None
    energy_per_request_p90_j: float | None


# The record's `metrics` block: the steady figures (SteadyFigures) and the keys its driver adds, one type per driver
# (a driver's type lists the keys it writes). A reader that reads a driver's own key narrows first
# (joulebench.record.driver_metrics, by the record's benchmark).
Metrics = TrainingMetrics | ResNetMetrics | InferenceRunMetrics | LoadMetrics
METRICS_OF_BENCHMARK: dict[str, type[Metrics]] = {
    "llm_training": TrainingMetrics, "resnet50": ResNetMetrics, "llm_inference": InferenceRunMetrics}
METRICS_OF_WORK_UNIT: dict[str, type[Metrics]] = {
    "tokens": TrainingMetrics, "images": ResNetMetrics, "output_tokens": InferenceRunMetrics}


def metrics_type(benchmark: str, metrics: Mapping[str, object]) -> type[Metrics]:
    """The type of a record's `metrics` block: its driver's (a load's where it names an offered rate); a driver
    this core does not know (a test's, a replay's) writes the type of its work unit's driver (tokens: training's)."""
    kind = METRICS_OF_BENCHMARK.get(benchmark)
    if kind is None:
        unit = metrics.get("work_unit")
        kind = METRICS_OF_WORK_UNIT.get(unit, TrainingMetrics) if isinstance(unit, str) else TrainingMetrics
    return LoadMetrics if kind is InferenceRunMetrics and "rate" in metrics else kind


# Metrics figures computed from the headline window's energy: n/a whenever that window has no energy (the reader,
# joulebench.record.parse_record, enforces it on a record whose window says otherwise). Those the meter gives for an
# untrusted window too (its method, coverage, device count, the devices outside the job, its partial figures) are
# HEADLINE_ENERGY_FIGURES beyond TRUSTED_ENERGY_FIGURES.
TRUSTED_ENERGY_FIGURES = (
    "energy_wh", "mean_power_w_per_device", "energy_error_bound_j", "dynamic_energy_wh",
    "dynamic_energy_error_bound_j", *(f"{unit}_per_wh" for unit in WORK_UNITS),
    "energy_j", "energy_per_request_j", "energy_per_output_token_j", "energy_per_output_token_error_bound_j",
    "mean_power_w", "decode_energy_j", "decode_energy_per_token_j", "decode_energy_per_token_error_bound_j",
    "steady_idle_energy_j", "steady_dynamic_energy_j", "steady_idle_share", "decode_dynamic_energy_j",
    "decode_dynamic_energy_per_token_j", "decode_dynamic_energy_per_token_error_bound_j",
    "energy_per_request_p50_j", "energy_per_request_p90_j")
HEADLINE_ENERGY_FIGURES = (  # (idle_power_w is the idle baseline's, not the window's: it stays)
    *TRUSTED_ENERGY_FIGURES, "energy_method", "energy_coverage", "energy_devices", "outside_job_devices",
    "outside_job_energy_j",
    "partial_mean_power_w_per_device", *(f"partial_{unit}_per_wh" for unit in WORK_UNITS))


class LaunchBlock(TypedDict, total=False):
    """The record's `launch` block: the process layout (joulebench.launch.LaunchEnv.to_dict, field for field)."""

    launcher: str  # "torchrun", "slurm" or "single"
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    node_rank: int
    num_nodes: int
    node_name: str
    master_addr: str
    master_port: int
    job_id: str | None


class HardwareBlock(TypedDict, total=False):
    """The record's `hardware` block: what the run ran on (joulebench.torch_device.hardware_info, resnet50's
    backends' hardware, the node's GPU facts of joulebench.node_facts); a driver that adds a key declares it here."""

    device_type: str  # torch's device type: "cuda", "cpu", ...
    device_kind: str  # resnet50's: "cuda" or "cpu"
    device_name: str
    device_memory_gib: float | None
    compute_capability: str
    devices: int
    devices_per_node: int
    nodes: int
    host_cpu: str
    gpu_interconnect: str  # "NVLink", "PCIe", "none" or "unknown" (jpwr.Interconnect)
    gpu_interconnect_detail: str  # ... and what it was read from
    cpu_count: int | None
    torch_threads: int
    cudnn_benchmark: bool
    cudnn_allow_tf32: bool
    inductor_coordinate_descent_tuning: bool | None
    devices_per_worker: int  # resnet50 on TensorFlow: its workers and their strategy
    workers: int
    strategy: str


class JobDevice(TypedDict):
    """One accelerator a node's sampler metered as the job's (jpwr's NodeSummary.job_accelerators, key for key:
    tests/test_record_types.py keeps the two alike; the meter's own type is private to it)."""

    index: int | None
    uuid: str | None
    name: str | None


class JobNode(TypedDict):
    """Per node: the job's accelerators and the binding that named them (jube/jbrecord.py: job_devices)."""

    node: str
    binding: str | None
    devices: list[JobDevice]


class JobBlock(TypedDict, total=False):
    """The record's `job` block: the scheduler job the run was (jube/jbrecord.py: job_facts); empty outside JUBE."""

    scheduler: str | None
    job_id: str | None
    time_limit_s: int | None
    stop_margin_s: int | None
    stop_budget_s: int | None
    elapsed_s: float | None
    exit_code: int
    tags: list[str]  # the `jube run` tags: recommend's apply line repeats them
    devices: list[JobNode]


class OtherProcess(TypedDict):
    """A process of another job seen on the metered GPUs (joulebench.disturbed's other_processes check)."""

    pid: int
    node: str
    name: str | None  # None: its PID is not visible here (another PID namespace)
    used_memory_bytes: int | None
    devices: list[str]
    samples: int


class DisturbanceCheck(TypedDict, total=False):
    """One check of the `disturbed` block: its verdict (None: not judged, with the reason) and what it measured."""

    disturbed: Required[bool | None]
    unavailable_reason: str | None
    # the measure: step times' CV, other processes, the share of load samples above the cores, per GPU the share of
    # samples with each clock reason
    value: float | list[OtherProcess] | dict[str, dict[str, float]]
    threshold: float | str
    samples: int
    basis: str  # what the step times are (step_time_cv)
    reason: str  # a disturbed check: why, in words
    note: str
    partly_unavailable: list[str]
    max_load_1min: float
    cores: int | None
    counted: list[str]  # the clock reasons counted as held down


class DisturbedBlock(TypedDict, total=False):
    """The record's `disturbed` block (joulebench.disturbed.judge): whether anything else ran beside the window."""

    disturbed: bool | None  # None: not judged
    reasons: list[str]
    window: str
    checks: dict[str, DisturbanceCheck]  # step_time_cv, other_processes, host_load, clock_events


class FootprintBlock(TypedDict, total=False):
    """The record's `footprint` block (jube/jbfootprint.py): carbon and cost of the metered energy, an estimate from
    the site profile, each figure with its bound and n/a (None, with the reason) where the profile gives no value."""

    estimate: str | None  # None: the profile's settings could not be read (unavailable_reason says why)
    unavailable_reason: str
    carbon_source: str | None
    price_source: str | None
    currency: str | None
    pue: float
    pue_source: str
    energy_basis: str
    placement: str
    run_energy_j: float | None
    run_energy_error_bound_j: float | None
    work_unit: str | None
    work: float | None
    g_co2e: float | None
    g_co2e_error_bound: float | None
    g_co2e_per_unit: float | None
    g_co2e_per_unit_error_bound: float | None
    g_co2e_unavailable_reason: str
    cost: float | None
    cost_error_bound: float | None
    cost_per_unit: float | None
    cost_per_unit_error_bound: float | None
    cost_unavailable_reason: str


class ClockAnchor(TypedDict):
    """UTC of the windows' monotonic edges (jube/jbfootprint.py weights energy by the hour)."""

    wall_ns: int
    monotonic_ns: int


class IdleBaselineBlock(TypedDict, total=False):
    """`meter.idle_baseline`: jpwr.IdleBaseline.to_dict, field for field, and when it was measured."""

    power_w: float | None
    error_bound_w: float | None
    devices: int
    duration_s: float | None
    method: str | None
    settled: bool | None
    settle_wait_s: float | None
    settle_note: str | None
    unavailable_reason: str | None
    nodes: list[str]
    measured: str  # "before this run's first window", or the earlier run of a sweep it was reused from


class SteadyPlanBlock(TypedDict, total=False):
    """`meter.steady_plan`: joulebench.sizing.SteadyPlan.to_dict, field for field (the training drivers)."""

    iterations: int
    rule: str
    reason: str
    seconds: float | None
    step_s: float | None
    update_period_s: float | None
    update_period_source: str | None
    edge_power_w: float | None
    mean_power_w: float | None
    predicted_bound_fraction: float | None
    aliasing: str | None
    aliasing_risk: str | None


class WindowLengthBlock(TypedDict, total=False):
    """`meter.steady_seconds`: joulebench.sizing.WindowLength.to_dict, field for field (llm_inference)."""

    seconds: float
    rule: str
    update_period_s: float
    update_period_source: str
    edge_power_w: float | None
    mean_power_w: float | None


class MeterBlock(TypedDict, total=False):
    """The record's `meter` block: jpwr facts for this run (joulebench.lifecycle and the drivers)."""

    sampler: bool
    energy_methods: str | None
    in_process_out_dir: str | None
    clock: ClockAnchor
    idle_baseline: IdleBaselineBlock
    steady_plan: SteadyPlanBlock | None  # the training drivers
    steady_seconds: WindowLengthBlock  # llm_inference: the seconds each window lasts at least, and the rule


class RequestFailure(TypedDict):
    id: int
    status: str
    reason: str | None


class RequestFailures(TypedDict):
    """A load sent to a server: its failed and timed-out requests."""

    count: int
    by_reason: dict[str, int]
    first: list[RequestFailure]


class RejectedUsage(TypedDict):
    id: int
    reported: Any  # `usage.completion_tokens` as the server sent it
    reason: str


# A load sent to a server: finished requests by where their output count came from, and the server's counts that
# were not plausible (llm_inference/http_client.py: implausible_count). Keys with spaces: the functional form.
OutputTokenCounts = TypedDict("OutputTokenCounts", {
    "from usage": int, "counted from the stream": int, "usage rejected": int,
    "rejected by reason": dict[str, int], "rejected first": list[RejectedUsage]}, total=False)


class CardConditions(TypedDict, total=False):
    """joulebench.card_state.Conditions.to_dict, field for field: the card state and step sizes some work ran at."""

    sm_clock_mhz: float | None
    capped_share: float | None
    prefill_step_tokens: float | None
    decode_step_rows: float | None
    decode_row_positions: float | None
    decode_rows_p5: float | None
    decode_rows_p95: float | None


class CardComparison(TypedDict, total=False):
    """joulebench.card_state.Comparison.to_dict: the conditions a fit's data ran at and those it predicts."""

    fitted: CardConditions
    predicted: CardConditions
    prefill_step_factor: float | None
    decode_rows_factor: float | None
    decode_positions_factor: float | None


class CardStateCheck(TypedDict, total=False):
    """A check's card-state fields (joulebench.card_state.check_fields): its conditions, and a failed one's cause."""

    conditions: CardComparison
    measured_cause: str


class HeldOutHalfCheck(CardStateCheck, total=False):
    """Check (b): one contiguous half of the window predicted by a fit on the other. In these checks a figure the
    fit could not give (NaN) is written null."""

    measured_j: float | None
    predicted_j: float | None
    bound_j: float | None
    closes: bool


class CrossRateCheck(CardStateCheck, total=False):
    """Check (a): one rate's window energy predicted by the fit at another (or at all but it: the joint fit)."""

    fitted_at: str
    predicted: str
    passes: bool
    reason: str  # why it could not be predicted
    measured_j: float | None
    predicted_j: float | None
    bound_j: float | None


class ControlledPartCheck(CardStateCheck, total=False):
    """Check (c): one part (prefill, decode) of the controlled-split window against the fit's prediction."""

    part: str
    measured_j: float | None
    measured_bound_j: float | None
    measured_bound_fraction: float | None
    predicted_j: float | None
    relative_error: float | None
    passes: bool
    reason: str | None


class ControlledPlan(TypedDict, total=False):
    """How the controlled-split window's parts were planned (llm_inference/load.py; its table's attribute)."""

    part_seconds_planned: float
    part_length_rule: str
    prefill_step_requests: int
    decode_rows: int


class ControlledPart(CardConditions, total=False):
    """One part of the controlled-split window as measured: its length, steps, counter energy and card state."""

    seconds: float
    steps: int
    energy_j: float | None
    bound_j: float | None
    bound_fraction: float | None
    energy_unavailable_reason: str


class ControlledWindowBlock(ControlledPlan, total=False):
    """The controlled-split window as measured (llm_inference.serving_energy.Controlled.describe)."""

    prefill: ControlledPart
    decode: ControlledPart


class HeldOutRateTrial(TypedDict, total=False):
    """One held-out rate of the card-state term's trial: its window energy measured and predicted without and
    with the term."""

    rate: str
    measured_j: float | None
    predicted_without_j: float | None
    predicted_with_j: float | None
    error_without: float | None
    error_with: float | None


class ClockTermTrial(TypedDict, total=False):
    """joulebench.clock_term.TermTrial.to_dict: whether the fit adopted the card-state term, and why (not)."""

    form: str
    adopted: bool
    unadopted_reason: str | None
    alpha: float | None
    reference_clock_mhz: float | None
    alpha_likelihood_ratio: float | None
    alpha_determined_above: float
    held_out_rates: list[HeldOutRateTrial]
    rms_error_without: float | None
    rms_error_with: float | None


class CapTermTrial(TypedDict, total=False):
    """joulebench.cap_term.CapTrial.to_dict: the power-cap term's law and powers, whether the fit adopted it and
    why (not), and the checks of the fit with it."""

    form: str
    adopted: bool
    unadopted_reason: str | None
    adoption_rests_on: str
    step_time_law_s: dict[str, float] | None  # seconds per unit of each column
    capped_power_w: dict[str, float] | None  # prefill, decode
    likelihood_ratio: float | None  # against the fit without it, over 1 s blocks
    determined_above: float
    held_out_rates: list[HeldOutRateTrial]
    rms_error_without: float | None
    rms_error_with: float | None
    checks_without_term: RequestEnergyBlock  # held_out_halves, cross_rate, controlled_split, checks_failed
    checks_with_term: RequestEnergyBlock


class ClientEstimateError(TypedDict, total=False):
    """llm_inference.client_estimate.estimate_error: the client-side estimate's error against the engine's own
    per-request energy, or why it is n/a."""

    unavailable_reason: str
    method: str
    requests: int
    relative_error_p50: float | None
    relative_error_p90: float | None
    relative_error_of_sum: float | None
    prefill_relative_error_of_sum: float | None
    decode_relative_error_of_sum: float | None


class RequestEnergyBlock(TypedDict, total=False):
    """`requests.energy` (llm_inference/serving_energy.py, docs/attribution.md): the per-request energy fit of one
    rate, its requests' energy and the model's checks; or {"unavailable_reason": ...}."""

    unavailable_reason: str
    estimate: str  # a server's block: "client-side estimate"
    method: str
    columns: list[str]
    coefficients: dict[str, float | None]  # a value the fit could not give (NaN) is written null
    intervals_95: dict[str, list[float | None]]
    idle_w: float | None
    idle_given: bool
    notes: list[str]
    vif: dict[str, float | None]
    prefill_block_vif: float | None
    separable: bool
    split_unavailable_reason: str | None
    segments: int
    clock_term: ClockTermTrial
    cap_term: CapTermTrial
    fitted_conditions: CardConditions | None
    held_out_halves: list[HeldOutHalfCheck]
    fitted_span_s: float
    share_rule: str
    requests: int
    energy_per_request_j: dict[str, float | None]  # p50, p90
    shares: dict[str, float | None]  # prefill, decode, idle
    window_remainder_j: float | None
    window_remainder_bound_j: float | None
    window_unattributed_idle_j: float | None
    cross_rate: list[CrossRateCheck]
    controlled_split: list[ControlledPartCheck] | str  # or why it could not run
    controlled_window: ControlledWindowBlock
    checks_failed: str
    client_side_estimate_error: ClientEstimateError
    joint: RequestEnergyBlock  # the sweep's rates fitted together: this block's keys and the three below
    rates: list[str]
    rates_left_out: dict[str, str]
    joint_segments: int


class RequestsBlock(TypedDict, total=False):
    """The record's `requests` block: a serving run's per-request table beside it (requests.h5) and its summary."""

    file: str | None
    file_unavailable_reason: str
    rows: int
    counted: int
    columns: list[str]
    steps: int  # the engine's step log (in-process load)
    chunks: int  # chunks read from the server's streams (a load sent to a server)
    output_token_counts: OutputTokenCounts
    failures: RequestFailures
    energy: RequestEnergyBlock  # the per-request fit or the client-side estimate, or {"unavailable_reason": ...}


# ---- the record as a document: the shape joulebench.record_shape checks at load ------------------------------------
class DeviceEnergyDocument(TypedDict, total=False):
    """One device of a window's energy (jpwr.DeviceEnergy.to_dict): the texts and lists a reader relies on."""

    node: str | None
    uuid: str | None
    name: str | None


class FaultDocument(TypedDict, total=False):
    """A stretch of a device's window data not taken at its word (jpwr.device_energy.Fault, field for field)."""

    device: str | None
    node: str | None
    kind: str
    from_s: float
    to_s: float
    error: str | None
    detail: str


class EnergySplitDocument(TypedDict, total=False):
    """A window's energy as idle plus dynamic (jpwr.EnergySplit, field for field)."""

    idle_j: float | None
    idle_bound_j: float | None
    dynamic_j: float | None
    dynamic_bound_j: float | None
    idle_power_w: float | None
    unavailable_reason: str | None


class WindowEnergyDocument(TypedDict, total=False):
    """A window's `energy` (jpwr.WindowEnergy.to_dict): its texts and lists; its numbers are figures
    (joulebench.figures judges them)."""

    devices: int
    method: str | None
    unavailable_reason: str | None
    untrusted_reason: str | None
    domain: str | None
    warnings: list[str]
    per_device: list[DeviceEnergyDocument]
    other_domains: list[DeviceEnergyDocument]
    outside_job: list[DeviceEnergyDocument]
    faults: list[FaultDocument]


class WindowDocument(TypedDict, total=False):
    """One entry of the record's `windows` (jpwr.Window.to_dict)."""

    name: Required[str]
    first_step: Required[int]
    last_step: Required[int]
    t_start_ns: Required[int]
    t_end_ns: Required[int]
    work: dict[str, float]
    energy: WindowEnergyDocument | None
    energy_split: EnergySplitDocument | None
    end_reason: str | None


class RecordDocument(TypedDict, total=False):
    """A run_record.json as written (joulebench.record.RunRecord.to_dict); docs/run-record.md."""

    schema_version: Required[int]
    kind: Required[str]
    benchmark: Required[str]
    run_id: Required[str]
    status: Required[str]
    started_at: Required[str]
    status_reason: str | None
    finished_at: str | None
    config: dict[str, Any]
    launch: LaunchBlock
    hardware: HardwareBlock
    software: dict[str, Any]
    windows: list[WindowDocument]
    metrics: Metrics
    meter: MeterBlock
    job: JobBlock | None
    warnings: list[str] | None
    attribution: dict[str, Any] | None
    requests: RequestsBlock | None
    disturbed: DisturbedBlock | None
    footprint: FootprintBlock | None
    energy_domain: str | None
