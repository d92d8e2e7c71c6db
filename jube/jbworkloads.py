"""The three workflows as data: which driver each runs and how, its sweep parameters, profile keys and work unit.

Why a table: what differs between the LLM, ResNet-50 and inference workflows lives in one frozen record per
workflow, read by jbprofile.py (validate, on the login node) and jbrecord.py (the table row, in the job), instead of
`benchmark == ...` branches through both. A new workload is a new row here (and its XML), not a new branch. Its
sweep dimensions and work unit are the driver's row of the core's table (joulebench.sweep_settings), which the XML's
`sweep` parameters are generated from (jbcolumns.py). Standard library and that table only (Python >= 3.10).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import jbarguments
from jbsystems import FRAMEWORK_TAGS, INFERENCE_MODEL_TAGS, MODEL_TAGS

from joulebench.sweep_settings import sweep_keys, work_unit

# llm_inference's own columns (docs/llm_inference.md), after the shared ones
INFERENCE_COLUMNS = ("requests_per_s", "energy_per_output_token_j", "energy_per_output_token_error_bound_j",
                     "energy_per_request_j", "decode_energy_per_token_j", "decode_energy_per_token_error_bound_j",
                     "ttft_median_s", "ttft_p90_s", "per_token_latency_median_s", "per_token_latency_p90_s",
                     "goodput_requests_per_s", "energy_per_request_p50_j", "energy_per_request_p90_j")
# the training workflows' own column: seconds to the first measured step of a compiled run (docs/run-record.md)
TRAINING_COLUMNS = ("compile_s",)


@dataclass(frozen=True)
class Workload:
    """One workflow: the XML's <benchmark name>, its driver and how a sweep point becomes the driver's options."""

    name: str  # the XML's <benchmark name>, jbprofile.py's --benchmark
    driver: str  # python -m DRIVER; the run record's `benchmark`
    command: str  # the driver's command for a point
    serving_command: str  # its command for a point with a rate ("" where the driver has no serving mode)
    # the driver's options of a point (jbarguments.py): (profile, point values, model, flag tags, profile prefix)
    arguments: Callable[[dict[str, str], dict[str, str], str, list[str], str], dict[str, str]]
    profile_prefix: str  # profile keys <prefix>_iterations, <prefix>_task, ...
    startup_key: str  # profile key of its start-up time; {model}: the model preset, lower case
    default_model_key: str  # profile key naming the model without a model tag
    batch_key: str = ""  # profile key of its global batch, scaled with the devices per node (jbchecks.batch_scaling)
    model_tags: tuple[str, ...] = ()
    framework_tags: tuple[str, ...] = ()  # the model is <driver>-<framework>, the framework a sweep dimension
    nodes_by_model: bool = False  # nodes_<MODEL> of the point's model, else of the profile's default model
    one_device: bool = False  # one node per job, one process per device of its tensor_parallel (default 1)
    self_stop: bool = True  # the driver stops itself at --exit-duration-mins (job.sh sets it)
    table_columns: tuple[str, ...] = ()  # its own metrics columns, after the shared ones
    request_shares: bool = False  # a serving record's prefill/decode/idle shares of its requests' energy
    # the driver's command that completes a serving record once the job's samplers stopped (`python -m DRIVER
    # COMMAND --run OUT --trace OUT/energy`, jbrecord.py finalize): its per-request fit needs the node's trace
    serving_after_job: str = ""
    # its point command's validate option saying that a sampler outside the run meters it (every job's `jpwr serve`):
    # what the driver's checks of a sampler-bound option (inference's --objective energy) count, as the run counts it
    validate_external_sampler: str = ""

    @property
    def sweep_keys(self) -> tuple[str, ...]:
        """The XML's `sweep` parameterset, in its order."""
        return sweep_keys(self.driver)

    @property
    def work_unit(self) -> str:
        """The unit of the throughput and energy columns where the record names none."""
        return work_unit(self.driver)

    def command_of(self, value: dict[str, str]) -> str:
        """The driver's command for a point: serving where it has a rate and the driver serves."""
        return self.serving_command if self.serving_command and value.get("rate") else self.command

    def model_of(self, tagged: list[str], profile: dict[str, str], value: dict[str, str]) -> str:
        """The model of a point: its framework's, the model tag's, else the profile's default."""
        if self.framework_tags:
            return f"{self.driver}-{value.get('framework') or self.framework_tags[0]}"
        return tagged[0] if tagged else profile[self.default_model_key]


WORKLOADS = {w.name: w for w in (
    Workload(name="llm", driver="llm_training", command="train", serving_command="",
             arguments=jbarguments.llm_arguments, profile_prefix="llm", startup_key="startup_s_{model}",
             default_model_key="default_model", batch_key="gbs_{model}", model_tags=MODEL_TAGS,
             nodes_by_model=True, table_columns=TRAINING_COLUMNS),
    Workload(name="resnet50", driver="resnet50", command="train", serving_command="",
             arguments=jbarguments.resnet_arguments, profile_prefix="resnet", startup_key="resnet_startup_s",
             default_model_key="default_model", batch_key="resnet_gbs",
             framework_tags=FRAMEWORK_TAGS, table_columns=TRAINING_COLUMNS),
    Workload(name="inference", driver="llm_inference", command="run", serving_command="load",
             arguments=jbarguments.inference_arguments, profile_prefix="inference",
             startup_key="inference_startup_s", default_model_key="inference_preset",
             model_tags=INFERENCE_MODEL_TAGS, one_device=True, self_stop=False, table_columns=INFERENCE_COLUMNS,
             request_shares=True, serving_after_job="request-energy", validate_external_sampler="--external-sampler"),
)}
BY_DRIVER = {w.driver: w for w in WORKLOADS.values()}
