"""Driver-side window marking: the only jpwr API a training loop needs.

    meter = WindowMeter.open(launch, sync=torch.cuda.synchronize)
    meter.begin("warmup", step=0) ... meter.end("warmup", step=3, work={"tokens": n})
    meter.begin("steady", step=3) ... meter.end("steady", step=20, work={"tokens": m})
    energies = meter.node_energy()          # on node leaders; combine across nodes with combine_energies

Edges are taken after a device sync on the monotonic clock; the sampler does all the
measurement work, so a mark costs the loop a timestamp and one datagram. Phase marks inside a
window (`meter.phases`, see jpwr.phases) go to the sampler in one batch when the window ends.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, Protocol

from jpwr.channel import INTERVAL_PREFIX, SAMPLER_LOST, Channel, Mark, channel_from_env, is_interval_mark
from jpwr.clock import SYSTEM_CLOCK, Clock
from jpwr.energy import IdleBaseline, Window, WindowEnergy, combine_energies, split_energy
from jpwr.idle import ACCELERATOR_IDLE, CPU_IDLE, IdlePlan, SettleResult, wait_until_settled
from jpwr.live import NodeLive
from jpwr.node import node_name
from jpwr.phases import PhaseRecorder, Stamps

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


class Stoppable(Protocol):
    """A sampler this meter started in-process (jpwr.sampler.Sampler), stopped when the meter closes."""

    def stop(self) -> object: ...


class WindowMeter:
    """Marks window edges for one rank and collects the node's window energies at the end."""

    INTERVAL_PREFIX: ClassVar[str] = INTERVAL_PREFIX  # how mark_interval's names start (log intervals, no windows)

    def __init__(
        self,
        launch: Ranks,
        channel: Channel | None,
        sync: Callable[[], None] | None = None,
        clock: Clock = SYSTEM_CLOCK,
        owned_sampler: Stoppable | None = None,
        phase_stamps: Stamps | None = None,
    ) -> None:
        self.launch = launch
        self.channel = channel
        self.sync = sync
        self.clock = clock
        # Without a sampler nothing would store phase marks: the recorder stays off and costs nothing.
        self.phases = PhaseRecorder(phase_stamps, enabled=channel is not None)
        self._open: dict[str, tuple[int, int]] = {}
        self._windows: list[Window] = []
        self._owned_sampler = owned_sampler  # in-process sampler started by `open`, stopped by `close`
        self.idle: IdleBaseline | None = None  # set by measure_idle (or by the driver when it skips it)

    @classmethod
    def open(
        cls,
        launch: Ranks,
        sync: Callable[[], None] | None = None,
        methods: str | None = None,
        out_dir: str | os.PathLike[str] | None = None,
        interval_s: float = 0.1,
        phase_stamps: Stamps | None = None,
        counter_interval_s: float = 1.0,
    ) -> WindowMeter:
        """Connect to the node's sampler (JPWR_ADDR), or start one in-process when `methods` is given.

        In-process metering is for single-process runs only: with several ranks per node each
        would meter the node's devices again, which is exactly the double counting jpwr avoids.
        """
        channel: Channel | None = channel_from_env()
        if channel is not None or not methods:
            return cls(launch, channel, sync, phase_stamps=phase_stamps)
        if launch.world_size > 1:
            from jpwr.errors import ValidationError

            raise ValidationError(
                f"in-process metering (--energy-methods {methods}) with world size {launch.world_size}",
                "run one sampler per node instead: `jpwr serve` in the job script, or `jpwr -- torchrun ...`",
            )
        from jpwr.sampler import start_local_sampler

        sampler, channel = start_local_sampler(methods, Path(out_dir or "jpwr_out"), interval_s, counter_interval_s)
        return cls(launch, channel, sync, owned_sampler=sampler, phase_stamps=phase_stamps)

    @property
    def has_sampler(self) -> bool:
        return self.channel is not None

    def _edge(self, name: str, edge: str, step: int, work: Mapping[str, float] | None = None) -> tuple[int, Any]:
        """(edge time, phase stamp): the stamp is taken before the sync so that it completes just before it."""
        stamp = self.phases.edge_stamp()
        if self.sync is not None:
            self.sync()
        t_ns = self.clock.monotonic_ns()
        if self.channel is not None:
            self.channel.send_mark(Mark(
                name=name, edge=edge, step=step, t_ns=t_ns, rank=self.launch.rank,
                local_rank=self.launch.local_rank, work=tuple(sorted((work or {}).items())),
            ))
        return t_ns, stamp

    def begin(self, name: str, step: int) -> None:
        if name in self._open:
            raise RuntimeError(f"window {name!r} begun twice without end")
        t_ns, stamp = self._edge(name, "begin", step)
        self._open[name] = (step, t_ns)
        self.phases.window_begin(name, stamp, t_ns)

    def end(self, name: str, step: int, work: Mapping[str, float] | None = None, reason: str | None = None) -> Window:
        """Close a window; `reason` says why it ended here (recorded with it)."""
        if name not in self._open:
            raise RuntimeError(f"window {name!r} ended without begin")
        first_step, t_start = self._open.pop(name)
        t_end, stamp = self._edge(name, "end", step, work)
        window = Window(name, first_step, step, t_start, t_end, dict(work or {}), end_reason=reason)
        self._windows.append(window)
        batch = self.phases.window_end(name, stamp, t_end, self.launch.rank, self.launch.local_rank)
        if batch is not None and self.channel is not None:
            self.channel.send_phases(batch)  # after the edge: converting and sending is outside the window
        return window

    def mark_interval(self, name: str, edge: str, step: int) -> int:
        """An edge for the sampler only: no window is kept here and no phases are marked, so an interval inside a
        window (a log interval) adds nothing to the record; node_energy([name]) returns its energy. Returns the
        edge's time (monotonic ns), taken after a device sync. The name starts with INTERVAL_PREFIX, which keeps
        it out of the sampler's windows."""
        if not is_interval_mark(name):
            raise ValueError(f"interval {name!r} must start with {INTERVAL_PREFIX!r}")
        if self.sync is not None:
            self.sync()
        t_ns = self.clock.monotonic_ns()
        if self.channel is not None:
            self.channel.send_mark(Mark(name=name, edge=edge, step=step, t_ns=t_ns, rank=self.launch.rank,
                                        local_rank=self.launch.local_rank))
        return t_ns

    def live(self, span_s: float, timeout_s: float = 10.0) -> NodeLive | None:
        """The node's recent readings and sensor facts from its sampler; None without a sampler."""
        if self.channel is None:
            return None
        return NodeLive.from_dict(self.channel.query_live(span_s, timeout_s))

    def _everyone(self, obj: object, gather: Callable[[object], Sequence[object]] | None) -> list[object]:
        """Every rank's `obj` in rank order (a collective, so also a barrier); just [obj] on one rank."""
        return list(gather(obj)) if gather is not None and self.launch.world_size > 1 else [obj]

    def take_idle_baseline(self, enabled: bool, accelerator: bool,
                           gather: Callable[[object], Sequence[object]] | None = None,
                           stop: Callable[[], str | None] = lambda: None) -> IdleBaseline:
        """What a driver calls before its first window: measure_idle with the accelerator or CPU plan, or
        record that the baseline was skipped (--no-idle-baseline). Collective when enabled."""
        if not enabled:
            self.idle = IdleBaseline.unavailable("skipped (--no-idle-baseline)")
            return self.idle
        return self.measure_idle(ACCELERATOR_IDLE if accelerator else CPU_IDLE, gather, stop)

    def measure_idle(self, plan: IdlePlan, gather: Callable[[object], Sequence[object]] | None = None,
                     stop: Callable[[], str | None] = lambda: None) -> IdleBaseline:
        """Cool down, then meter an `idle` window: the baseline every window's energy is split by.

        Node leaders wait until their node's devices have settled (bounded by the plan); all ranks then
        meet (collective) and mark the idle window together, so no rank computes inside it. Call on
        every rank before the first measured window, with no work queued on the device. `stop`: the run's stop
        request, which ends the cool-down early (the idle window is still metered).
        """
        if self.channel is None:
            self.idle = IdleBaseline.unavailable(NO_SAMPLER_REASON)
            return self.idle
        settle = None
        if self.launch.is_node_leader:
            result = wait_until_settled(lambda span: self.live(span) or NodeLive("", span, ()), plan.settle,
                                        self.clock, stop)
            settle = dataclasses.asdict(dataclasses.replace(result, note=f"{node_name()}: {result.note}"))
        # Gathered as dicts: a gather may travel as JSON (TensorFlow's does).
        settles = [SettleResult(**s) for s in self._everyone(settle, gather) if isinstance(s, dict)]
        self.begin("idle", 0)
        self.clock.sleep_until_ns(self.clock.monotonic_ns() + int(plan.seconds * 1e9))
        window = self.end("idle", 0, reason=f"idle baseline: {plan.seconds:g} s with no work queued")
        window.energy = combine_energies(self._every_node_energy(["idle"], gather)).get("idle")
        self.idle = _baseline(window, settles)
        return self.idle

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
            if reply.get(SAMPLER_LOST):
                result[name] = _lost(str(reply.get("unavailable_reason")))
            elif reply.get("energy_j") is None and "devices" not in reply:
                result[name] = WindowEnergy.unavailable(str(reply.get("unavailable_reason")))
            else:
                result[name] = WindowEnergy.from_dict(reply)
        return result

    def attach_energy(self, gather: Callable[[object], Sequence[object]] | None = None) -> None:
        """Put the run's energy on this rank's windows: node leaders ask their sampler, `gather` (a
        collective returning every rank's object, e.g. torch's all_gather_object) brings the nodes
        together, and the sum over nodes is attached. Call on every rank (collective)."""
        combined = combine_energies(self._every_node_energy(None, gather))
        for window in self._windows:
            window.energy = combined.get(window.name)
            window.split = split_energy(window.energy, window.duration_s, self.idle)

    def _every_node_energy(self, names: Sequence[str] | None,
                           gather: Callable[[object], Sequence[object]] | None) -> list[dict[str, WindowEnergy]]:
        """Each node leader's window energies, on every rank (collective). They are gathered as dicts: a
        gather may travel as JSON (TensorFlow's does)."""
        mine = {name: energy.to_dict() for name, energy in self.node_energy(names).items()}
        return [{name: WindowEnergy.from_dict(energy) for name, energy in node.items()}
                for node in self._everyone(mine, gather) if isinstance(node, dict) and node]

    def close(self) -> None:
        """Stop an owned sampler and close the channel; the channel is closed also when the sampler's last writes
        fail (their error propagates)."""
        sampler, self._owned_sampler = self._owned_sampler, None
        try:
            if sampler is not None:
                sampler.stop()
        finally:
            if self.channel is not None:
                self.channel.close()
                self.channel = None

    def __enter__(self) -> WindowMeter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _lost(reason: str) -> WindowEnergy:
    """A window whose sampler was lost: no energy, and untrusted, as a window whose devices stopped answering (the
    record is then PARTIAL, never OK for energy); combined over nodes, the run's total is untrusted naming the node."""
    energy = WindowEnergy.unavailable(reason)
    energy.trusted, energy.untrusted_reason, energy.nodes = False, reason, [node_name()]
    return energy


def _baseline(window: Window, settles: Sequence[SettleResult]) -> IdleBaseline:
    """Idle power from the idle window's energy, with the settling outcome of every node."""
    energy = window.energy
    baseline = IdleBaseline(
        power_w=None, error_bound_w=None, devices=energy.devices if energy else 0, duration_s=window.duration_s,
        settled=all(s.settled for s in settles) if settles else None,
        settle_wait_s=max((s.waited_s for s in settles), default=None),
        settle_note="; ".join(s.note for s in settles) or None, nodes=energy.nodes if energy else [])
    if energy is None or energy.energy_j is None or window.duration_s <= 0:
        reason = energy.unavailable_reason if energy else "no energy for the idle window"
        return dataclasses.replace(baseline, unavailable_reason=f"idle window energy unavailable: {reason}")
    return dataclasses.replace(baseline, power_w=energy.energy_j / window.duration_s,
                               error_bound_w=(energy.error_bound_j or 0.0) / window.duration_s, method=energy.method)
