"""`python -m resnet50 train`: checks, backend, windows and figures; the run's life is joulebench.lifecycle's.

Rank 0 writes `<out-dir>/run_record.json` on every outcome (OK, TIMEOUT at a stop request, FAILED with the
reason) and prints the JOULEBENCH_RESULT line last; the exit code follows the status (docs/run-record.md).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from joulebench.compile_cache import CompileCache, FirstStepCompile, check, compile_seconds
from joulebench.launch import LaunchEnv
from joulebench.lifecycle import Lifecycle
from joulebench.loop import STEP_TIMES_BASIS, LoopResult, Progress, TrainSteps, run_loop
from joulebench.node_facts import gpu_node_facts
from joulebench.out_dir import check_out_dir
from joulebench.peaks import peak_flops
from joulebench.phases import check_replay_seconds, replay_phases
from joulebench.record import RunRecord, steady_metrics
from joulebench.record_types import ResNetMetrics, SteadyFigures
from jpwr import ADDR_ENV
from resnet50.backend import Backend, load_backend
from resnet50.config import TrainConfig, check_devices, check_static
from resnet50.flops import resnet50_flops

WORK_UNIT = "images"


def train(config: TrainConfig) -> int:
    """Run one benchmark; returns the process exit code. Validation errors propagate (nothing ran yet)."""
    started = time.monotonic()
    launch = LaunchEnv.from_env()
    check_static(config)
    check_replay_seconds(config.replay_phases, bool(config.energy_methods or os.environ.get(ADDR_ENV)))
    module = load_backend(config.framework)
    devices, device_kind = module.discover(config, launch)
    check_devices(config, devices, device_kind)
    cache = check(config.compile_cache) if config.compile else None
    first = FirstStepCompile(triton=device_kind == "cuda") if cache else None  # torch's timers of the compile
    out_dir = Path(str(config.out_dir))
    check_out_dir(out_dir)
    spec = config.loop_spec()
    backend: Backend | None = None
    loop: LoopResult | None = None
    with Lifecycle("resnet50", launch, config.exit_duration_mins, started) as life:
        with life.run(str(config.run_id), out_dir, config.to_dict(devices),
                      metrics=lambda record: _metrics(record, config, loop, cache, first),
                      gather=lambda obj: backend.gather(obj) if backend else [obj], log_to=config.log_to) as run:
            meter = run.open_meter(methods=config.energy_methods)
            if cache is not None:
                cache.activate()
            backend = module.create(config, launch)
            run.record.hardware = {**backend.hardware(), **gpu_node_facts(backend.device_kind)}
            meter.sync = backend.sync
            run.idle_baseline(config.idle_baseline, backend.device_kind == "cuda", backend.gather)
            backend.mark_phases(meter.phases)
            step = first.wrap(backend.train_step) if first else backend.train_step
            steps = TrainSteps(step=step, loss=backend.loss_value, any_rank=backend.any_rank,
                               gather=backend.gather, sync=backend.sync)
            loop = run_loop(steps, meter, spec, life.stop, backend.device_kind,
                            Progress("resnet50", spec, launch.is_global_zero),
                            run.intervals(spec.work_unit, spec.work_per_step, devices))
            run.record.meter["steady_plan"] = loop.plan.to_dict() if loop.plan else None
            run.step_times(loop.step_times_s, STEP_TIMES_BASIS)
            if loop.stop_reason:
                run.stopped_early(loop.completed, loop.planned, config.warmup_iterations)
            elif config.replay_phases:  # a stopped run has no time to spare
                replay_phases(meter, backend.phase_replays(), config.replay_phases, lambda n: max(backend.gather(n)),
                              (lambda text: print(f"[resnet50] {text}", flush=True)) if launch.is_global_zero else None,
                              life.stop.local_reason)
        rate = run.record.metrics.get(f"{WORK_UNIT}_per_s")
        if config.caraml_output and rate is not None and launch.is_global_zero:
            print(f"total images/sec: {rate:.2f}", flush=True)  # tf_cnn_benchmarks' line: global steady rate
        if backend is not None:
            backend.close()
        return life.exit_code()


def _metrics(record: RunRecord, config: TrainConfig, loop: LoopResult | None, cache: CompileCache | None,
             first: FirstStepCompile | None) -> ResNetMetrics:
    flops = resnet50_flops(config.variant, config.image_size)
    devices = int(record.config["devices"])
    steady = record.window("steady")
    headline: SteadyFigures = {"work_unit": WORK_UNIT}
    if steady is not None and steady.steps > 0:
        peak = peak_flops(str(record.hardware.get("device_name", "")), config.precision)
        headline = steady_metrics(steady, WORK_UNIT, devices, flops_per_unit=flops.training, peak_flops_per_device=peak)
    warmup = record.window("warmup")
    return {
        **headline, **flops.to_dict(),
        "global_batch_size": config.global_batch_size, "per_device_batch_size": config.per_device_batch(devices),
        "devices": devices, "precision": config.precision, "framework": config.framework,
        "warmup_excluded": {"iterations": warmup.steps, "duration_s": warmup.duration_s} if warmup else None,
        # what compiled the step ("eager", the torch.compile mode, "xla", "tf.function") and what it cost: the
        # warm-up window (compilation, CUDA-graph recording, cuDNN autotuning) and its first step alone
        "compile_mode": config.compile_label,
        "warmup_s": warmup.duration_s if warmup else None,
        "first_step_s": loop.first_step_s if loop else None,
        "compile_s": compile_seconds(warmup.duration_s if warmup else None, bool(config.compile)),
        "compile_cache": cache.figures() if cache else None,
        # where the first step's seconds went, by torch's own timers, and the Triton autotuning in it
        "compile_phases_s": first.phases(loop.first_step_s if loop else None) if first else None,
        "compile_autotune": first.autotune() if first else None,
        "losses": [list(point) for point in loop.losses] if loop else [],
        "loss_first": loop.losses[0][1] if loop and loop.losses else None,
        "loss_last": loop.losses[-1][1] if loop and loop.losses else None,
        "iterations_completed": loop.completed if loop else 0,
    }
