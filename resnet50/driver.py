"""`python -m resnet50 train`: checks, backend, windows, energy and the run record.

Rank 0 writes `<out-dir>/run_record.json` on every outcome: OK, FAILED (exception, with the
reason) or TIMEOUT (SIGTERM, e.g. Slurm's time limit, or --exit-duration-mins, counted from the
driver's start like Megatron-LM). A TIMEOUT stop is clean: the steady window covers the
iterations completed and its metrics are a valid measurement of them. The JOULEBENCH_RESULT
line is the last line rank 0 prints.
"""

from __future__ import annotations

import os
import signal
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

from joulebench.launch import LaunchEnv
from joulebench.peaks import peak_flops
from joulebench.phases import check_replay_seconds, replay_phases
from joulebench.record import RunRecord, software_versions, steady_metrics, summary_line, write_run_record
from joulebench.runcontrol import StopRequest
from jpwr import ADDR_ENV, OutputDirError, WindowMeter
from resnet50.backend import Backend, load_backend
from resnet50.config import TrainConfig, check_devices, check_static
from resnet50.flops import resnet50_flops
from resnet50.loop import WORK_UNIT, LoopResult, run_loop

EXIT_FAILED = 1
EXIT_TIMEOUT = 124  # like coreutils `timeout`: a signal arrived and the run could not stop cleanly


def train(config: TrainConfig) -> int:
    """Run one benchmark; returns the process exit code. Validation errors propagate (nothing ran yet)."""
    started = time.monotonic()
    launch = LaunchEnv.from_env()
    check_static(config)
    check_replay_seconds(config.replay_phases, bool(config.energy_methods or os.environ.get(ADDR_ENV)))
    module = load_backend(config.framework)
    devices, device_kind = module.discover(config, launch)
    check_devices(config, devices, device_kind)
    _check_out_dir(Path(str(config.out_dir)))
    record = RunRecord(
        benchmark="resnet50", run_id=str(config.run_id), config=config.to_dict(devices),
        launch=launch.to_dict(), software=software_versions(),
    )
    meter = WindowMeter.open(launch, methods=config.energy_methods, out_dir=Path(str(config.out_dir)) / "jpwr")
    record.meter = {"sampler": meter.has_sampler, "energy_methods": config.energy_methods}
    stop = StopRequest.after(config.exit_duration_mins, started)
    previous_handler = signal.signal(signal.SIGTERM, stop.on_signal)
    backend: Backend | None = None
    loop: LoopResult | None = None
    exit_code = 0  # a clean early stop (TIMEOUT with a valid steady window) still exits 0, like llm_training
    try:
        backend = module.create(config, launch)
        record.hardware = backend.hardware()
        meter.sync = backend.sync
        meter.take_idle_baseline(config.idle_baseline, backend.device_kind == "cuda", backend.gather)
        backend.mark_phases(meter.phases)
        loop = run_loop(backend, meter, config, stop, verbose=launch.is_global_zero)
        if config.replay_phases and not loop.stop_reason:  # a stopped run has no time to spare
            replay_phases(meter, backend.phase_replays(), config.replay_phases, lambda n: max(backend.gather(n)))
        if loop.stop_reason:
            record.status = "TIMEOUT"
            record.status_reason = (
                f"{loop.stop_reason}: stopped cleanly after {loop.completed} of "
                f"{loop.planned or 'the not yet planned'} iterations (warm-up included); the steady window covers "
                "the iterations completed"
            )
        meter.attach_energy(backend.gather)
    except (Exception, KeyboardInterrupt) as exc:
        traceback.print_exc()
        record.status = "TIMEOUT" if stop.signal_name else "FAILED"
        record.status_reason = f"{type(exc).__name__}: {exc}"
        exit_code = EXIT_TIMEOUT if stop.signal_name else EXIT_FAILED
    finally:
        signal.signal(signal.SIGTERM, previous_handler)
        meter.close()
    record.windows = meter.windows
    record.meter.update(steady_plan=loop.plan.to_dict() if loop and loop.plan else None,
                        idle_baseline=meter.idle.to_dict() if meter.idle else None)
    record.metrics = _metrics(record, config, loop)
    if launch.is_global_zero:
        _report(record, config)
    if backend is not None:
        backend.close()
    return exit_code


def _check_out_dir(out_dir: Path) -> None:
    """Fail before device work if the run record could not be written at the end."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out_dir, prefix=".write-test-"):
            pass
    except OSError as exc:
        raise OutputDirError(f"--out-dir {out_dir} cannot be written ({exc}); pass a writable directory") from None


def _metrics(record: RunRecord, config: TrainConfig, loop: LoopResult | None) -> dict[str, Any]:
    flops = resnet50_flops(config.variant, config.image_size)
    devices = int(record.config["devices"])
    steady = record.window("steady")
    metrics: dict[str, Any] = {"work_unit": WORK_UNIT}
    if steady is not None and steady.steps > 0:
        peak = peak_flops(str(record.hardware.get("device_name", "")), config.precision)
        metrics = steady_metrics(steady, WORK_UNIT, devices, flops_per_unit=flops.training, peak_flops_per_device=peak)
    warmup = record.window("warmup")
    metrics.update(flops.to_dict())
    metrics.update(
        global_batch_size=config.global_batch_size, per_device_batch_size=config.per_device_batch(devices),
        devices=devices, precision=config.precision, framework=config.framework,
        warmup_excluded={"iterations": warmup.steps, "duration_s": warmup.duration_s} if warmup else None,
        losses=[list(point) for point in loop.losses] if loop else [],
        loss_first=loop.losses[0][1] if loop and loop.losses else None,
        loss_last=loop.losses[-1][1] if loop and loop.losses else None,
        iterations_completed=loop.completed if loop else 0,
    )
    return metrics


def _report(record: RunRecord, config: TrainConfig) -> None:
    path = write_run_record(Path(str(config.out_dir)) / "run_record.json", record)
    print(f"[resnet50] run record: {path}", flush=True)
    rate = record.metrics.get(f"{WORK_UNIT}_per_s")
    if config.caraml_output and rate is not None:
        print(f"total images/sec: {rate:.2f}", flush=True)  # tf_cnn_benchmarks' line: global steady rate
    print(summary_line(record), flush=True)
