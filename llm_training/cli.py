"""`python -m llm_training {train,validate,preprocess}`: the command line the JUBE workflow calls.

Validation runs before any device work; a ValidationError prints "<problem>. Fix: <fix>" on stderr
and exits with ExitCode.USAGE (64).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from joulebench.arguments import GIB, NODES, state_ranges
from joulebench.boundary import exit_code_of
from jpwr import ExitCode
from jpwr.errors import ArgumentParser, take_debug_flag
from llm_training.config import TrainConfig, add_run_arguments, resolve


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog="python -m llm_training", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    train = commands.add_parser("train", help="train a GPT preset and write <out-dir>/run_record.json")
    add_run_arguments(train)
    validate = commands.add_parser("validate", help="check a configuration without a GPU (JUBE calls this)")
    add_run_arguments(validate)
    layout = validate.add_argument_group("job layout (train reads it from torchrun/srun)")
    layout.add_argument("--world-size", type=NODES)
    layout.add_argument("--nodes", type=NODES)
    layout.add_argument("--devices-per-node", type=NODES)
    layout.add_argument("--device-memory-gib", type=GIB, help="device memory for the fit estimate")
    prep = commands.add_parser("preprocess", help="JSONL text -> Megatron PREFIX.bin/.idx")
    prep.add_argument("--input", required=True, help="JSON lines, one document per line")
    prep.add_argument("--output-prefix", required=True)
    prep.add_argument("--tokenizer-json", help="a `tokenizers` tokenizer.json")
    prep.add_argument("--vocab-file", help="GPT-2 vocab.json (with --merges-file)")
    prep.add_argument("--merges-file", help="GPT-2 merges.txt")
    prep.add_argument("--json-key", default="text")
    prep.add_argument("--eod-token", help="end-of-document token (default: <|endoftext|> or similar)")
    return state_ranges(parser)


def resolve_checked(args: argparse.Namespace, world_size: int) -> TrainConfig:
    """Preset name, resolution and every configuration check (no device needed)."""
    from llm_training import validation

    validation.check_model_name(args.model)
    cfg = resolve(args, world_size)
    validation.check_config(cfg)
    return cfg


def _validate(args: argparse.Namespace) -> int:
    from llm_training import memory, validation
    from llm_training.corpus import check_corpus

    world = args.world_size
    if world is None:
        world = (args.nodes or 1) * (args.devices_per_node or 1)
    validation.check_layout(world, args.nodes, args.devices_per_node)
    cfg = resolve_checked(args, world)
    if cfg.data_path:  # the login node's check (JUBE validate); train reads it again where it builds the dataset
        check_corpus(cfg.data_path, cfg.seq_length, cfg.vocab_size)
    from joulebench.torch_device import device_type as run_device_type

    device_type = run_device_type(args.device, args.device_memory_gib)
    cfg = memory.choose_micro_batch(cfg, None if device_type == "cpu" else args.device_memory_gib)
    validation.check_on_device(cfg, device_type, -(-world // (args.nodes or 1)),
                               None if device_type == "cpu" else args.device_memory_gib)
    estimate = memory.estimate_memory(cfg)
    capacity = f" of {args.device_memory_gib:.1f} GiB" if args.device_memory_gib is not None else ""
    print(
        f"OK {cfg.model} ({cfg.profile}): world {cfg.world_size} = TP {cfg.tensor_parallel} × PP "
        f"{cfg.pipeline_parallel} × DP {cfg.data_parallel}; {cfg.precision}, MBS {cfg.micro_batch_size} "
        f"({cfg.micro_batch_size_from}), "
        f"GBS {cfg.global_batch_size} ({cfg.num_microbatches} micro-batches per replica), recompute "
        f"{cfg.recompute}, sequence parallel {cfg.sequence_parallel}; estimated {estimate.total_gib:.1f} "
        f"GiB/device{capacity}"
    )
    warning = memory.fit_warning(cfg, args.device_memory_gib)
    if warning:
        print(warning, file=sys.stderr)
    return ExitCode.OK


def _train(args: argparse.Namespace) -> int:
    from joulebench.launch import LaunchEnv
    from joulebench.out_dir import check_out_dir
    from joulebench.phases import check_replay_seconds
    from jpwr import ADDR_ENV

    launch = LaunchEnv.from_env()
    cfg = resolve_checked(args, launch.world_size)  # before importing Megatron (tens of seconds): refusals are quick
    check_out_dir(cfg.out_dir)
    check_replay_seconds(cfg.replay_phases_s, bool(cfg.energy_methods or os.environ.get(ADDR_ENV)))
    from joulebench.progress import Heartbeat

    def log(text: str) -> None:
        if launch.is_global_zero:
            print(f"[llm_training] {text}", flush=True)

    with Heartbeat(log) as beat:  # the imports take 5 s on an idle 2-core machine, longer on a busy one
        beat.begin("loading torch and Megatron-Core")
        beat.say("loading torch and Megatron-Core")
        import torch

        from joulebench.torch_device import resolve_device
        from llm_training import memory, validation

        device = resolve_device(cfg.device)
        cuda_memory = (torch.cuda.get_device_properties(device).total_memory / memory.GIB if device.type == "cuda"
                       else None)
        cfg = memory.choose_micro_batch(cfg, cuda_memory)  # every rank alike: a node's GPUs are of one kind
        capability = torch.cuda.get_device_capability() if device.type == "cuda" else None
        validation.check_on_device(cfg, device.type, launch.local_world_size, cuda_memory, capability,
                                   is_rocm=torch.version.hip is not None)
        from joulebench.compile_cache import check

        cache = check(cfg.compile_cache) if cfg.compiles(device.type) else None  # here, not in validate: node-local
        from llm_training import train  # megatron-core: tens of seconds, after every refusal
    return train.run(cfg, launch, device, cache)


def _preprocess(args: argparse.Namespace) -> int:
    from llm_training.preprocess import load_tokenizer, preprocess

    tokenizer = load_tokenizer(args.tokenizer_json, args.vocab_file, args.merges_file)
    stats = preprocess(args.input, args.output_prefix, tokenizer, args.json_key, args.eod_token)
    print(f"wrote {args.output_prefix}.bin/.idx: {stats['documents']} documents, {stats['tokens']} tokens, "
          f"vocab {stats['vocab_size']}, eod id {stats['eod_token']}")
    return ExitCode.OK


def main(argv: Sequence[str] | None = None) -> int:
    debug, rest = take_debug_flag(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(rest)
    handlers = {"train": _train, "validate": _validate, "preprocess": _preprocess}
    return exit_code_of("llm_training", lambda: handlers[args.command](args), debug, torch_extra="llm")
