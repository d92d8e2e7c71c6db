"""The continuous-batching engine (`python -m llm_inference load`): request rows that fill as requests finish.

A fixed number of request rows (`--max-concurrency`), each one row of the KV cache with its own length
(llm_inference/kv_cache.py, its independent rows: the cache writes, moves and releases them): row r holds one
request's keys and values in cache positions [0, length[r]) (no left padding), and the token it feeds next. The
host decides everything about rows (llm_inference/scheduler.py: which request is where, when it finishes: its
output length is known), so the device is never read inside the load loop; the engine only executes:

* `admit(rows, prompts)`: the prefill of newly admitted requests into their rows (eager, with SDPA backends
  that need no set-up per prompt width (engine.SHAPE_FREE_ATTENTION), rows of similar length grouped as in the
  static engine, each group right-padded to its longest prompt: a causal mask keeps
  real tokens from seeing the padding, and the padding's K/V lies beyond the row's length, where the decode
  step overwrites it before any query sees it); the first token of each is picked on the device;
* `step(row_count, attended)`: one decode step over rows [0, row_count) attending to the first `attended` cache
  positions.
  On CUDA each (row count, attended) pair is a CUDA graph captured in `prepare`, outside every window: row counts
  are `row_buckets` (eight per doubling from 8 rows: a step computes at most 12.5 % more rows than it occupies),
  attended lengths multiples of POSITION_BUCKET; the host admits into the lowest free rows and moves running
  requests down (`move`) where that lowers the step's bucket, so a step reads only the filled part of the cache.
  Rows that hold no request compute too (their tokens are never read) but do not advance (`active` is 0), and
  attend to one position (their length is 0: split-K attention reads nothing of a finished request's cache);
* `release(rows)`: those rows stop advancing and empty.

Row index and length updates are small host-to-device copies from pinned memory (no synchronisation).

Under tensor parallelism the host's decisions are rank 0's alone: its engine announces each call that changes the
rows (`announce`, a broadcast of the call and its arguments) before running it, and every other rank's engine runs
the calls it is told (`follow`), so one scheduler drives every rank's part of the model.
The decode pieces are compiled per row count (`dynamic=False`; the recompile limit is raised to cover them).
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.nn.attention import sdpa_kernel

from llm_inference import memory, prefill_pieces
from llm_inference.compact_model import CompactModel
from llm_inference.engine import SHAPE_FREE_ATTENTION
from llm_inference.kv_cache import KVCache
from llm_inference.static_engine import CacheState, CompactForward, attended_length

FINE_ROWS = 8  # from this many rows up, eight row buckets per doubling


@functools.cache
def row_buckets(rows: int) -> tuple[int, ...]:
    """Row counts a decode step runs with: 1, 2, 4, then eight per doubling from FINE_ROWS (8, 9, ..., 15, 16, 18,
    ..., 30, 32, 36, ..., 240, 256, ...) below `rows`, and `rows` itself. A step of n >= FINE_ROWS occupied rows
    computes fewer than n * 9 / 8 (at most 12.5 % more rows than it occupies); below that the weights' read dominates
    a step and a spare row costs little. Each bucket is compiled once and captured per attended length: 44 buckets
    for 256 rows (powers of two and 1.5 times them gave 15, and up to 1.5 times the occupied rows)."""
    buckets = {count for count in (1, 2, 4) if count < rows}
    power = FINE_ROWS
    while power < rows:
        buckets.update(count for count in range(power, 2 * power, power // FINE_ROWS) if count < rows)
        power *= 2
    return (*sorted(buckets), rows)


def captured_lengths(cache_positions: int) -> range:
    """The attended lengths a row bucket's steps are captured for: each multiple of POSITION_BUCKET in the cache."""
    return range(memory.POSITION_BUCKET, cache_positions + 1, memory.POSITION_BUCKET)


def rows_for(highest_row: int, rows: int) -> int:
    """The smallest row bucket covering rows [0, highest_row]."""
    buckets = row_buckets(rows)
    return buckets[bisect.bisect_right(buckets, highest_row)]


@dataclasses.dataclass
class RowState(CacheState):
    """The request rows' state: independent rows in the cache (each its own length and activity), and the captured
    steps, one per (row count, attended length)."""

    graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = dataclasses.field(default_factory=dict)
    compile_s: float = 0.0  # the set-up's warm-up steps (compiling the decode per row bucket)
    capture_s: float = 0.0  # the set-up's graph captures


class ContinuousEngine(CompactForward):
    """Request rows, per-row lengths and captured decode steps per (row count, attended length); see the module
    docstring."""

    name = "continuous"

    def __init__(self, model: CompactModel, device: torch.device, compile_decode: bool | None = None,
                 tuning: str = "auto", compile_prefill: bool | None = None) -> None:
        # "auto" runs the default variant: choosing per row bucket would compile every bucket once per variant
        super().__init__(model, device, compile_decode, dynamic=False, tuning="default" if tuning == "auto" else tuning,
                         compile_prefill=compile_prefill)
        self.state: RowState | None = None
        self.announce: Callable[[tuple[str, tuple[Any, ...]] | None], object] | None = None  # rank 0 of a split model

    def _tell_others(self, name: str, *args: Any) -> None:
        """Rank 0 of a split model: the other ranks run this call too (they wait in `follow`)."""
        if self.announce is not None:
            self.announce((name, args))

    def follow(self, told: Callable[[], tuple[str, tuple[Any, ...]] | None]) -> None:
        """A rank other than 0: run rank 0's calls as `told` delivers them, until it says the load is over (None)."""
        calls: dict[str, Callable[..., Any]] = {"prepare": self.prepare, "admit": self.admit, "move": self.move,
                                                "release": self.release, "step": self.step}
        while (call := told()) is not None:
            calls[call[0]](*call[1])

    def describe(self) -> dict[str, object]:
        state = self.state
        return {"engine": self.name, "cuda_graphs": self.capture, "compiled_decode": self.compile_decode,
                "decode_attention": self.decode_attention_kind, "decode_tuning": self.decode_tuning,
                **self.rank_detail(),
                "position_bucket": memory.POSITION_BUCKET,
                "prefill_chunk_tokens": memory.PREFILL_CHUNK_TOKENS,
                "rows": None if state is None else state.rows,
                "cache_positions": None if state is None else state.cache_positions,
                "row_buckets": None if state is None else list(row_buckets(state.rows)),
                "captured_graphs": None if state is None else len(state.graphs),
                "compile_s": None if state is None or not self.capture else round(state.compile_s, 3),
                "capture_s": None if state is None or not self.capture else round(state.capture_s, 3),
                **self.prefill_detail()}

    # ---- set-up, outside every window -------------------------------------------------------------------
    def setup_plan(self, rows: int, sequence: int) -> str:
        """What `prepare` will do, for the line a user reads before it (on a GPU it takes minutes at 256 rows)."""
        if not self.capture:
            return f"a cache of {rows} rows × {memory.cache_positions(sequence)} positions"
        buckets, lengths = len(row_buckets(rows)), len(captured_lengths(memory.cache_positions(sequence)))
        prefill = (f", the prefill's pieces compiled ({len(prefill_pieces.WARM_SHAPES)} shape cases)"
                   if self.prefill_pieces.compiled else "")
        return (f"{buckets} row buckets compiled, {buckets} × {lengths} attended lengths = {buckets * lengths} CUDA "
                f"graphs captured{prefill} (a warm --compile-cache shortens the compiles)")

    @torch.inference_mode()
    def prepare(self, rows: int, sequence: int) -> float:
        """Cache for `rows` requests of up to `sequence` positions; on CUDA every decode step captured.
        Returns the seconds spent."""
        self._tell_others("prepare", rows, sequence)
        started = time.monotonic()
        self.state = None
        if self.capture:
            torch.cuda.empty_cache()
        model, device = self.model, self.device
        positions = memory.cache_positions(sequence)
        state = self.state = RowState(
            cache=KVCache.independent(model, rows, positions, device),
            tokens=torch.zeros(rows, dtype=torch.long, device=device),
            position_index=torch.arange(positions, device=device), rope=model.rope_tables(positions, model.embed.dtype),
            pool=torch.cuda.graph_pool_handle() if self.capture else None)
        if self.capture:
            self._capture_all(state)
        self.finish_setup()
        self.sync()
        return time.monotonic() - started

    def _capture_all(self, state: RowState) -> None:
        """Per row bucket: compile (the warm-up step), then capture one graph per attended length; the seconds of
        each part are kept (engine_detail: the bucket count's cost)."""
        import torch._dynamo

        buckets = row_buckets(state.rows)
        for limit in ("cache_size_limit", "accumulated_recompile_limit"):  # one compile per bucket, never eager
            setattr(torch._dynamo.config, limit, max(getattr(torch._dynamo.config, limit), 4 * len(buckets)))
        lengths = captured_lengths(state.cache_positions)
        for count in buckets:
            started = time.monotonic()
            self.warm_up(functools.partial(self._step, state, count, lengths[-1]))  # compiles for this row count
            compiled = time.monotonic()
            for length in lengths:
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=state.pool):
                    self._step(state, count, length)
                state.graphs[count, length] = graph
            self.sync()
            state.compile_s += compiled - started
            state.capture_s += time.monotonic() - compiled
        state.cache.clear()  # the warm-up steps ran for real: no row is in use yet

    # ---- what the load loop calls --------------------------------------------------------------------
    def _to_device(self, values: Sequence[int]) -> torch.Tensor:
        host = torch.tensor(values, dtype=torch.long, pin_memory=self.device.type == "cuda")
        return host.to(self.device, non_blocking=True)

    @torch.inference_mode()
    def admit(self, rows: Sequence[int], prompts: Sequence[torch.Tensor]) -> None:
        """Prefill each prompt (1-D token ids on the host) into its row; its first token is picked and the row
        becomes active. Groups of similar length share a forward pass (memory.prefill_groups)."""
        self._tell_others("admit", rows, prompts)
        state = self._state()
        lengths = [len(p) for p in prompts]
        for members, width in memory.prefill_groups(lengths):
            ids = torch.zeros((len(members), width), dtype=torch.long,
                              pin_memory=self.device.type == "cuda")
            for row, member in enumerate(members):
                ids[row, :lengths[member]] = prompts[member]
            targets = self._to_device([rows[m] for m in members])
            last = self._to_device([lengths[m] - 1 for m in members])
            start = torch.zeros(len(members), dtype=torch.long, device=self.device)
            with sdpa_kernel(SHAPE_FREE_ATTENTION):  # a new prompt width almost every time: no per-shape set-up
                logits = self._prefill_rows(state.cache, state.position_index, state.rope, targets,
                                            ids.to(self.device, non_blocking=True), start, 0, last)
            state.tokens.index_copy_(0, targets, logits.argmax(dim=-1))
            state.cache.occupy(targets, last + 1)

    @torch.inference_mode()
    def move(self, moves: Sequence[tuple[int, int, int]]) -> None:
        """(from row, to row, filled length) per request: its cache row's filled part, length, activity and next token
        move; the old rows stop advancing. Sources are read before any destination is written."""
        self._tell_others("move", moves)
        state = self._state()
        source = self._to_device([m[0] for m in moves])
        target = self._to_device([m[1] for m in moves])
        state.cache.move(source, target, max(m[2] for m in moves))
        state.tokens.index_copy_(0, target, state.tokens.index_select(0, source))

    @torch.inference_mode()
    def release(self, rows: Sequence[int]) -> None:
        """These rows' requests are done: the rows stop advancing and empty until admitted again."""
        self._tell_others("release", rows)
        self._state().cache.release(self._to_device(rows))

    @torch.inference_mode()
    def step(self, row_count: int, attended: int) -> None:
        """One decode step over rows [0, row_count), attending to the first `attended` cache positions."""
        self._tell_others("step", row_count, attended)
        state = self._state()
        if self.capture:
            state.graphs[row_count, attended].replay()
        else:
            self._step(state, row_count, attended)

    def next_tokens(self) -> torch.Tensor:
        """Every row's latest token (a device tensor the next step overwrites: clone it to keep it)."""
        return self._state().tokens

    def _state(self) -> RowState:
        if self.state is None:
            raise RuntimeError("ContinuousEngine.prepare must run before requests are admitted")
        return self.state

    def _step(self, state: RowState, rows: int, attended: int) -> None:
        cache = state.cache.head(rows)
        logits = self._decode_pass(cache, state.tokens[:rows], state.rope, attended)
        state.tokens[:rows] = logits.argmax(dim=-1)
        cache.advance()


def step_shape(lengths: Sequence[int], highest_row: int, rows: int) -> tuple[int, int]:
    """(row count, attended) of the next decode step: `lengths` are the active rows' filled cache positions (each
    step attends to its own length + 1 positions), `highest_row` the highest active row."""
    return rows_for(highest_row, rows), attended_length(max(lengths) + 1)
