"""TF_CONFIG for MultiWorkerMirroredStrategy, built from the launch environment.

TF's own SlurmClusterResolver asks `nvidia-smi` for GPUs (crashing on CPU-only nodes), builds
its task list from the GPU count (none on CPU nodes) and rewrites CUDA_VISIBLE_DEVICES. Here
the worker list comes from Slurm's node list and tasks-per-node instead, one worker per task
at `host:port_base + rank` (port_base = LaunchEnv.master_port; the global rank rather than the
local index, so that test "nodes" sharing one host get distinct ports), and device placement
is left to the strategy.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, MutableMapping
from typing import Any

from joulebench.launch import LaunchEnv, expand_nodelist, tasks_on_node
from jpwr import ValidationError

TF_CONFIG = "TF_CONFIG"


def worker_addresses(launch: LaunchEnv, environ: Mapping[str, str]) -> list[str]:
    """Every worker's `host:port` in rank order (Slurm's block distribution: node by node), ports base + rank."""
    port_base = launch.master_port
    if launch.launcher == "slurm":
        hosts = expand_nodelist(environ.get("SLURM_STEP_NODELIST") or environ.get("SLURM_JOB_NODELIST") or "")
        tasks = environ.get("SLURM_STEP_TASKS_PER_NODE") or environ.get("SLURM_TASKS_PER_NODE") or ""
        if not hosts or not tasks:
            raise ValidationError(
                "Slurm launch without SLURM_STEP_NODELIST / SLURM_STEP_TASKS_PER_NODE", "start the workers with srun"
            )
        counts = [tasks_on_node(tasks, node) for node in range(len(hosts))]
        if sum(counts[: launch.node_rank]) + launch.local_rank != launch.rank:
            raise ValidationError(
                f"rank {launch.rank} is not task {launch.local_rank} of node {launch.node_rank} in block order",
                "use srun's default block distribution (--distribution=block)",
            )
        ranked_hosts = [host for host, count in zip(hosts, counts, strict=True) for _ in range(count)]
        return [f"{host}:{port_base + rank}" for rank, host in enumerate(ranked_hosts)]
    if launch.num_nodes == 1:
        return [f"{launch.master_addr}:{port_base + i}" for i in range(launch.world_size)]
    raise ValidationError(
        f"{launch.launcher} launch over {launch.num_nodes} nodes: the other nodes' host names are unknown",
        "launch multi-node TensorFlow runs with srun (one task per node or per GPU), or set TF_CONFIG yourself",
    )


def tf_config(launch: LaunchEnv, environ: Mapping[str, str]) -> dict[str, Any]:
    """The TF_CONFIG dict of this process: all workers, and this process as worker number `rank`."""
    workers = worker_addresses(launch, environ)
    if len(workers) != launch.world_size:
        raise ValidationError(
            f"the node list gives {len(workers)} workers but the world size is {launch.world_size}",
            "launch with srun so that the node list and task count agree",
        )
    return {"cluster": {"worker": workers}, "task": {"type": "worker", "index": launch.rank}}


def export_tf_config(launch: LaunchEnv, environ: MutableMapping[str, str] | None = None) -> dict[str, Any]:
    """Set TF_CONFIG for a multi-worker run unless the user already set it; returns the one in force."""
    env = os.environ if environ is None else environ
    if TF_CONFIG in env:
        return json.loads(env[TF_CONFIG])
    config = tf_config(launch, env)
    env[TF_CONFIG] = json.dumps(config)
    return config
