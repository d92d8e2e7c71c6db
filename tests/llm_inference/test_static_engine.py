"""The static engine on the CPU: its model code against transformers, its tokens against `--engine hf`, its shapes.

On CPUs the decode step runs eagerly (no CUDA graphs): the same code the GPU captures, with the same cache,
masks and attended lengths. The captured path is checked on a GPU by benchmarks/inference_engine_h100.py.
"""

from __future__ import annotations

import itertools
import random

import pytest
import torch

from joulebench.compile_cache import frame_compiles
from llm_inference import memory, prefill_pieces
from llm_inference.compact_model import CompactModel
from llm_inference.engine import build_model, make_inputs
from llm_inference.hf_engine import HFEngine
from llm_inference.prefill_pieces import WARM_SHAPES
from llm_inference.presets import PRESETS
from llm_inference.static_engine import StaticEngine, attended_length, decode_lengths
from llm_inference.tasks import TASKS, Batch, draw_batches

CPU = torch.device("cpu")
# tiny: 11 + 70 positions cross a POSITION_BUCKET boundary (64), so steps attend to two cache lengths.
CASES = {"tiny": Batch((5, 11, 8), 70), "gpt2": Batch((5, 9), 6)}


def engines(name: str, seed: int = 7) -> tuple[HFEngine, StaticEngine]:
    """Both engines on the same seeded random weights (two builds: the static engine takes its own copies)."""
    shape = PRESETS[name]
    return (HFEngine(build_model(shape, None, "fp32", "sdpa", CPU, seed), CPU),
            StaticEngine.from_transformers(build_model(shape, None, "fp32", "sdpa", CPU, seed), CPU))


@pytest.mark.parametrize("name", list(CASES))
def test_greedy_tokens_equal_the_hf_engines_for_the_same_seed(name):
    hf, static = engines(name)
    batch = CASES[name]
    inputs = make_inputs(batch, PRESETS[name].vocab_size, seed=3, device=CPU)
    expected = hf.generate(inputs, batch.output_length)
    static.prepare([batch])
    tokens = static.generate(inputs, batch.output_length)
    assert tokens.shape == (batch.size, batch.output_length)
    assert torch.equal(tokens, expected)
    assert torch.equal(static.prefill(inputs), expected[:, 0])  # the prefill window's call is generate's first step
    timing = static.timing()
    assert timing.ttft_s > 0 and len(timing.inter_token_s) == batch.output_length - 1


@pytest.mark.parametrize("name", list(CASES))
def test_logits_match_transformers_in_fp32_at_prefill_and_each_decode_step(name):
    shape = PRESETS[name]
    model = build_model(shape, None, "fp32", "sdpa", CPU, seed=5)
    static = StaticEngine.from_transformers(model, CPU)
    inputs = make_inputs(Batch((4, 9, 7), 4), shape.vocab_size, seed=2, device=CPU)
    ids, mask, positions = inputs["input_ids"], inputs["attention_mask"], inputs["position_ids"]
    with torch.inference_mode():
        state, logits = static.prefill_logits(inputs)
        for _ in range(4):
            reference = model(input_ids=ids, attention_mask=mask, position_ids=positions,
                              logits_to_keep=1).logits[:, -1]
            torch.testing.assert_close(logits, reference, rtol=1e-5, atol=1e-5)
            token = reference.argmax(-1)
            state.tokens.copy_(token)
            logits = static.decode_logits(state, attended_length(ids.shape[1] + 1))
            state.cache.advance()
            ids = torch.cat([ids, token[:, None]], 1)
            mask = torch.cat([mask, torch.ones_like(token)[:, None]], 1)
            positions = torch.cat([positions, positions[:, -1:] + 1], 1)


def test_cache_graphs_and_counters_have_the_batch_shapes():
    _, static = engines("tiny")
    shape = PRESETS["tiny"]
    batches = [Batch((5, 11, 8), 9), Batch((20, 3, 4), 50)]
    assert static.prepare(batches) >= 0
    state = static.state
    positions = memory.cache_positions(20 + 50)
    assert positions == 128 and positions % memory.POSITION_BUCKET == 0
    head_dim = shape.hidden_size // shape.num_attention_heads
    cache = state.cache
    assert cache.data.shape == (shape.num_layers, 2, 3, shape.num_key_value_heads, positions, head_dim)
    assert cache.keys(0).shape == cache.values(0).shape == (3, shape.num_key_value_heads, positions, head_dim)
    assert state.out.shape == (3, 50) and state.tokens.shape == cache.start.shape == (3,)
    assert cache.length.shape == (1,) and cache.active is None  # one lockstep set: one shared length
    assert state.graphs == {}  # CUDA graphs only on CUDA devices; the CPU runs the same step eagerly
    assert static.describe() == {"engine": "static", "cuda_graphs": False, "compiled_decode": False,
                                 "decode_attention": "sdpa (masked)", "tensor_parallel": 1,
                                 "rank_heads": shape.num_attention_heads, "rank_kv_heads": shape.num_key_value_heads,
                                 "decode_fused": None,  # `auto` on the CPU: no fused candidate
                                 "decode_tuning": "eager", "decode_tuning_ms": {},
                                 "decode_tuning_power_w": {}, "decode_objective": "speed",
                                 "decode_tuning_basis": None,  # nothing chosen on the CPU: n/a
                                 "position_bucket": memory.POSITION_BUCKET,
                                 "cache_positions": positions, "captured_graphs": 0,
                                 "prefill_chunk_tokens": memory.PREFILL_CHUNK_TOKENS, "compiled_prefill": False,
                                 "prefill_compile_s": None, "compiles_after_setup": 0}
    # Attended lengths: the filled positions rounded up to the bucket, never the whole cache.
    assert decode_lengths(11, 9) == {64} and decode_lengths(60, 10) == {64, 128} and decode_lengths(8, 1) == set()
    assert [attended_length(n) for n in (1, 64, 65)] == [64, 64, 128]
    static.prepare([Batch((7, 7, 7), 5)])  # fits the allocation: kept
    assert static.state.cache is cache
    static.prepare([Batch((7, 7), 5)])  # another batch size: reallocated
    assert static.state.cache.rows == 2


def test_stale_cache_positions_from_a_longer_generation_do_not_leak_into_a_shorter_one():
    _, used = engines("tiny")
    _, fresh = engines("tiny")
    vocab = PRESETS["tiny"].vocab_size
    long_batch, short_batch = Batch((30, 12), 40), Batch((6, 9), 10)
    used.prepare([long_batch, short_batch])
    used.generate(make_inputs(long_batch, vocab, seed=1, device=CPU), long_batch.output_length)
    short_inputs = make_inputs(short_batch, vocab, seed=2, device=CPU)
    assert torch.equal(used.generate(short_inputs, short_batch.output_length),
                       fresh.generate(short_inputs, short_batch.output_length))


def test_prefill_in_groups_of_rows_gives_the_same_tokens(monkeypatch):
    hf, static = engines("tiny")
    batch = Batch((9, 4, 12, 7, 12), 5)
    inputs = make_inputs(batch, PRESETS["tiny"].vocab_size, seed=4, device=CPU)
    monkeypatch.setattr(memory, "PREFILL_CHUNK_TOKENS", 24)  # groups of at most 24 tokens, each at its own width
    assert memory.prefill_rows_per_chunk(12) == 2
    assert memory.prefill_groups(list(batch.input_lengths)) == [([2, 4], 12), ([0, 3], 9), ([1], 4)]
    assert torch.equal(static.generate(inputs, batch.output_length), hf.generate(inputs, batch.output_length))


def test_prefill_groups_cover_every_row_once_within_the_token_bound():
    (batch,) = draw_batches(TASKS["chat"], 448, 1, seed=1234)
    lengths = list(batch.input_lengths)
    groups = memory.prefill_groups(lengths)
    assert sorted(row for rows, _ in groups for row in rows) == list(range(len(lengths)))
    for rows, width in groups:
        assert width == max(lengths[row] for row in rows)
        assert len(rows) * width <= max(memory.PREFILL_CHUNK_TOKENS, width)
    # Tokens computed: within a fifth of the real ones, where every row at the longest prompt is over twice as many.
    computed = sum(len(rows) * width for rows, width in groups)
    assert computed < 1.2 * batch.input_tokens and batch.size * batch.padded_length > 2 * batch.input_tokens


def _contiguous_splits(count: int):
    """Every split of `count` sorted rows into runs of consecutive rows, as the runs' end indices."""
    for cuts in itertools.product((False, True), repeat=count - 1):
        yield (*(i + 1 for i, cut in enumerate(cuts) if cut), count)


@pytest.mark.parametrize("seed", range(25))
def test_prefill_groups_are_the_cheapest_split_within_the_token_bound(seed, monkeypatch):
    monkeypatch.setattr(memory, "PREFILL_CHUNK_TOKENS", 64)
    monkeypatch.setattr(memory, "PREFILL_GROUP_COST_TOKENS", 12)
    rng = random.Random(seed)
    lengths = [rng.randint(1, 40) for _ in range(rng.randint(1, 10))]
    ordered = sorted(lengths, reverse=True)

    def cost(ends: tuple[int, ...]) -> float:
        total, begin = 0, 0
        for end in ends:
            rows = end - begin
            if rows > 1 and rows * ordered[begin] > 64:
                return float("inf")
            total, begin = total + rows * ordered[begin] + 12, end
        return total

    groups = memory.prefill_groups(lengths)
    assert sorted(row for rows, _ in groups for row in rows) == list(range(len(lengths)))
    found = sum(len(rows) * width + 12 for rows, width in groups)
    assert found == min(cost(ends) for ends in _contiguous_splits(len(lengths)))


def test_a_small_batch_is_split_where_its_padding_costs_more_than_a_group():
    (batch,) = draw_batches(TASKS["chat"], 8, 1, seed=1234)  # 1,977 real prompt tokens, longest 512 (4,096 padded)
    groups = memory.prefill_groups(list(batch.input_lengths))
    computed = sum(len(rows) * width for rows, width in groups)
    assert len(groups) > 1 and computed < 1.2 * batch.input_tokens
    assert memory.prefill_groups([300] * 8) == [(list(range(8)), 300)]  # equal prompts: one group


def test_model_families_without_static_code_are_refused_with_the_reason():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**PRESETS["tiny"].hf_config_kwargs())
    config.rope_parameters = {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}
    with pytest.raises(ValueError, match="rope type 'dynamic'"):
        StaticEngine.from_transformers(LlamaForCausalLM(config), CPU)


def test_the_compiled_decode_pieces_give_the_eager_tokens():
    """The GPU default compiles the decode step's layer pieces (inductor); on the CPU in fp32 its tokens must equal
    the eager step's (the GPU's bf16 logits are checked by benchmarks/inference_engine_h100.py)."""
    shape, batch = PRESETS["tiny"], CASES["tiny"]
    inputs = make_inputs(batch, shape.vocab_size, seed=3, device=CPU)
    results = []
    for compiled in (False, True):
        model = CompactModel.from_transformers(build_model(shape, None, "fp32", "sdpa", CPU, 7))
        engine = StaticEngine(model, CPU, compile_decode=compiled)
        engine.prepare([batch])
        results.append(engine.generate(inputs, batch.output_length))
        assert engine.describe()["compiled_decode"] is compiled
    assert torch.equal(*results)


@pytest.mark.parametrize("name", list(CASES))  # Llama (RoPE) and GPT-2 (none)
def test_the_compiled_prefill_gives_the_eager_tokens_and_compiles_only_in_the_set_up(monkeypatch, name):
    """The prefill's pieces compiled with dynamic rows and width (llm_inference/prefill_pieces.py): the set-up compiles
    every case, so prompt groups of other rows and widths than the set-up's, 1 included, compile nothing later, and
    their tokens equal the eager prefill's (CPU, fp32). Dynamo's graphs and guards decide what recompiles, whatever
    the backend: the test takes "aot_eager" (seconds, not inductor's C++ compiles); inductor's kernels are checked on
    a GPU by benchmarks/inference_engine_h100.py's logits check."""
    monkeypatch.setattr(prefill_pieces, "BACKEND", "aot_eager")
    shape = PRESETS[name]
    batches = [Batch((5, 11, 8), 6), Batch((7,), 4), Batch((1,), 3), Batch((1, 1), 3)]  # groups of 3×11, 1×7, 1×1, 2×1
    results = {}
    torch._dynamo.reset()  # no compiled code of an earlier test reused: the set-up's compiles are counted below
    for compiled in (False, True):
        model = CompactModel.from_transformers(build_model(shape, None, "fp32", "sdpa", CPU, 7))
        engine = StaticEngine(model, CPU, compile_prefill=compiled)
        before = frame_compiles()
        engine.prepare(batches[:1])
        assert frame_compiles() - before == (2 * len(WARM_SHAPES) if compiled else 0)  # each piece, each case
        results[compiled] = [engine.generate(make_inputs(batch, shape.vocab_size, seed=3, device=CPU),
                                             batch.output_length) for batch in batches]
        detail = engine.describe()
        assert detail["compiled_prefill"] is compiled and detail["compiles_after_setup"] == 0
        assert (detail["prefill_compile_s"] is not None) is compiled
    for eager, compiled_tokens in zip(results[False], results[True], strict=True):
        assert torch.equal(eager, compiled_tokens)
