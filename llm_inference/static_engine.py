"""The static engine (`--engine static`, the default): a decode loop bound by the device, not by Python.

Per batch shape, once and outside every measured window (`prepare`):

* a KV cache of `layers × 2 × batch × KV heads × cache positions × head dim` is allocated (llm_inference/kv_cache.py,
  the batch's rows in lockstep: one shared length, each row's first real position), positions = longest prompt +
  output of the point's batches, rounded up to POSITION_BUCKET;
* on CUDA, one decode step is captured as a CUDA graph per attended cache length (multiples of
  POSITION_BUCKET): a step attends to the first `length` cache positions only, so attention reads the filled part of
  the cache (within one bucket), not all of it. All graphs share one memory pool. The layer pieces around
  attention (norms, projections, RoPE, the K/V write's source, MLP, residuals) are compiled by inductor for
  the decode step (fewer, fused kernels: at batch 1 a step is ~16 × 14 small kernels whose gaps cost as much
  as the weight reads); compilation happens at the capture's warm-up, outside every window. Prefill stays
  eager (its shapes vary: no compilation may land in a measured window). `--decode-tuning fused` replaces the
  pieces of a one-row step by the Triton kernels of llm_inference/fused_decode.py (Llama on one GPU).

A generation is then the prefill (eager: prompt lengths vary; rows of similar prompt length grouped, each group
at its own longest prompt, so the left padding is hardly computed) and one graph replay per new token: the
step reads the last token, writes its K/V at the current cache position, picks the next token by argmax on the
device and advances its own counters, so the host only launches replays (no synchronisation, no
per-step tensor set-up). On CPUs the same step runs eagerly.

Left padding as in transformers: row i's prompt fills cache positions [start_i, W); its token positions count
from start_i, and attention masks cache positions before start_i (and after the current one).

Words, as in the continuous engine: a *row* is one sequence of the batch, a *cache position* one token's place in
a row's KV cache.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from typing import Any, Self

import torch
import torch.nn.functional as F

from joulebench.compile_cache import frame_compiles
from llm_inference import memory, prefill_pieces
from llm_inference.compact_model import CompactModel
from llm_inference.decode_attention import (
    additive_mask,
    sdpa_decode_attention,
    sdpa_mask,
    sm_count,
    split_decode_attention,
    triton_supported,
)
from llm_inference.decode_choice import (
    DECODE_TUNINGS,
    DEFAULT_OBJECTIVE,
    POWER_REPLAY_S,
    POWER_SPAN_S,
    Choice,
    DecodeVariant,
    PowerProbe,
    choose,
)
from llm_inference.engine import StepClock, Timing
from llm_inference.kv_cache import KVCache
from llm_inference.tasks import Batch

TUNING_REPLAYS = 20  # replays timed per variant (a step of llama-8b at batch 512 takes ~15 ms: 0.3 s per variant)
MIN_TUNING_REPLAYS = 8  # fewer (outputs below 10 tokens leave no room in the buffers): no choice, the default runs
FUSED_PINNED = "fused Triton kernels at batch 1, compiled pieces at larger batches"  # the record's engine detail


def attended_length(filled: int) -> int:
    """Cache positions a step attends to when `filled` positions hold keys: the next multiple of POSITION_BUCKET."""
    return math.ceil(filled / memory.POSITION_BUCKET) * memory.POSITION_BUCKET


def decode_lengths(prompt: int, new_tokens: int) -> set[int]:
    """Attended lengths of the decode steps of one generation (step t attends prompt + t + 1 positions)."""
    return {attended_length(prompt + step + 1) for step in range(new_tokens - 1)}


@dataclasses.dataclass
class CacheState:
    """What an engine's decode steps read and write besides the weights: fixed shapes, fixed addresses (what the
    captured steps replay)."""

    cache: KVCache
    tokens: torch.Tensor  # (rows,) the token each row feeds next
    position_index: torch.Tensor  # arange(cache positions), for masks
    rope: tuple[torch.Tensor, torch.Tensor] | None  # (cos, signed sin) per position
    pool: Any  # the memory pool the graphs share (a pool dies with its last graph)

    @property
    def rows(self) -> int:
        return self.cache.rows

    @property
    def cache_positions(self) -> int:
        return self.cache.positions


@dataclasses.dataclass
class DecodeState(CacheState):
    """One batch shape's state: its rows in lockstep (the cache: each row's first real position, one shared length),
    its output buffer and its captured steps, one per attended length."""

    step: torch.Tensor = dataclasses.field(kw_only=True)  # (1,) output column the next step writes
    out: torch.Tensor = dataclasses.field(kw_only=True)  # (batch, outputs) generated tokens
    graphs: dict[int, torch.cuda.CUDAGraph] = dataclasses.field(default_factory=dict)
    tuning: str | None = None  # the compiled variant this shape's graphs run (None: not chosen yet)
    tuning_ms: dict[str, float] = dataclasses.field(default_factory=dict)  # each variant's replayed step
    tuning_power_w: dict[str, float | None] = dataclasses.field(default_factory=dict)  # each one's power (None: n/a)
    tuning_basis: str | None = None  # what decided the variant (llm_inference.decode_choice)
    tuning_graphs: list[torch.cuda.CUDAGraph] = dataclasses.field(default_factory=list)  # kept: they hold the pool

    @property
    def outputs(self) -> int:
        return self.out.shape[1]


class CompactForward:
    """What the static and the continuous engine share: the compact model, its (compiled) decode pieces, the
    prefill of some rows into a cache and the decode pass over a cache (each engine keeps its own state)."""

    def __init__(self, model: CompactModel, device: torch.device, compile_decode: bool | None = None,
                 dynamic: bool | None = None, tuning: str = "auto", compile_prefill: bool | None = None) -> None:
        self.model = model
        self.device = device
        self.capture = device.type == "cuda"
        self.compile_decode = self.capture if compile_decode is None else compile_decode
        self.prefill_pieces = prefill_pieces.PrefillPieces.build(
            self.capture and prefill_pieces.COMPILED if compile_prefill is None else compile_prefill)
        self.setup_compiles: int | None = None  # dynamo's frame compiles at the end of the last set-up
        pieces = (model.step_inputs, model.attention_inputs, model.attention_output_and_mlp, model.logits)
        tunings = dict(DECODE_TUNINGS) if tuning == "auto" else {tuning: DECODE_TUNINGS[tuning]}
        self.fused_variants, self.fused_detail = self._fused(tuning, tunings)
        # `auto` drops a fused variant whose kernels cannot run here: it would only time the default pieces again
        tunings = {name: v for name, v in tunings.items() if tuning != "auto" or not v.fused
                   or name in self.fused_variants}
        self.decode_variants = ({name: tuple(torch.compile(p, dynamic=dynamic, options=v.options) for p in pieces)
                                 for name, v in tunings.items()} if self.compile_decode
                                else {"eager": pieces})
        self.decode_tuning = next(iter(self.decode_variants))  # what the next decode pass runs (see choose_tuning)
        self.objective = DEFAULT_OBJECTIVE  # how choose_tuning ranks the variants (--objective)
        self.power_probe: PowerProbe | None = None  # the run's meter, set per run; None: every power n/a
        self.clock = StepClock(device)
        self.sms = sm_count(device)  # what the Triton kernels' grids are sized for
        # the split Triton kernels' SM count where they run (the cache has unit stride along the head dim), else None
        self.split_sms = self.sms if triton_supported(device, model.head_dim, model.embed.dtype) else None

    def _fused(self, tuning: str, tunings: dict[str, DecodeVariant]) -> tuple[frozenset[str], str | None]:
        """(the variants whose one-row decode passes run llm_inference/fused_decode.py's kernels, what the record
        says of them): where the model and device allow, those variants' other shapes run their compiled pieces.
        Uncompiled (the CPU) a pinned fused variant names the eager pieces (Triton's interpreter runs the kernels
        there: the tests)."""
        asked = {name for name, variant in tunings.items() if variant.fused}
        if not asked:
            return frozenset(), None
        from llm_inference import fused_decode  # its kernels need Triton: imported where a variant asks for them

        pinned = tuning in asked
        reason = fused_decode.unsupported(self.model, self.device)
        if reason is not None:  # pinned: the record says why; `auto`: simply no candidate
            return frozenset(), f"compiled pieces at every batch: {reason}" if pinned else None
        if not self.compile_decode:  # one eager variant: `auto` has nothing to choose from
            return (frozenset({"eager"}), FUSED_PINNED) if pinned else (frozenset(), None)
        return frozenset(asked), FUSED_PINNED if pinned else "fused Triton kernels at batch 1 where `auto` chose them"

    @property
    def decode_attention_kind(self) -> str:
        return "sdpa (masked)" if self.split_sms is None else "triton split"

    def rank_detail(self) -> dict[str, object]:
        """What this rank computes: the tensor-parallel size, the heads it holds and where a fused variant runs its
        kernels (the record's engine detail; None: no fused variant asked for)."""
        model = self.model
        return {"tensor_parallel": 1 if model.tp is None else model.tp.size, "rank_heads": model.heads,
                "rank_kv_heads": model.kv_heads, "decode_fused": self.fused_detail}

    def prefill_detail(self) -> dict[str, object]:
        """The engine detail's prefill entries (llm_inference/prefill_pieces.py): compiled or not, compile seconds,
        compiles since the last set-up."""
        return prefill_pieces.detail(self.prefill_pieces, self.setup_compiles)

    def finish_setup(self) -> None:
        """The end of a set-up: the prefill's pieces compiled for every case (once per engine), then dynamo's compile
        count noted, which the engine detail's `compiles_after_setup` counts from."""
        self.prefill_pieces.warm(self.model)
        self.setup_compiles = frame_compiles()

    @classmethod
    def from_transformers(cls, model: torch.nn.Module, device: torch.device, tuning: str = "auto") -> Self:
        """The engine on a transformers model's weights (fused copies where the compact code fuses them); tuning:
        "auto" or one DECODE_TUNINGS variant (llm_inference.decode_choice)."""
        return cls(CompactModel.from_transformers(model), device, tuning=tuning)

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()

    def _prefill_rows(self, cache: KVCache, position_index: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]
                      | None, rows: torch.Tensor, ids: torch.Tensor, start: torch.Tensor, offset: int,
                      last: torch.Tensor | None = None) -> torch.Tensor:
        """Prompt forward pass of some rows (indices `rows` of `cache`) over cache positions [offset, offset + width):
        their K/V into the cache; the logits at position `last` of each row (default: the last column). `ids`
        and `start` count from cache position `offset`."""
        model = self.model
        self.prefill_pieces.warm(model)  # a no-op after the set-up's; an engine used without one warms here
        count, width = ids.shape
        columns = position_index[:width]
        positions = (columns[None, :] - start[:, None]).clamp(min=0)
        rope = None if rope is None else (rope[0][positions], rope[1][positions])
        causal = columns[None, :] <= columns[:, None]
        # Padding queries see themselves, so no row of the mask is empty (an empty row gives NaN in SDPA).
        own = torch.eye(width, dtype=torch.bool, device=ids.device)
        visible = causal[None] & ((columns[None, None, :] >= start[:, None, None]) | own[None])
        mask = additive_mask(visible, model.embed.dtype)[:, None]  # once per pass, not per layer
        x = model.embed_tokens(ids, positions)
        pieces = self.prefill_pieces
        for index, layer in enumerate(model.layers):
            q, kv = pieces.attention_inputs(model, layer, x, rope)
            cache.write_prompt(index, rows, offset, kv)
            k, v = kv[:, :, 0].transpose(1, 2), kv[:, :, 1].transpose(1, 2)
            attention = F.scaled_dot_product_attention(
                q.transpose(1, 2), k.repeat_interleave(model.groups, dim=1), v.repeat_interleave(model.groups, dim=1),
                attn_mask=mask)
            x = pieces.attention_output_and_mlp(model, layer, x, attention.transpose(1, 2).reshape(count, width, -1))
        return model.logits(x[:, -1] if last is None else x[torch.arange(count, device=x.device), last])

    def _decode_pass(self, cache: KVCache, tokens: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None,
                     length: int) -> torch.Tensor:
        """Logits after one token per row of `cache`, attending to its first `length` positions: the cache writes
        each row's new K/V at its length first, then row b attends to its positions start[b]..length[b]."""
        model = self.model
        batch = tokens.shape[0]
        if batch == 1 and self.decode_tuning in self.fused_variants:
            from llm_inference.fused_decode import decode_pass

            assert rope is not None  # a Llama model: fused_decode.unsupported let nothing else through
            return decode_pass(model, cache, tokens, rope, length, self.sms)
        step_inputs, attention_inputs, attention_output_and_mlp, logits = self.decode_variants[self.decode_tuning]
        first, last = cache.start, cache.length
        mask = None if self.split_sms is not None else sdpa_mask(first, last, length, batch, model.embed.dtype)
        x, rope = step_inputs(tokens, cache.token_positions(), rope)
        for index, layer in enumerate(model.layers):
            q, kv = attention_inputs(layer, x, rope)
            cache.write_token(index, kv)
            # The query heads of one KV head share its keys and mask: they act as that head's query rows.
            query = q.reshape(batch, model.kv_heads, model.groups, model.head_dim)
            keys, values = cache.keys(index), cache.values(index)
            if self.split_sms is None:
                attention = sdpa_decode_attention(query, keys, values, first, last, length, mask)
            else:
                attention = split_decode_attention(query, keys, values, first, last, length, self.split_sms)
            x = attention_output_and_mlp(layer, x, attention.reshape(batch, 1, -1))
        return logits(x[:, 0])

    def warm_up(self, step: Callable[[], None]) -> None:
        """One decode step outside capture (compilation, cuBLAS workspaces, kernel choice), on a side stream as
        capture requires."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            step()
        torch.cuda.current_stream().wait_stream(side)

    def choose_tuning(self, step: Callable[[], None], reset: Callable[[], None], replays: int, pool: Any,
                      keep: list[torch.cuda.CUDAGraph], rows: int) -> Choice:
        """Per batch shape, the compiled variant (DECODE_TUNINGS) that the objective prefers (decode_choice): by its
        replayed step time, and by its mean power where a meter is given: inductor's coordinate-descent tuning
        made llama-1b's batch-1 step 9 % faster and llama-8b's 11 % slower, so neither is right for every shape.
        Set-up time, outside every window; `reset` undoes the replays' counter moves. The timed graphs go to
        `keep`: a memory pool dies with its last graph, and the shape's real graphs are captured into the same
        pool afterwards."""
        candidates = self.tuning_candidates(rows)
        if len(candidates) == 1 or replays < MIN_TUNING_REPLAYS:  # too few to time: the first variant
            self.decode_tuning = candidates[0]
            return Choice(self.decode_tuning, {}, {}, "one variant (pinned, eager or too few replays to time)")
        timings, powers = {}, {}
        for name in candidates:
            self.decode_tuning = name
            self.warm_up(step)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                step()
            keep.append(graph)
            reset()
            graph.replay()  # first replay: uploads the graph
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            for _ in range(replays):
                graph.replay()
            end.record()
            end.synchronize()
            timings[name] = begin.elapsed_time(end) / replays
            reset()
            powers[name] = self._replay_power(graph, reset, replays)
        choice = choose(timings, powers, self.objective)
        if self.model.tp is not None:  # split over ranks: rank 0's choice everywhere (the graphs must match)
            choice = self.model.tp.from_rank_zero(choice)
        self.decode_tuning = choice.variant
        return choice

    def tuning_candidates(self, rows: int) -> list[str]:
        """The variants a shape of `rows` rows chooses from: a fused variant only at one row, since elsewhere it runs
        the default pieces and timing the same kernels twice would only let noise name the variant."""
        return ([name for name in self.decode_variants if rows == 1 or name not in self.fused_variants]
                or list(self.decode_variants))  # a pinned fused variant: its only one

    def _replay_power(self, graph: torch.cuda.CUDAGraph, reset: Callable[[], None], replays: int) -> float | None:
        """Mean power over the last POWER_SPAN_S of POWER_REPLAY_S seconds of this graph's replays (in rounds of
        `replays`, reset between: the counters stay inside the buffers); None without a meter."""
        if self.power_probe is None:
            return None
        started = time.monotonic()
        while time.monotonic() - started < POWER_REPLAY_S:
            for _ in range(replays):
                graph.replay()
            reset()
            self.sync()
        return self.power_probe(POWER_SPAN_S)


class StaticEngine(CompactForward):
    """Compact model code, a static KV cache and CUDA-graph decode steps (see the module docstring)."""

    name = "static"

    def __init__(self, model: CompactModel, device: torch.device, compile_decode: bool | None = None,
                 tuning: str = "auto", compile_prefill: bool | None = None) -> None:
        super().__init__(model, device, compile_decode, tuning=tuning, compile_prefill=compile_prefill)
        self.state: DecodeState | None = None

    def describe(self) -> dict[str, object]:
        state = self.state
        return {"engine": self.name, "cuda_graphs": self.capture, "compiled_decode": self.compile_decode,
                "decode_attention": self.decode_attention_kind, **self.rank_detail(),
                "decode_tuning": state.tuning if state is not None and state.tuning else (
                    self.decode_tuning if len(self.decode_variants) == 1 else None),  # None: not chosen yet
                "decode_tuning_ms": None if state is None else state.tuning_ms,
                "decode_tuning_power_w": None if state is None else state.tuning_power_w,
                "decode_objective": self.objective,
                "decode_tuning_basis": None if state is None else state.tuning_basis,
                "position_bucket": memory.POSITION_BUCKET,
                "cache_positions": None if state is None else state.cache_positions,
                "captured_graphs": None if state is None else len(state.graphs),
                "prefill_chunk_tokens": memory.PREFILL_CHUNK_TOKENS, **self.prefill_detail()}

    # ---- shapes -----------------------------------------------------------------------------------------
    @torch.inference_mode()
    def prepare(self, batches: list[Batch]) -> float:
        """Cache and graphs for these batches (all of one size); returns the seconds spent (outside windows)."""
        started = time.monotonic()
        lengths = set().union(*(decode_lengths(b.padded_length, b.output_length) for b in batches))
        self._ensure(batches[0].size, max(b.padded_length + b.output_length for b in batches),
                     max(b.output_length for b in batches), lengths)
        self.finish_setup()
        self.sync()
        return time.monotonic() - started

    def _ensure(self, batch: int, sequence: int, outputs: int, lengths: set[int]) -> DecodeState:
        state = self.state
        if state is None or state.rows != batch or state.cache_positions < sequence or state.outputs < outputs:
            state = self.state = None  # drop every reference to the old cache and graphs before allocating
            if self.capture:
                torch.cuda.empty_cache()
            state = self.state = self._allocate(batch, memory.cache_positions(sequence), outputs)
        if self.capture:
            self._capture(state, lengths - state.graphs.keys())
        return state

    def _allocate(self, batch: int, positions: int, outputs: int) -> DecodeState:
        model, device = self.model, self.device

        def index(*shape: int) -> torch.Tensor:
            return torch.zeros(shape, dtype=torch.long, device=device)

        return DecodeState(
            cache=KVCache.lockstep(model, batch, positions, device), tokens=index(batch), step=index(1),
            out=index(batch, outputs), position_index=torch.arange(positions, device=device),
            rope=model.rope_tables(positions, model.embed.dtype),
            pool=torch.cuda.graph_pool_handle() if self.capture else None)

    def _capture(self, state: DecodeState, lengths: set[int]) -> None:
        if not lengths:
            return
        def reset() -> None:  # warm-up and timed steps really run: keep their writes inside the buffers
            state.cache.clear()  # a reused state's rows would start after the current position (nothing visible)
            state.step.zero_()

        def step() -> None:
            self._decode(state, max(lengths))

        reset()
        if state.tuning is None:  # replays advance the counters: at most outputs - 2 of them stay in the buffers
            choice = self.choose_tuning(step, reset, min(TUNING_REPLAYS, state.outputs - 2), state.pool,
                                        state.tuning_graphs, state.out.shape[0])
            state.tuning, state.tuning_ms = choice.variant, choice.step_ms
            state.tuning_power_w, state.tuning_basis = choice.power_w, choice.basis
        self.decode_tuning = state.tuning
        self.warm_up(step)
        reset()
        for length in sorted(lengths):
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=state.pool):
                self._decode(state, length)
            state.graphs[length] = graph

    # ---- the forward passes -------------------------------------------------------------------------------
    def decode_logits(self, state: DecodeState, length: int) -> torch.Tensor:
        """Logits after each row's last token, attending to the first `length` cache positions; writes that
        token's K/V (the cache's length does not move)."""
        return self._decode_pass(state.cache, state.tokens, state.rope, length)

    def _decode(self, state: DecodeState, length: int) -> None:
        """One decode step (what a graph replays): next token by argmax, counters advanced, all inside `state`."""
        token = self.decode_logits(state, length).argmax(dim=-1)
        state.tokens.copy_(token)
        state.out.index_copy_(1, state.step, token[:, None])
        state.cache.advance()
        state.step.add_(1)

    @torch.inference_mode()
    def prefill_logits(self, inputs: dict[str, torch.Tensor]) -> tuple[DecodeState, torch.Tensor]:
        """The prompt's forward pass in groups of rows of similar length (`memory.prefill_groups`, each at its own
        longest prompt, so padding is hardly computed): cache filled, state set for decoding except the last
        token; returns the state and the last position's logits. Reading the prompt lengths is the call's one
        host synchronisation, before the model's first kernel."""
        ids, real = inputs["input_ids"], inputs["attention_mask"]
        batch, width = ids.shape
        state = self._ensure(batch, width + 1, 1, set())
        start = (real == 0).sum(dim=-1)
        logits = torch.empty((batch, self.model.vocab_size), dtype=self.model.embed.dtype, device=ids.device)
        for rows, group_width in memory.prefill_groups(real.sum(dim=-1).tolist()):  # the host sync
            offset = width - group_width
            index = torch.tensor(rows, device=ids.device)
            logits.index_copy_(0, index, self._prefill_rows(state.cache, state.position_index, state.rope, index,
                                                            ids[index, offset:], start[index] - offset, offset))
        state.cache.begin(start, width)
        state.step.fill_(1)
        return state, logits

    # ---- the calls the windows time -----------------------------------------------------------------------
    @torch.inference_mode()
    def prefill(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        """The prompt's forward pass and the first token (argmax on the device); the state set for decoding."""
        state, logits = self.prefill_logits(inputs)
        first = logits.argmax(dim=-1)
        state.tokens.copy_(first)
        state.out[:, 0] = first
        return first

    @torch.inference_mode()
    def generate(self, inputs: dict[str, torch.Tensor], new_tokens: int) -> torch.Tensor:
        """Exactly `new_tokens` greedy tokens per row: a prefill, then one replayed step per further token."""
        batch, width = inputs["input_ids"].shape
        lengths = decode_lengths(width, new_tokens)
        state = self._ensure(batch, width + new_tokens, new_tokens, lengths)
        self.clock.begin()
        self.prefill(inputs)
        self.clock.stamp()
        for step in range(new_tokens - 1):
            length = attended_length(width + step + 1)
            if self.capture:
                state.graphs[length].replay()
            else:
                self._decode(state, length)
            self.clock.stamp()
        return state.out[:, :new_tokens].clone()

    def timing(self) -> Timing:
        return self.clock.timing()
