"""The continuous-batching engine (`python -m llm_inference load`): request slots that fill as requests finish.

A fixed number of slots (`--max-concurrency`), each one row of a static KV cache with its own length: slot r
holds one request's keys and values in cache slots [0, length[r]) (no left padding), and the token it feeds
next. The host decides everything about slots (which request is where, when it finishes: its output length
is known), so the device is never read inside the load loop; the engine only executes:

* `admit(slots, prompts)`: the prefill of newly admitted requests into their slots (eager, with SDPA backends
  that need no set-up per prompt width (engine.SHAPE_FREE_ATTENTION), rows of similar length grouped as in the
  static engine, each group right-padded to its longest prompt: a causal mask keeps
  real tokens from seeing the padding, and the padding's K/V lies beyond the slot's length, where the decode
  step overwrites it before any query sees it); the first token of each is picked on the device;
* `step(rows, attended)`: one decode step over slots [0, rows) attending to the first `attended` cache slots.
  On CUDA each (rows, attended) pair is a CUDA graph captured in `prepare`, outside every window: rows are the
  powers of two and 1.5 times them up to the slot count (and the count itself), attended lengths multiples of
  SLOT_BUCKET; the host keeps the running requests in the lowest slots (`move`), so a step computes at most 1.5
  times the occupied rows and reads only the filled part of the cache. Rows that hold no
  request compute too (their tokens are never read) but do not advance (`active` is 0);
* `release(slots)`: those rows stop advancing.

Slot index and length updates are small host-to-device copies from pinned memory (no synchronisation).
The decode pieces are compiled per row count (`dynamic=False`; the recompile limit is raised to cover them).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any

import torch
from torch.nn.attention import sdpa_kernel

from llm_inference import memory
from llm_inference.compact_model import CompactModel
from llm_inference.engine import SHAPE_FREE_ATTENTION
from llm_inference.static_engine import CompactForward, attended_length


def row_buckets(slots: int) -> list[int]:
    """Row counts a decode step runs with: powers of two and 1.5 times them (a step computes at most 1.5 times
    its occupied rows from 4 on) below `slots`, and `slots` itself."""
    buckets, rows = set(), 1
    while rows < slots:
        buckets.update((rows, rows * 3 // 2) if rows >= 4 else (rows,))
        rows *= 2
    return [*sorted(b for b in buckets if b < slots), slots]


def rows_for(highest_slot: int, slots: int) -> int:
    """The smallest row bucket covering slots [0, highest_slot]."""
    return next(rows for rows in row_buckets(slots) if rows > highest_slot)


@dataclasses.dataclass
class SlotState:
    """The slots' cache and counters: fixed shapes, fixed addresses (what the captured steps read and write)."""

    cache: torch.Tensor  # (layers, 2, slots, KV heads, cache slots, head dim)
    tokens: torch.Tensor  # (slots,) the token each slot feeds next
    length: torch.Tensor  # (slots,) filled cache slots = position of that token
    active: torch.Tensor  # (slots,) 1 while a request occupies the slot, else 0 (its length stays put)
    row_index: torch.Tensor  # arange(slots)
    slot_index: torch.Tensor  # arange(cache slots), for masks
    rope: tuple[torch.Tensor, torch.Tensor] | None
    pool: Any
    graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = dataclasses.field(default_factory=dict)

    @property
    def slots(self) -> int:
        return self.tokens.shape[0]

    @property
    def cache_slots(self) -> int:
        return self.cache.shape[4]


class ContinuousEngine(CompactForward):
    """Slots, per-slot lengths and captured decode steps per (rows, attended length); see the module docstring."""

    name = "continuous"

    def __init__(self, model: CompactModel, device: torch.device, compile_decode: bool | None = None,
                 tuning: str = "auto") -> None:
        # "auto" runs the first variant (default): choosing per row bucket would compile every bucket twice
        super().__init__(model, device, compile_decode, dynamic=False, tuning=tuning)
        self.state: SlotState | None = None

    def describe(self) -> dict[str, object]:
        state = self.state
        return {"engine": self.name, "cuda_graphs": self.capture, "compiled_decode": self.compile_decode,
                "decode_attention": self.decode_attention_kind, "decode_tuning": self.decode_tuning,
                "slot_bucket": memory.SLOT_BUCKET,
                "prefill_chunk_tokens": memory.PREFILL_CHUNK_TOKENS,
                "request_slots": None if state is None else state.slots,
                "cache_slots": None if state is None else state.cache_slots,
                "row_buckets": None if state is None else row_buckets(state.slots),
                "captured_graphs": None if state is None else len(state.graphs)}

    # ---- set-up, outside every window -------------------------------------------------------------------
    @torch.inference_mode()
    def prepare(self, slots: int, sequence: int) -> float:
        """Cache for `slots` requests of up to `sequence` positions; on CUDA every decode step captured.
        Returns the seconds spent."""
        started = time.monotonic()
        self.state = None
        if self.capture:
            torch.cuda.empty_cache()
        model, device = self.model, self.device
        cache_slots = memory.cache_slots(sequence)
        shape = (len(model.layers), 2, slots, model.kv_heads, cache_slots, model.head_dim)

        def index(size: int) -> torch.Tensor:
            return torch.zeros(size, dtype=torch.long, device=device)

        state = self.state = SlotState(
            cache=torch.zeros(shape, dtype=model.embed.dtype, device=device), tokens=index(slots),
            length=index(slots), active=index(slots), row_index=torch.arange(slots, device=device),
            slot_index=torch.arange(cache_slots, device=device), rope=model.rope_tables(cache_slots, model.embed.dtype),
            pool=torch.cuda.graph_pool_handle() if self.capture else None)
        if self.capture:
            self._capture_all(state)
        self.sync()
        return time.monotonic() - started

    def _capture_all(self, state: SlotState) -> None:
        import torch._dynamo

        buckets = row_buckets(state.slots)
        torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 4 * len(buckets))
        lengths = range(memory.SLOT_BUCKET, state.cache_slots + 1, memory.SLOT_BUCKET)
        for rows in buckets:
            self.warm_up(lambda rows=rows: self._step(state, rows, lengths[-1]))  # compiles for this row count
            for length in lengths:
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=state.pool):
                    self._step(state, rows, length)
                state.graphs[rows, length] = graph
        state.length.zero_()  # the warm-up steps ran for real: no slot is in use yet
        state.active.zero_()

    # ---- what the load loop calls --------------------------------------------------------------------
    def _to_device(self, values: Sequence[int]) -> torch.Tensor:
        host = torch.tensor(values, dtype=torch.long, pin_memory=self.device.type == "cuda")
        return host.to(self.device, non_blocking=True)

    @torch.inference_mode()
    def admit(self, slots: Sequence[int], prompts: Sequence[torch.Tensor]) -> None:
        """Prefill each prompt (1-D token ids on the host) into its slot; its first token is picked and the slot
        becomes active. Groups of similar length share a forward pass (memory.prefill_groups)."""
        state = self._state()
        lengths = [len(p) for p in prompts]
        for members, width in memory.prefill_groups(lengths):
            ids = torch.zeros((len(members), width), dtype=torch.long,
                              pin_memory=self.device.type == "cuda")
            for row, member in enumerate(members):
                ids[row, :lengths[member]] = prompts[member]
            rows = self._to_device([slots[m] for m in members])
            last = self._to_device([lengths[m] - 1 for m in members])
            start = torch.zeros(len(members), dtype=torch.long, device=self.device)
            with sdpa_kernel(SHAPE_FREE_ATTENTION):  # a new prompt width almost every time: no per-shape set-up
                logits = self._prefill_rows(state.cache, state.slot_index, state.rope, rows,
                                            ids.to(self.device, non_blocking=True), start, 0, last)
            state.tokens.index_copy_(0, rows, logits.argmax(dim=-1))
            state.length.index_copy_(0, rows, last + 1)
            state.active.index_fill_(0, rows, 1)

    @torch.inference_mode()
    def move(self, moves: Sequence[tuple[int, int, int]]) -> None:
        """(from slot, to slot, filled length) per request: its cache row's filled part, token, length and activity
        move; the old slots stop advancing. Sources are read before any destination is written."""
        state = self._state()
        source = self._to_device([m[0] for m in moves])
        target = self._to_device([m[1] for m in moves])
        filled = state.cache[:, :, :, :, :max(m[2] for m in moves)]
        filled.index_copy_(2, target, filled.index_select(2, source))
        for counter in (state.tokens, state.length, state.active):
            counter.index_copy_(0, target, counter.index_select(0, source))
        state.active.index_fill_(0, source, 0)

    @torch.inference_mode()
    def release(self, slots: Sequence[int]) -> None:
        """These slots' requests are done: the slots stop advancing until admitted again."""
        self._state().active.index_fill_(0, self._to_device(slots), 0)

    @torch.inference_mode()
    def step(self, rows: int, attended: int) -> None:
        """One decode step over slots [0, rows), attending to the first `attended` cache slots."""
        state = self._state()
        if self.capture:
            state.graphs[rows, attended].replay()
        else:
            self._step(state, rows, attended)

    def next_tokens(self) -> torch.Tensor:
        """Every slot's latest token (a device tensor the next step overwrites: clone it to keep it)."""
        return self._state().tokens

    def _state(self) -> SlotState:
        if self.state is None:
            raise RuntimeError("ContinuousEngine.prepare must run before requests are admitted")
        return self.state

    def _step(self, state: SlotState, rows: int, attended: int) -> None:
        positions = state.length[:rows]
        row_index = state.row_index[:rows]

        def write(cache: torch.Tensor, kv: torch.Tensor) -> None:
            cache[:, row_index, :, positions] = kv[:, 0]  # each row's K and V at its own length

        logits = self._decode_pass(state.cache[:, :, :rows], state.tokens[:rows], positions, state.rope, None,
                                   positions, attended, write)
        state.tokens[:rows] = logits.argmax(dim=-1)
        state.length[:rows] += state.active[:rows]


def step_shape(lengths: Sequence[int], highest_slot: int, slots: int) -> tuple[int, int]:
    """(rows, attended) of the next decode step: `lengths` are the active slots' filled lengths (each step
    attends to its own length + 1 slots), `highest_slot` the highest active slot index."""
    return rows_for(highest_slot, slots), attended_length(max(lengths) + 1)
