"""Where this process sits in a run: rank, node and world size from torchrun or Slurm.

One definition for every driver. Node identity comes from SLURMD_NODENAME / SLURM_NODEID
(not the hostname) because test "nodes" of a local Slurm cluster share one host.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping

from joulebench.record_shape import checked_block
from joulebench.record_types import LaunchBlock
from jpwr import ValidationError
from jpwr.devices import node_name

DEFAULT_MASTER_PORT = 29500


@dataclasses.dataclass(frozen=True)
class LaunchEnv:
    """Rank layout of the current process (all zero-based)."""

    launcher: str  # "torchrun", "slurm" or "single"
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    node_rank: int
    num_nodes: int
    node_name: str
    master_addr: str
    master_port: int
    job_id: str | None = None

    @property
    def is_global_zero(self) -> bool:
        return self.rank == 0

    @property
    def is_node_leader(self) -> bool:
        """True on the one process per node that talks to the node's sampler."""
        return self.local_rank == 0

    def export_torch_env(self, environ: dict[str, str] | None = None) -> None:
        """Set the variables torch.distributed's env:// rendezvous reads (needed under srun)."""
        env = os.environ if environ is None else environ
        env.setdefault("MASTER_ADDR", self.master_addr)
        env.setdefault("MASTER_PORT", str(self.master_port))
        env["RANK"] = str(self.rank)
        env["LOCAL_RANK"] = str(self.local_rank)
        env["WORLD_SIZE"] = str(self.world_size)
        env["LOCAL_WORLD_SIZE"] = str(self.local_world_size)

    def to_dict(self) -> LaunchBlock:
        """The record's launch block (record_types.LaunchBlock declares it; the check keeps the two alike)."""
        return checked_block(LaunchBlock, dataclasses.asdict(self), "launch")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> LaunchEnv:
        """Read the layout from torchrun's variables, else Slurm's, else a single process."""
        env = os.environ if environ is None else environ
        if "RANK" in env and "WORLD_SIZE" in env:
            return _from_torchrun(env)
        if "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
            return _from_slurm(env)
        return cls(
            launcher="single", rank=0, local_rank=0, world_size=1, local_world_size=1,
            node_rank=0, num_nodes=1, node_name=node_name(env),
            master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
            master_port=_int(env, "MASTER_PORT", DEFAULT_MASTER_PORT),
            job_id=env.get("SLURM_JOB_ID"),
        )


def _int(env: Mapping[str, str], key: str, default: int | None = None) -> int:
    raw = env.get(key)
    if raw is None:
        if default is None:
            raise ValidationError(f"environment variable {key} is not set",
                                  f"launch with torchrun or srun, or set {key}")
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValidationError(f"{key}={raw!r} is not an integer", f"set {key} to a whole number") from None


def _from_torchrun(env: Mapping[str, str]) -> LaunchEnv:
    world = _int(env, "WORLD_SIZE")
    local_world = _int(env, "LOCAL_WORLD_SIZE", world)
    rank = _int(env, "RANK")
    return LaunchEnv(
        launcher="torchrun", rank=rank, local_rank=_int(env, "LOCAL_RANK", 0),
        world_size=world, local_world_size=local_world,
        node_rank=_int(env, "GROUP_RANK", rank // max(local_world, 1)),
        num_nodes=max(1, world // max(local_world, 1)), node_name=node_name(env),
        master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
        master_port=_int(env, "MASTER_PORT", DEFAULT_MASTER_PORT),
        job_id=env.get("TORCHELASTIC_RUN_ID") or env.get("SLURM_JOB_ID"),
    )


def _from_slurm(env: Mapping[str, str]) -> LaunchEnv:
    world = _int(env, "SLURM_NTASKS")
    nodes = _int(env, "SLURM_JOB_NUM_NODES", _int(env, "SLURM_NNODES", 1))
    tasks_per_node = env.get("SLURM_TASKS_PER_NODE", str(world // max(nodes, 1)))
    node_rank = _int(env, "SLURM_NODEID", 0)
    nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or ""
    hosts = expand_nodelist(nodelist)
    job_id = env.get("SLURM_JOB_ID")
    return LaunchEnv(
        launcher="slurm", rank=_int(env, "SLURM_PROCID"), local_rank=_int(env, "SLURM_LOCALID", 0),
        world_size=world, local_world_size=tasks_on_node(tasks_per_node, node_rank),
        node_rank=node_rank, num_nodes=nodes, node_name=node_name(env),
        master_addr=env.get("MASTER_ADDR") or (hosts[0] if hosts else "127.0.0.1"),
        master_port=_int(env, "MASTER_PORT", DEFAULT_MASTER_PORT + int(job_id or 0) % 1000),
        job_id=job_id,
    )


def tasks_on_node(tasks_per_node: str, node_rank: int) -> int:
    """Tasks on node `node_rank` from Slurm's compressed form, e.g. "2(x3),1"."""
    counts: list[int] = []
    for part in tasks_per_node.split(","):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if not match:
            continue
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    if not counts:
        return 1
    return counts[min(node_rank, len(counts) - 1)]


def expand_nodelist(nodelist: str) -> list[str]:
    """Expand Slurm's compressed host list ("n[1-3,5],gpu7") without calling scontrol."""
    hosts: list[str] = []
    for item in re.findall(r"[^,\[]+(?:\[[^\]]*\])?[^,]*", nodelist):
        match = re.fullmatch(r"([^\[]*)\[([^\]]*)\](.*)", item)
        if not match:
            hosts.append(item)
            continue
        prefix, ranges, suffix = match.groups()
        for rng in ranges.split(","):
            lo, _, hi = rng.partition("-")
            if not hi:
                hosts.append(f"{prefix}{lo}{suffix}")
                continue
            width = len(lo)
            hosts += [f"{prefix}{i:0{width}d}{suffix}" for i in range(int(lo), int(hi) + 1)]
    return hosts
