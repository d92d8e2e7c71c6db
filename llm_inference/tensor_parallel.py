"""Tensor parallelism of the compact engines: which part of each weight a rank holds, and the collectives.

Why this split (Megatron-LM's): a layer's attention heads and its MLP columns are independent until their output
projections, so each of N ranks holds heads/N query heads with their KV heads (and the KV cache of those heads
only), intermediate/N MLP columns, and the matching input columns of the output projections; each output
projection then yields a partial sum, and one all-reduce after attention and one after the MLP restore the full
hidden state on every rank. Everything else (embeddings, norms) is replicated, except the LM head, split by
vocabulary rows: its logits are all-gathered, so every rank picks the same next token on its own device and no
rank waits for another's decision (no broadcast, no host synchronisation inside a decode step).

The collectives are torch's functional ones (a new tensor out, no in-place update): inductor compiles them inside
the decode pieces, and a CUDA graph captures them with NCCL; on CPUs they run over gloo (the tests).
Host-side decisions that must be the same on every rank (whether a window goes on, a stop, the decode variant, a
`load`'s step plans) are taken by rank 0 and broadcast over a gloo group of their own (`control`): host objects
over the host, so that sending one never waits for the GPU's queued work.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, TypeVar

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

from joulebench.launch import LaunchEnv

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class TensorParallel:
    """This process's place in a tensor-parallel group of `size` ranks (`group`: the torch.distributed group)."""

    rank: int
    size: int
    group: Any
    control: Any = None  # the gloo group of the host objects (None: `group`, which is gloo already on CPUs)
    owned: bool = False  # this process group was started here (not by the caller), so `finish` ends it

    @property
    def _objects(self) -> Any:
        return self.group if self.control is None else self.control

    def span(self, total: int) -> tuple[int, int]:
        """This rank's [start, stop) of `total` units split evenly (callers check that `size` divides `total`)."""
        if total % self.size:
            raise ValueError(f"{total} does not split over {self.size} tensor-parallel ranks")
        part = total // self.size
        return self.rank * part, (self.rank + 1) * part

    def padded_span(self, total: int) -> tuple[int, int, int]:
        """(start, stop, part) of `total` rows split in parts of ceil(total / size): the last rank's part may be
        short (a vocabulary of 50257 rows over 2 ranks); its shard is padded to `part` rows."""
        part = math.ceil(total / self.size)
        start = min(total, self.rank * part)
        return start, min(total, start + part), part

    def reduce(self, partial: torch.Tensor) -> torch.Tensor:
        """The sum of every rank's partial result (after an output projection)."""
        return funcol.all_reduce(partial, "sum", self.group)

    def gather_columns(self, local: torch.Tensor, columns: int) -> torch.Tensor:
        """(rows, part) on each rank → (rows, columns): the ranks' parts side by side, padding dropped."""
        rows = local.shape[0]
        gathered = funcol.all_gather_tensor(local.contiguous(), 0, self.group)  # also in torch 2.11 (the GPU hosts)
        return gathered.view(self.size, rows, -1).permute(1, 0, 2).reshape(rows, -1)[:, :columns]

    def from_rank_zero(self, value: T) -> T:
        """Rank 0's `value` on every rank (a host-side decision every rank must share)."""
        box = [value]
        dist.broadcast_object_list(box, src=0, group=self._objects)
        return box[0]

    def gather_objects(self, obj: object) -> list[object]:
        """Every rank's `obj` in rank order (the run lifecycle's gather: energy, idle baseline, disturbance)."""
        gathered: list[object] = [None] * self.size
        dist.all_gather_object(gathered, obj, group=self._objects)
        return gathered

    def any_reason(self, reason: str | None) -> str | None:
        """The first rank's stop reason, when any rank has one: every rank stops at the same call boundary."""
        reasons: list[str | None] = [None] * self.size
        dist.all_gather_object(reasons, reason, group=self._objects)
        return next((r for r in reasons if r), None)


def start(launch: LaunchEnv, device: torch.device) -> TensorParallel:
    """Join the job's process group (torchrun's env:// rendezvous; NCCL on GPUs, gloo on CPUs): every rank of the
    job is one tensor-parallel rank (validation.check_launch made sure the sizes agree)."""
    launch.export_torch_env()
    owned = not dist.is_initialized()
    if owned:
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, rank=launch.rank, world_size=launch.world_size,
                                device_id=device if device.type == "cuda" else None)
    control = dist.new_group(backend="gloo") if device.type == "cuda" else None
    return TensorParallel(launch.rank, launch.world_size, dist.group.WORLD, control, owned)


def finish(tp: TensorParallel | None) -> None:
    """Leave the process group that `start` began (after the last record): NCCL warns at exit otherwise."""
    if tp is not None and tp.owned and dist.is_initialized():
        dist.destroy_process_group()
