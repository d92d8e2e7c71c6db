"""The sweep settings of each driver, declared once: what a JUBE sweep varies and what `joulebench recommend` chooses.

Why one table: a setting used to be declared in five places (the driver's option, jube's argument mapping, its
workload table, the workflow XML and analysis' knob table), each free to drift from the others. From this table
jube/jbworkloads.py takes a workflow's sweep dimensions and work unit, jube/jbarguments.py the options a point
passes as they are, jube/jbcolumns.py writes the XML's `sweep` parameters, and joulebench.analysis.knobs reads the
knobs back from run records. The driver's own option (its parser and default) is the one declaration outside; the
tests compare each row with it. Standard library only: the login node's validate step (jube/jbprofile.py) reads it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SweepSetting:
    """One setting of a driver."""

    key: str  # the run record's config key; the JUBE sweep parameter (JOULEBENCH_SWEEP_<KEY>) where `sweep`
    option: str = ""  # the driver option that sets it; "": none (node and device counts, GPU settings the job applies)
    default: str | None = None  # the driver's default, as text; None: none of its own (the profile's, or a preset's)
    semantic: bool = False  # changes what is computed: recommend offers it only with --allow-semantic-changes
    sweep: bool = True  # a dimension of the driver's JUBE sweep
    knob: int = 0  # its place among recommend's knobs (1 first; recommend's order, older than the sweep's); 0: none
    flag: bool = False  # a --X / --no-X option
    mapped: bool = False  # jube/jbarguments.py maps it itself (the profile's value where empty, a check), not as given
    tagged: bool = False  # its JUBE values come from the workflow's tags (written by hand before the generated lines)


@dataclass(frozen=True)
class DriverSettings:
    work_unit: str  # the unit of the throughput and energy columns where a record names none
    settings: tuple[SweepSetting, ...]  # the sweep's dimensions in the workflow's order, then knobs outside it


def _gpu(*settings: SweepSetting) -> tuple[SweepSetting, ...]:
    """Every sweep ends with the GPU settings per point (docs/sweeps.md), which the job applies, not the driver."""
    return (*settings, SweepSetting("power_limit"), SweepSetting("sm_clock"))


_NODES = (SweepSetting("nodes"), SweepSetting("devices_per_node"))
_WINDOW = (SweepSetting("iterations", "--iterations", mapped=True),
           SweepSetting("warmup_iterations", "--warmup-iterations", mapped=True),
           SweepSetting("steady_seconds", "--steady-seconds", mapped=True))
SETTINGS: dict[str, DriverSettings] = {
    "llm_training": DriverSettings("tokens", (
        *_NODES,
        SweepSetting("global_batch_size", "--global-batch-size", semantic=True, knob=5, mapped=True),
        SweepSetting("micro_batch_size", "--micro-batch-size", knob=1),
        SweepSetting("tensor_parallel", "--tensor-parallel", "1", knob=3, mapped=True),
        SweepSetting("pipeline_parallel", "--pipeline-parallel", "1", knob=4, mapped=True),
        SweepSetting("seq_length", "--seq-length"),
        SweepSetting("precision", "--precision", semantic=True, knob=6, mapped=True),
        *_gpu(*_WINDOW),
        SweepSetting("recompute", "--recompute", sweep=False, knob=2),
        SweepSetting("model", "--model", semantic=True, sweep=False, knob=7),
    )),
    "resnet50": DriverSettings("images", (
        SweepSetting("framework", "--framework", mapped=True, tagged=True),
        *_NODES,
        SweepSetting("global_batch_size", "--global-batch-size", semantic=True, knob=4, mapped=True),
        SweepSetting("image_size", "--image-size", mapped=True),
        SweepSetting("precision", "--precision", semantic=True, knob=5, mapped=True),
        SweepSetting("compile_mode", "--compile-mode", knob=2),
        *_gpu(*_WINDOW),
        SweepSetting("compile", "--compile", sweep=False, knob=1, flag=True),
        SweepSetting("channels_last", "--channels-last", "true", sweep=False, knob=3, flag=True),
        SweepSetting("bn_kernels", "--bn-kernels", "inductor", sweep=False, knob=6),  # the same batch norm, fused
    )),
    "llm_inference": DriverSettings("output_tokens", (
        SweepSetting("task", "--task", mapped=True),
        SweepSetting("batch_size", "--batch-size", knob=3, mapped=True),
        SweepSetting("engine", "--engine", "static", knob=5),
        SweepSetting("tensor_parallel", "--tensor-parallel", mapped=True),
        SweepSetting("decode_tuning", "--decode-tuning", "auto", knob=1),
        SweepSetting("objective", "--objective", "speed", knob=2),
        SweepSetting("rate", "--rate", mapped=True),
        SweepSetting("max_concurrency", "--max-concurrency", knob=4, mapped=True),
        SweepSetting("admit_divisor", "--admit-divisor", "16", knob=8),  # a serving point's prefill/decode interleave
        SweepSetting("slo_ttft_ms", "--slo-ttft-ms", mapped=True),
        SweepSetting("slo_tpot_ms", "--slo-tpot-ms", mapped=True),
        SweepSetting("min_window_s", "--min-window-s", mapped=True),
        SweepSetting("precision", "--precision", semantic=True, knob=6, mapped=True),
        *_gpu(SweepSetting("steady_seconds", "--steady-seconds", mapped=True)),
        SweepSetting("model", "--preset", semantic=True, sweep=False, knob=7),
    )),
}


def settings_of(driver: str) -> tuple[SweepSetting, ...]:
    """The driver's settings (KeyError for a driver without a table: the callers name the known ones)."""
    return SETTINGS[driver].settings


def sweep_keys(driver: str) -> tuple[str, ...]:
    """The driver's JUBE sweep dimensions, in the workflow's order."""
    return tuple(s.key for s in settings_of(driver) if s.sweep)


def knobs(driver: str) -> tuple[SweepSetting, ...]:
    """The settings recommend chooses among, in its order."""
    return tuple(sorted((s for s in settings_of(driver) if s.knob), key=lambda s: s.knob))


def passed_as_given(driver: str) -> tuple[str, ...]:
    """Sweep dimensions a point passes to the driver as they are (empty: the driver's default): an option that
    jube does not map itself."""
    return tuple(s.key for s in settings_of(driver) if s.sweep and s.option and not s.mapped)


def work_unit(driver: str) -> str:
    return SETTINGS[driver].work_unit
