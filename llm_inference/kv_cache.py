"""The KV cache of both compact engines: `rows` request rows × `positions` cache positions per layer, one tensor
(layers, 2, rows, KV heads, positions, head dim), keys at [:, 0] and values at [:, 1], and where each row's tokens
lie in it. It is the only writer of keys and values.

Each row holds its tokens' K/V in positions [start, length) and its next token's goes to `length`; a decode step
attends row r to positions start[r]..length[r] once that token is written. Two kinds of row sets, one layout:

* independent rows (the continuous engine, `independent`): each row its own length, from position 0 (`start` is
  None), and an `active` flag: a row that holds no request computes with the others but does not advance (its
  length 0). Rows are occupied after their prefill, released when their request finishes, and moved down (their
  filled part copied);
  a step over the first rows of the cache runs on `head(rows)`, a view;
* one set of rows in lockstep (the static engine's batch, `lockstep`): one shared length (every row writes the same
  position, one index_copy_ per layer), and each row's first real position (`start`: left padding as in
  transformers).

Every method works in place on fixed tensors (fixed shapes and addresses, what CUDA graphs replay), with one kernel
per write and no loop over rows; index and length tensors live on the cache's device.
"""

from __future__ import annotations

import dataclasses

import torch

from llm_inference.compact_model import CompactModel


@dataclasses.dataclass(frozen=True)
class KVCache:
    """See the module docstring."""

    data: torch.Tensor  # (layers, 2, rows, KV heads, positions, head dim)
    length: torch.Tensor  # (rows,) filled positions per row, or (1,) the lockstep set's shared one
    start: torch.Tensor | None  # (rows,) each row's first real position (lockstep); None: position 0
    active: torch.Tensor | None  # (rows,) 1 while a request holds the row (independent rows); None: lockstep
    row_index: torch.Tensor  # arange(rows): the rows' own index, for their per-row writes

    @classmethod
    def independent(cls, model: CompactModel, rows: int, positions: int, device: torch.device) -> KVCache:
        """Rows of their own lengths, all empty and inactive."""
        return cls(_allocate(model, rows, positions, device), _index(rows, device), None, _index(rows, device),
                   torch.arange(rows, device=device))

    @classmethod
    def lockstep(cls, model: CompactModel, rows: int, positions: int, device: torch.device) -> KVCache:
        """One set of rows that advance together (a static batch), empty."""
        return cls(_allocate(model, rows, positions, device), _index(1, device), _index(rows, device), None,
                   torch.arange(rows, device=device))

    @property
    def rows(self) -> int:
        return self.data.shape[2]

    @property
    def positions(self) -> int:
        return self.data.shape[4]

    def head(self, rows: int) -> KVCache:
        """The first `rows` rows, a view on the same memory (a decode step's row bucket)."""
        if self.active is None:
            raise ValueError("a lockstep set of rows runs whole")
        return KVCache(self.data[:, :, :rows], self.length[:rows], None, self.active[:rows], self.row_index[:rows])

    # ---- reading -----------------------------------------------------------------------------------------
    def keys(self, layer: int) -> torch.Tensor:
        """(rows, KV heads, positions, head dim), a view."""
        return self.data[layer, 0]

    def values(self, layer: int) -> torch.Tensor:
        return self.data[layer, 1]

    def token_positions(self) -> torch.Tensor:
        """(rows,) each row's next token's position in its sequence (its RoPE and position-embedding row)."""
        return self.length if self.start is None else self.length - self.start

    # ---- writing -----------------------------------------------------------------------------------------
    def write_prompt(self, layer: int, rows: torch.Tensor, offset: int, kv: torch.Tensor) -> None:
        """A prefill's K/V of some rows (indices `rows`) at positions [offset, offset + width); kv (rows, width, 2,
        KV heads, head dim) as the model's attention_inputs gives it."""
        width = kv.shape[1]
        self.data[layer, :, :, :, offset:offset + width].index_copy_(1, rows, kv.permute(2, 0, 3, 1, 4))

    def write_token(self, layer: int, kv: torch.Tensor) -> None:
        """One decode step's K/V, each row's at its length; kv (rows, 1, 2, KV heads, head dim)."""
        if self.active is None:  # one shared position: one copy along the positions
            self.data[layer].index_copy_(3, self.length, kv.permute(2, 0, 3, 1, 4))
        else:  # each row at its own position
            self.data[layer][:, self.row_index, :, self.length] = kv[:, 0]

    def advance(self) -> None:
        """After a decode step: the rows' lengths grow by the token written (active rows only)."""
        self.length.add_(1 if self.active is None else self.active)

    # ---- rows --------------------------------------------------------------------------------------------
    def begin(self, start: torch.Tensor, length: int) -> None:
        """The lockstep set after its prefill: rows' first real positions and the shared length."""
        assert self.start is not None, "independent rows are occupied one by one (occupy)"
        self.start.copy_(start)
        self.length.fill_(length)

    def occupy(self, rows: torch.Tensor, lengths: torch.Tensor) -> None:
        """Independent rows after their prefill: their filled lengths; they advance from now on."""
        assert self.active is not None, "a lockstep set begins whole (begin)"
        self.length.index_copy_(0, rows, lengths)
        self.active.index_fill_(0, rows, 1)

    def release(self, rows: torch.Tensor) -> None:
        """These rows' requests are done: the rows stop advancing until occupied again, and empty (length 0: a step
        that still computes them attends to one position, not to the finished request's tokens)."""
        assert self.active is not None, "a lockstep set has no rows of its own to release"
        for counter in (self.active, self.length):
            counter.index_fill_(0, rows, 0)

    def move(self, source: torch.Tensor, target: torch.Tensor, filled: int) -> None:
        """Rows `source` into rows `target`: their first `filled` positions, lengths and activity; the sources stop
        advancing and empty. Sources are read before any target is written (no row is both)."""
        assert self.active is not None, "a lockstep set's rows stay where they are"
        part = self.data[:, :, :, :, :filled]
        part.index_copy_(2, target, part.index_select(2, source))
        for counter in (self.length, self.active):
            counter.index_copy_(0, target, counter.index_select(0, source))
        self.release(source)

    def clear(self) -> None:
        """Every row empty (after set-up steps that really ran: their writes stay inside the buffers)."""
        for counter in (self.length, self.start, self.active):
            if counter is not None:
                counter.zero_()


def _allocate(model: CompactModel, rows: int, positions: int, device: torch.device) -> torch.Tensor:
    shape = (len(model.layers), 2, rows, model.kv_heads, positions, model.head_dim)
    return torch.zeros(shape, dtype=model.embed.dtype, device=device)


def _index(size: int, device: torch.device) -> torch.Tensor:
    return torch.zeros(size, dtype=torch.long, device=device)
