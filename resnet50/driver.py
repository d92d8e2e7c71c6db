"""`python -m resnet50 train`: checks, backend, windows, energy and the run record.

Rank 0 writes `<out-dir>/run_record.json` on every outcome: OK, FAILED (exception, with the
reason) or TIMEOUT (SIGTERM, e.g. Slurm's time limit), so a job that died still leaves a
record saying why. The JOULEBENCH_RESULT line is the last line rank 0 prints.
"""

from __future__ import annotations

import contextlib
import signal
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from jpwr.launch import LaunchEnv
from jpwr.meter import WindowMeter, combine_energies
from jpwr.record import RunRecord, WindowEnergy, software_versions, steady_metrics, summary_line, write_run_record
from resnet50.backend import Backend, load_backend
from resnet50.config import TrainConfig, check_devices, check_static
from resnet50.flops import resnet50_flops
from resnet50.loop import WORK_UNIT, LoopResult, run_loop

EXIT_FAILED = 1
EXIT_TIMEOUT = 124  # like coreutils `timeout`: the run was stopped from outside


class RunInterrupted(Exception):
    """SIGTERM arrived (Slurm time limit, scancel): stop and write a TIMEOUT record."""


@contextlib.contextmanager
def _sigterm_raises() -> Iterator[None]:
    def handler(signum: int, _frame: object) -> None:
        raise RunInterrupted(f"received signal {signal.Signals(signum).name}")

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def train(config: TrainConfig) -> int:
    """Run one benchmark; returns the process exit code. Validation errors propagate (nothing ran yet)."""
    started = time.monotonic()
    launch = LaunchEnv.from_env()
    check_static(config)
    module = load_backend(config.framework)
    devices, device_kind = module.discover(config, launch)
    check_devices(config, devices, device_kind)
    record = RunRecord(
        benchmark="resnet50", run_id=str(config.run_id), config=config.to_dict(devices),
        launch=launch.to_dict(), software=software_versions(),
    )
    meter = WindowMeter.open(launch, methods=config.energy_methods, out_dir=config.out_dir)
    backend: Backend | None = None
    loop: LoopResult | None = None
    try:
        with _sigterm_raises():
            backend = module.create(config, launch)
            record.hardware = backend.hardware()
            meter.sync = backend.sync
            deadline = None if config.exit_duration_mins is None else started + 60.0 * config.exit_duration_mins
            loop = run_loop(backend, meter, config, deadline, verbose=launch.is_global_zero)
            _attach_energy(meter, backend, launch)
    except RunInterrupted as exc:
        record.status, record.status_reason = "TIMEOUT", str(exc)
    except Exception as exc:
        traceback.print_exc()
        record.status, record.status_reason = "FAILED", f"{type(exc).__name__}: {exc}"
    finally:
        meter.close()
    record.windows = meter.windows
    record.metrics = _metrics(record, config, loop)
    if launch.is_global_zero:
        _report(record, config)
    if backend is not None:
        backend.close()
    return {"OK": 0, "FAILED": EXIT_FAILED, "TIMEOUT": EXIT_TIMEOUT}[record.status]


def _attach_energy(meter: WindowMeter, backend: Backend, launch: LaunchEnv) -> None:
    """Node leaders ask their sampler; rank 0 sums the nodes onto its windows."""
    mine = {name: energy.to_dict() for name, energy in meter.node_energy().items()}
    gathered = backend.gather([launch.is_node_leader, mine])
    per_node = [{k: WindowEnergy.from_dict(v) for k, v in energies.items()} for leader, energies in gathered if leader]
    combined = combine_energies(per_node)
    for window in meter.windows:
        window.energy = combined.get(window.name)


def _metrics(record: RunRecord, config: TrainConfig, loop: LoopResult | None) -> dict[str, Any]:
    flops = resnet50_flops(config.variant, config.image_size)
    devices = int(record.config["devices"])
    steady = record.window("steady")
    metrics: dict[str, Any] = {"work_unit": WORK_UNIT}
    if steady is not None and steady.steps > 0:
        metrics = steady_metrics(steady, WORK_UNIT, devices=devices, flops_per_unit=flops.training)
    warmup = record.window("warmup")
    metrics.update(flops.to_dict())
    metrics.update(
        global_batch_size=config.global_batch_size, per_device_batch_size=config.per_device_batch(devices),
        devices=devices, precision=config.precision, framework=config.framework,
        warmup_excluded={"iterations": warmup.steps, "duration_s": warmup.duration_s} if warmup else None,
        losses=[list(point) for point in loop.losses] if loop else [],
        loss_first=loop.losses[0][1] if loop and loop.losses else None,
        loss_last=loop.losses[-1][1] if loop and loop.losses else None,
        stopped_early=loop.stopped_early if loop else None,
    )
    return metrics


def _report(record: RunRecord, config: TrainConfig) -> None:
    path = write_run_record(Path(str(config.out_dir)) / "run_record.json", record)
    print(f"[resnet50] run record: {path}", flush=True)
    rate = record.metrics.get(f"{WORK_UNIT}_per_s")
    if config.caraml_output and rate is not None:
        print(f"total images/sec: {rate:.2f}", flush=True)  # tf_cnn_benchmarks' line: global steady rate
    print(summary_line(record), flush=True)
