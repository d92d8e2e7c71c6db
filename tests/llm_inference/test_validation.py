"""Configuration checks through the `validate` and `run` commands: clear errors, exit 64, no device work."""

from __future__ import annotations

import pytest

from jpwr.errors import ExitCode, ValidationError
from llm_inference import memory, validation
from llm_inference.cli import main
from llm_inference.presets import PRESETS


def call(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--preset", "llama-405b"], ["unknown preset --preset 'llama-405b'",
                                      "tiny, gpt2, llama-1b, llama-8b, llama-70b"]),
        (["--preset", "tiny", "--task", "chat,poetry"], ["unknown task --task 'poetry'", "summarization"]),
        (["--preset", "llama-8b", "--task", "summarization", "--batch-sizes", "1,8,512", "--device-memory-gib", "80"],
         ["batch size 512 of task 'summarization' on llama-8b (bf16, engine static) needs an estimated", "80.0 GiB",
          "use batch sizes up to 128"]),
        (["--preset", "llama-8b", "--task", "summarization", "--batch-sizes", "128", "--engine", "hf",
          "--device-memory-gib", "80"], ["(bf16, engine hf)", "use batch sizes up to 64"]),
        (["--preset", "llama-8b", "--batch-sizes", "1,256,1024", "--device-memory-gib", "79.2"],
         ["batch size 1024 of task 'chat'", "CUDA graphs", "use batch sizes up to 512"]),
        (["--preset", "tiny", "--attention", "eager"], ["--attention eager", "use --engine hf"]),
        (["--preset", "llama-8b", "--device-memory-gib", "8"], ["needs an estimated", "smaller model"]),
        (["--preset", "gpt2", "--task", "summarization"],
         ["task 'summarization' needs up to 3232 positions", "gpt2 has 1024"]),
        (["--checkpoint", "/nonexistent/ckpt"], ["--checkpoint '/nonexistent/ckpt' has no config.json"]),
    ],
)
def test_invalid_configurations_name_the_value_and_the_fix(capsys, args, expected):
    for command in ("validate", "run"):  # run refuses the same input before touching a device
        if command == "run" and "--device-memory-gib" in args:
            continue  # run reads the memory from the device itself
        code, out, err = call(capsys, command, *args)
        assert code == ExitCode.USAGE, (command, out, err)
        assert "Fix:" in err
        for text in expected:
            assert text in err


@pytest.mark.parametrize("args", [["--batch-sizes", "2,0"], ["--num-batches", "0"], ["--output-length", "0"]])
def test_counts_below_one_are_refused_by_the_parser(capsys, args):
    for command in ("validate", "run"):
        with pytest.raises(SystemExit) as ended:
            call(capsys, command, "--preset", "tiny", *args)
        assert ended.value.code == 2 and args[0] in capsys.readouterr().err


def test_valid_sweep_reports_points_and_precision(capsys):
    code, out, err = call(capsys, "validate", "--preset", "llama-8b", "--task", "chat,code", "--batch-sizes",
                          "1,2,4,8,16,32,64", "--device-memory-gib", "79.2")
    assert code == ExitCode.OK, err
    assert "llama-8b (8.03B parameters, bf16)" in out and "14 run record(s)" in out
    # The static engine's cache and prefill groups let llama-8b reach batch 256 on an 80 GB GPU with the chat task.
    code, out, err = call(capsys, "validate", "--preset", "llama-8b", "--batch-sizes", "1,8,64,256",
                          "--device-memory-gib", "79.2")
    assert code == ExitCode.OK, err


def test_sweep_under_one_external_sampler_and_several_processes_are_refused():
    with pytest.raises(ValidationError, match="merge their same-named windows"):
        validation.check_launch(1, points=2, external_sampler=True)
    with pytest.raises(ValidationError, match="started as 4 processes"):
        validation.check_launch(4, points=1, external_sampler=False)
    validation.check_launch(1, points=5, external_sampler=False)  # in-process metering: one sampler per point


@pytest.mark.parametrize("engine", memory.ENGINES)
def test_memory_estimate_parts_follow_the_shape(engine):
    shape = PRESETS["llama-8b"]
    one = memory.estimate_memory(shape, "bf16", 1, 1024, 1280, engine)
    assert one.weights_gib == pytest.approx(8.03e9 * 2 / 1024**3, rel=1e-3)
    # Llama-3.1-8B KV cache: 2 · 32 layers · 8 KV heads · 128 · 2 B = 128 KiB per token.
    assert shape.kv_bytes_per_token(2) == 128 * 1024
    four = memory.estimate_memory(shape, "bf16", 4, 1024, 1280, engine)
    assert four.kv_cache_gib == pytest.approx(4 * one.kv_cache_gib)
    assert four.weights_gib == one.weights_gib
    fits = memory.largest_fitting_batch(
        lambda size: memory.estimate_memory(shape, "bf16", size, 1024, 1280, engine).total_gib, 80.0)
    assert memory.estimate_memory(shape, "bf16", fits, 1024, 1280, engine).total_gib <= 80.0
    assert memory.estimate_memory(shape, "bf16", 2 * fits, 1024, 1280, engine).total_gib > 80.0


def test_static_estimate_counts_the_allocated_cache_bounded_prefill_and_graph_pool():
    shape = PRESETS["llama-8b"]
    static = memory.estimate_memory(shape, "bf16", 256, 512, 900, "static")
    hf = memory.estimate_memory(shape, "bf16", 256, 512, 900, "hf")
    # The static cache holds whole POSITION_BUCKET multiples: 900 positions take 960.
    assert static.kv_cache_gib == pytest.approx(hf.kv_cache_gib * 960 / 900)
    # Prefill runs in groups of PREFILL_CHUNK_TOKENS // 512 = 32 rows, not all 256 at once.
    assert static.activations_gib == pytest.approx(hf.activations_gib * 32 / 256)
    assert static.graphs_gib > 0 and hf.graphs_gib == 0


def test_run_estimate_is_sized_by_the_drawn_batches_not_the_tasks_extremes():
    """Batch 512 of chat prompts is padded to its own longest prompt and has one output length: its cache needs
    fewer slots than the task's longest prompt plus longest output, which is what lets it fit one H100."""
    import argparse

    from llm_inference.config import add_run_arguments, resolve
    from llm_inference.tasks import TASKS, batches_extent, draw_batches, longest_sequence

    def config(*argv: str) -> object:
        parser = argparse.ArgumentParser()
        add_run_arguments(parser)
        return resolve(parser.parse_args(["--preset", "llama-8b", *argv]))

    shape, task = PRESETS["llama-8b"], TASKS["chat"]
    batches = draw_batches(task, 512, 1, 1234)
    prompt, sequence = batches_extent(batches)
    assert prompt == max(batches[0].input_lengths) and sequence == prompt + batches[0].output_length
    assert sequence < longest_sequence(task)
    cfg = config("--task", "chat", "--batch-sizes", "512")
    drawn = validation.run_estimate(cfg, shape, "bf16", 512)
    assert drawn == memory.estimate_memory(shape, "bf16", 512, prompt, sequence, "static")
    extremes = memory.estimate_memory(shape, "bf16", 512, task.input_length.high, longest_sequence(task), "static")
    assert drawn.total_gib < 79.2 < extremes.total_gib
    # Several tasks: each part the largest over them (one task's cache stays while the next one's prefill runs).
    both = config("--task", "chat,summarization", "--batch-sizes", "8")
    parts = [validation.run_estimate(config("--task", name, "--batch-sizes", "8"), shape, "bf16", 8)
             for name in ("chat", "summarization")]
    combined = validation.run_estimate(both, shape, "bf16", 8)
    assert combined.kv_cache_gib == max(p.kv_cache_gib for p in parts)
    assert combined.activations_gib == max(p.activations_gib for p in parts)


@pytest.mark.parametrize(("args", "expected"), [
    (["--engine", "hf", "--decode-tuning", "default"], "--decode-tuning default chooses a compiled variant"),
])
def test_decode_tuning_is_refused_where_no_static_step_runs(args, expected, capsys):
    assert main(["validate", "--preset", "tiny", "--device", "cpu", *args]) == ExitCode.USAGE
    assert expected in capsys.readouterr().err


def test_decode_tuning_choices_are_the_engines_variants():
    """The option's choices (config, torch-free) and the engine's compiled variants are one list (`auto` times those
    not held back until measured: the fused one is pinned only); a pinned variant leaves the engine nothing to
    choose at set-up."""
    import torch

    from llm_inference.compact_model import CompactModel
    from llm_inference.config import DECODE_TUNING_CHOICES
    from llm_inference.decode_choice import DECODE_TUNINGS
    from llm_inference.engine import build_model
    from llm_inference.static_engine import StaticEngine

    assert ("auto", *DECODE_TUNINGS) == DECODE_TUNING_CHOICES
    cpu = torch.device("cpu")
    model = CompactModel.from_transformers(build_model(PRESETS["tiny"], None, "fp32", "sdpa", cpu, 1))
    assert set(StaticEngine(model, cpu, compile_decode=True).decode_variants) == {"default", "coordinate-descent"}
    pinned = StaticEngine(model, cpu, compile_decode=True, tuning="coordinate-descent")
    assert list(pinned.decode_variants) == ["coordinate-descent"] and pinned.decode_tuning == "coordinate-descent"
    assert list(StaticEngine(model, cpu).decode_variants) == ["eager"]  # the CPU runs the pieces uncompiled
