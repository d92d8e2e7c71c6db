"""The `hf` engine (real transformers generation of the tiny preset on the CPU): forced lengths, step clock,
prefill = first step; model build and task draws shared by both engines."""

from __future__ import annotations

import pytest
import torch

from llm_inference.engine import build_model, make_inputs
from llm_inference.hf_engine import HFEngine
from llm_inference.presets import PRESETS
from llm_inference.tasks import TASKS, Batch, draw_batches

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def engine() -> HFEngine:
    return HFEngine(build_model(PRESETS["tiny"], None, "fp32", "sdpa", CPU, seed=7), CPU)


def test_generate_gives_exactly_the_forced_length_with_left_padding(engine):
    batch = Batch(input_lengths=(5, 11, 8), output_length=9)
    inputs = make_inputs(batch, PRESETS["tiny"].vocab_size, seed=3, device=CPU)
    assert inputs["input_ids"].shape == (3, 11)
    assert inputs["attention_mask"].sum(dim=1).tolist() == [5, 11, 8]  # padding is on the left, not counted
    new_tokens = engine.generate(inputs, batch.output_length)
    assert new_tokens.shape == (3, 9)
    timing = engine.timing()
    assert timing.ttft_s > 0 and len(timing.inter_token_s) == 8  # one stamp per new token
    assert all(gap > 0 for gap in timing.inter_token_s)


def test_prefill_call_picks_the_same_first_token_as_generate(engine):
    # The prefill window's call must do generate's first step: same positions under left padding, same token.
    batch = Batch(input_lengths=(4, 10), output_length=2)
    inputs = make_inputs(batch, PRESETS["tiny"].vocab_size, seed=11, device=CPU)
    first = engine.prefill(inputs)
    new_tokens = engine.generate(inputs, batch.output_length)
    assert torch.equal(first, new_tokens[:, 0])


def test_a_models_own_end_of_sequence_token_neither_stops_nor_steers_generation():
    # generate() merges the model's generation config into the call's: an EOS the model brings must not act.
    shape = PRESETS["tiny"]
    model = build_model(shape, None, "fp32", "sdpa", CPU, seed=7)
    batch = Batch(input_lengths=(6, 6), output_length=12)
    probe = HFEngine(model, CPU)
    inputs = make_inputs(batch, shape.vocab_size, seed=3, device=CPU)
    greedy_first = probe.prefill(inputs)
    model.generation_config.eos_token_id = int(greedy_first[0])  # the very token greedy decoding picks first
    engine = HFEngine(model, CPU)
    new_tokens = engine.generate(inputs, batch.output_length)
    assert new_tokens.shape == (2, 12)
    assert torch.equal(new_tokens[:, 0], greedy_first)  # not suppressed by a min-length rule either


def test_random_weights_are_seeded_and_parameter_counts_match_the_built_models():
    shape = PRESETS["tiny"]
    a, b = (build_model(shape, None, "fp32", "sdpa", CPU, seed=5) for _ in range(2))
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters(), strict=True))
    assert sum(p.numel() for p in a.parameters()) == shape.parameter_count()
    for name in ("gpt2", "llama-1b"):  # built without memory on the meta device
        big = build_model(PRESETS[name], None, "bf16", "sdpa", torch.device("meta"), seed=5)
        assert sum(p.numel() for p in big.parameters()) == PRESETS[name].parameter_count()
        assert next(big.parameters()).dtype == torch.bfloat16


def test_task_draws_are_reproducible_and_within_bounds():
    task = TASKS["chat"]
    first = draw_batches(task, 8, 3, seed=1234)
    assert first == draw_batches(task, 8, 3, seed=1234)
    assert first != draw_batches(task, 8, 3, seed=1235)
    for batch in first:
        assert batch.size == 8
        assert all(task.input_length.low <= n <= task.input_length.high for n in batch.input_lengths)
        assert task.output_length.low <= batch.output_length <= task.output_length.high
    forced = draw_batches(task, 2, 2, seed=1, output_length=17)
    assert [b.output_length for b in forced] == [17, 17] and forced[0].output_tokens == 34
