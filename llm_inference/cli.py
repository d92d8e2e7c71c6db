"""`python -m llm_inference {run,validate,load,validate-load,request-energy,save-checkpoint}`: the JUBE workflows'
command line.

`run` measures static batches (one record per task and batch size); `load` serves an open-loop load with
continuous batching (one record per rate). Each has its `validate` twin that accepts exactly its options.
`request-energy` fits a load run's per-request energy once an external sampler wrote its trace (after the run).
`save-checkpoint` writes a preset as a local checkpoint that HTTP inference servers load.

Validation runs before any device work; a ValidationError prints "<problem>. Fix: <fix>" on stderr
and exits with ExitCode.USAGE (64).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from joulebench.arguments import GIB, SEED, state_ranges
from joulebench.boundary import exit_code_of
from joulebench.host_memory import HOST, available_gib
from jpwr import ExitCode, ValidationError
from jpwr.errors import ArgumentParser, take_debug_flag
from llm_inference.config import InferenceConfig, add_run_arguments, resolve
from llm_inference.load_config import LoadConfig, add_load_arguments, rate_label, resolve_load
from llm_inference.presets import ModelPreset

if TYPE_CHECKING:  # the arrivals bring numpy: not for `--help`
    from llm_inference.arrivals import Request


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog="python -m llm_inference", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="measure time and energy; one run_record.json per (task, batch size)")
    add_run_arguments(run)
    validate = commands.add_parser("validate", help="check a configuration without a GPU (JUBE calls this)")
    add_run_arguments(validate)
    load = commands.add_parser("load", help="serve an open-loop load (continuous batching); one record per rate")
    add_load_arguments(load)
    validate_load = commands.add_parser("validate-load", help="check a load configuration without a GPU")
    add_load_arguments(validate_load)
    for checker in (validate, validate_load):
        checker.add_argument("--device-memory-gib", type=GIB, help="device memory for the fit estimate")
    validate.add_argument("--external-sampler", action="store_true",
                          help="the run will be metered by a jpwr sampler outside it (`jpwr -- ...`, a JUBE job's "
                               "`jpwr serve`; JPWR_ADDR set counts as one, as for run): --objective energy or edp "
                               "needs a sampler, this or --energy-methods")
    energy = commands.add_parser("request-energy", help="fit a load run's per-request energy after it, on the trace "
                                                        "an external sampler wrote (a JUBE job runs this)")
    energy.add_argument("--run", required=True, type=Path, help="the load's --out-dir")
    energy.add_argument("--trace", type=Path, help="the directory of <node>/trace.h5 (default: RUN/energy, a JUBE "
                                                   "job's)")
    save = commands.add_parser("save-checkpoint", help="save a preset (random weights, word tokenizer) for servers")
    save.add_argument("--preset", required=True, help="model preset to save")
    save.add_argument("--out", required=True, type=Path, help="checkpoint directory (new or empty)")
    save.add_argument("--seed", type=SEED, default=1234, help="seed of the random weights")
    save.add_argument("--precision", choices=("bf16", "fp16", "fp32"), default="bf16", help="dtype of the weights")
    save.add_argument("--force", action="store_true", help="replace a non-empty --out")
    return state_ranges(parser)


def _checked(args: argparse.Namespace) -> tuple[InferenceConfig, ModelPreset]:
    from llm_inference import validation

    cfg = resolve(args)
    return cfg, validation.check_config(cfg)


def _memory_on(cfg: InferenceConfig | LoadConfig, shape: ModelPreset, device_type: str,
               device_memory_gib: float | None, trace: list[Request] | None = None) -> str:
    """The checks of a run on the device it uses, the one implementation of validate (`--device auto` resolved as
    the run resolves it on this host) and of the run once torch has chosen its device: a decode variant the device
    cannot run, the device's memory where known, and on the CPU the host's (refuse what the kernel would kill
    mid-run). Returns the precision."""
    from llm_inference import validation

    validation.check_decode_device(cfg.decode_tuning, device_type)
    precision = validation.resolve_precision(cfg.precision, device_type)
    holders = [(device_memory_gib, "the device")] + ([(available_gib(), HOST)] if device_type == "cpu" else [])
    for memory_gib, holder in holders:
        if isinstance(cfg, LoadConfig):
            validation.check_load_memory(cfg, shape, precision, memory_gib, trace, holder)
        else:
            validation.check_memory(cfg, shape, precision, memory_gib, holder)
    return precision


def _external_sampler() -> bool:
    """A jpwr sampler outside this process meters the run (`jpwr -- ...` and JUBE jobs set JPWR_ADDR)."""
    return bool(os.environ.get("JPWR_ADDR"))


def _use_compile_cache(value: str | None, device_type: str) -> None:
    """The compiled decode's caches (joulebench.compile_cache), checked and in use before the model is built: the
    compact engines compile their decode pieces on GPUs only."""
    from joulebench.compile_cache import check

    if device_type == "cuda":
        check(value).activate()
    elif value is not None:
        raise ValidationError(f"--compile-cache {value} on the {device_type}: the decode is compiled on GPUs only",
                              "drop --compile-cache")


def _validate(args: argparse.Namespace) -> int:
    from joulebench.torch_device import device_type
    from llm_inference import validation

    cfg, shape = _checked(args)
    validation.check_objective_sensor(cfg, args.external_sampler or _external_sampler())
    precision = _memory_on(cfg, shape, device_type(args.device, args.device_memory_gib), args.device_memory_gib)
    print(f"OK {shape.name} ({shape.parameter_count() / 1e9:.2f}B parameters, {precision}): tasks "
          f"{', '.join(cfg.tasks)}; batch sizes {', '.join(map(str, cfg.batch_sizes))}; "
          f"{len(cfg.points)} run record(s)")
    return ExitCode.OK


def _run(args: argparse.Namespace) -> int:
    from joulebench.launch import LaunchEnv
    from joulebench.out_dir import check_out_dir
    from llm_inference import validation

    cfg, shape = _checked(args)
    launch = LaunchEnv.from_env()
    external_sampler = _external_sampler()
    validation.check_launch(launch.world_size, len(cfg.points), external_sampler, cfg.tensor_parallel, launch.num_nodes)
    validation.check_objective_sensor(cfg, external_sampler)
    check_out_dir(cfg.out_dir)  # before importing torch (seconds): refusals are quick
    from joulebench.torch_device import resolve_device
    from llm_inference import runner

    device = resolve_device(cfg.device)
    _memory_on(cfg, shape, device.type, None)
    _use_compile_cache(args.compile_cache, device.type)
    return runner.run(cfg, shape, launch, device)


def _validate_load(args: argparse.Namespace) -> int:
    from joulebench.torch_device import device_type
    from llm_inference import validation

    cfg = resolve_load(args)
    shape, trace = validation.check_load_config(cfg)
    precision = _memory_on(cfg, shape, device_type(args.device, args.device_memory_gib), args.device_memory_gib,
                           trace)
    load = f"trace {cfg.trace}" if cfg.trace else f"rates {', '.join(rate_label(r) for r in cfg.rates)}"
    print(f"OK {shape.name} ({shape.parameter_count() / 1e9:.2f}B parameters, {precision}): task {cfg.task}; {load}; "
          f"{cfg.max_concurrency} rows (requests decoded together at most)")
    return ExitCode.OK


def _load(args: argparse.Namespace) -> int:
    from joulebench.launch import LaunchEnv
    from joulebench.out_dir import check_out_dir
    from llm_inference import validation

    cfg = resolve_load(args)
    shape, trace = validation.check_load_config(cfg)
    launch = LaunchEnv.from_env()
    points = len(cfg.rates) or 1
    validation.check_launch(launch.world_size, points, _external_sampler(), cfg.tensor_parallel,
                            launch.num_nodes)
    check_out_dir(cfg.out_dir)  # before importing torch (seconds): refusals are quick
    from joulebench.torch_device import resolve_device
    from llm_inference import load

    if cfg.server is not None:
        from llm_inference import http_load

        return http_load.run(cfg, shape, trace, launch)
    device = resolve_device(cfg.device)
    _memory_on(cfg, shape, device.type, None, trace)
    _use_compile_cache(args.compile_cache, device.type)
    return load.run(cfg, shape, trace, launch, device)


def _request_energy(args: argparse.Namespace) -> int:
    from joulebench.reasons import clip
    from jpwr.errors import WIDTH
    from llm_inference.recorded_energy import fit_run

    prefix = "[llm_inference] "  # each rate's line within WIDTH: the record has every reason in full
    fit_run(args.run, args.trace, lambda line: print(prefix + clip(line, WIDTH - len(prefix)), flush=True))
    return ExitCode.OK


def _save_checkpoint(args: argparse.Namespace) -> int:
    from llm_inference.checkpoint import save_checkpoint

    print(save_checkpoint(args.preset, args.out, args.precision, args.seed, args.force))
    return ExitCode.OK


def main(argv: Sequence[str] | None = None) -> int:
    debug, rest = take_debug_flag(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(rest)
    handlers = {"run": _run, "validate": _validate, "load": _load, "validate-load": _validate_load,
                "request-energy": _request_energy, "save-checkpoint": _save_checkpoint}
    return exit_code_of("llm_inference", lambda: handlers[args.command](args), debug, torch_extra="inference")
