"""Driver-side window marking: the only jpwr API a training loop needs.

    meter = WindowMeter.open(launch, sync=torch.cuda.synchronize)
    meter.begin("warmup", step=0) ... meter.end("warmup", step=3, work={"tokens": n})
    meter.begin("steady", step=3) ... meter.end("steady", step=20, work={"tokens": m})
    energies = meter.node_energy()          # on node leaders; combine across nodes with combine_energies

Edges are taken after a device sync on the monotonic clock; the sampler does all the
measurement work, so a mark costs the loop a timestamp and one datagram.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Protocol

from jpwr.channel import Channel, Mark, channel_from_env
from jpwr.clock import SYSTEM_CLOCK, Clock
from jpwr.energy import Window, WindowEnergy, combine_energies

NO_SAMPLER_REASON = (
    "no jpwr sampler was running for this job: run under `jpwr -- CMD`, start `jpwr serve` per node, "
    "or pass --energy-methods for in-process metering"
)


class Ranks(Protocol):
    """Where the marking process sits in its run; joulebench's LaunchEnv is one (the meter needs no more)."""

    @property
    def rank(self) -> int: ...

    @property
    def local_rank(self) -> int: ...

    @property
    def world_size(self) -> int: ...

    @property
    def is_node_leader(self) -> bool: ...


class WindowMeter:
    """Marks window edges for one rank and collects the node's window energies at the end."""

    def __init__(
        self,
        launch: Ranks,
        channel: Channel | None,
        sync: Callable[[], None] | None = None,
        clock: Clock = SYSTEM_CLOCK,
        owned_sampler: object | None = None,
    ) -> None:
        self.launch = launch
        self.channel = channel
        self.sync = sync
        self.clock = clock
        self._open: dict[str, tuple[int, int]] = {}
        self._windows: list[Window] = []
        self._owned_sampler = owned_sampler  # in-process sampler started by `open`, stopped by `close`

    @classmethod
    def open(
        cls,
        launch: Ranks,
        sync: Callable[[], None] | None = None,
        methods: str | None = None,
        out_dir: str | os.PathLike[str] | None = None,
        interval_s: float = 0.1,
    ) -> WindowMeter:
        """Connect to the node's sampler (JPWR_ADDR), or start one in-process when `methods` is given.

        In-process metering is for single-process runs only: with several ranks per node each
        would meter the node's devices again, which is exactly the double counting jpwr avoids.
        """
        channel = channel_from_env()
        if channel is not None or not methods:
            return cls(launch, channel, sync)
        if launch.world_size > 1:
            from jpwr.errors import ValidationError

            raise ValidationError(
                f"in-process metering (--energy-methods {methods}) with world size {launch.world_size}",
                "run one sampler per node instead: `jpwr serve` in the job script, or `jpwr -- torchrun ...`",
            )
        from jpwr.sampler import start_local_sampler

        sampler, channel = start_local_sampler(methods, Path(out_dir or "jpwr_out"), interval_s)
        return cls(launch, channel, sync, owned_sampler=sampler)

    @property
    def has_sampler(self) -> bool:
        return self.channel is not None

    def _edge(self, name: str, edge: str, step: int, work: Mapping[str, float] | None = None) -> int:
        if self.sync is not None:
            self.sync()
        t_ns = self.clock.monotonic_ns()
        if self.channel is not None:
            self.channel.send_mark(Mark(
                name=name, edge=edge, step=step, t_ns=t_ns, rank=self.launch.rank,
                local_rank=self.launch.local_rank, work=tuple(sorted((work or {}).items())),
            ))
        return t_ns

    def begin(self, name: str, step: int) -> None:
        if name in self._open:
            raise RuntimeError(f"window {name!r} begun twice without end")
        self._open[name] = (step, self._edge(name, "begin", step))

    def end(self, name: str, step: int, work: Mapping[str, float] | None = None) -> Window:
        if name not in self._open:
            raise RuntimeError(f"window {name!r} ended without begin")
        first_step, t_start = self._open.pop(name)
        t_end = self._edge(name, "end", step, work)
        window = Window(name, first_step, step, t_start, t_end, dict(work or {}))
        self._windows.append(window)
        return window

    @property
    def windows(self) -> list[Window]:
        return list(self._windows)

    def node_energy(self, names: Sequence[str] | None = None, timeout_s: float = 60.0) -> dict[str, WindowEnergy]:
        """Energy of each window on this node's accelerators, asked of the sampler by the node leader.

        Ranks other than the node leader get {}: the leader's answer already covers the node.
        """
        wanted = list(names) if names is not None else [w.name for w in self._windows]
        if not self.launch.is_node_leader:
            return {}
        if self.channel is None:
            return {name: WindowEnergy.unavailable(NO_SAMPLER_REASON) for name in wanted}
        replies = self.channel.query_energy(wanted, timeout_s)
        result = {}
        for name in wanted:
            reply = replies.get(name) or {"unavailable_reason": f"sampler has no window {name!r}"}
            if reply.get("energy_j") is None and "devices" not in reply:
                result[name] = WindowEnergy.unavailable(str(reply.get("unavailable_reason")))
            else:
                result[name] = WindowEnergy.from_dict(reply)
        return result

    def attach_energy(self, gather: Callable[[object], Sequence[object]] | None = None) -> None:
        """Put the run's energy on this rank's windows: node leaders ask their sampler, `gather` (a
        collective returning every rank's object, e.g. torch's all_gather_object) brings the nodes
        together, and the sum over nodes is attached. Call on every rank (collective)."""
        mine = {name: energy.to_dict() for name, energy in self.node_energy().items()}
        everyone = gather(mine) if gather is not None and self.launch.world_size > 1 else [mine]
        per_node = [{k: WindowEnergy.from_dict(v) for k, v in node.items()} for node in everyone if node]
        combined = combine_energies(per_node)  # type: ignore[arg-type]
        for window in self._windows:
            window.energy = combined.get(window.name)

    def close(self) -> None:
        if self._owned_sampler is not None:
            self._owned_sampler.stop()  # type: ignore[attr-defined]
            self._owned_sampler = None
        if self.channel is not None:
            self.channel.close()
            self.channel = None

    def __enter__(self) -> WindowMeter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
