"""TF_CONFIG from Slurm/torchrun variables, without TF's GPU-probing SlurmClusterResolver."""

from __future__ import annotations

import json

import pytest

from joulebench.launch import LaunchEnv
from jpwr.errors import ValidationError
from resnet50.tf_cluster import TF_CONFIG, export_tf_config, tf_config


def slurm_env(rank: int, node: int, local: int, **extra: str) -> dict[str, str]:
    env = {"SLURM_PROCID": str(rank), "SLURM_NODEID": str(node), "SLURM_LOCALID": str(local), "SLURM_NTASKS": "5",
           "SLURM_JOB_NUM_NODES": "3", "SLURM_JOB_ID": "100", "SLURM_STEP_NODELIST": "cpu[07-08],gpu1",
           "SLURM_STEP_TASKS_PER_NODE": "2(x2),1", "SLURM_TASKS_PER_NODE": "2(x2),1", "MASTER_PORT": "31000"}
    env.update(extra)
    return env


def test_slurm_workers_in_block_order_with_one_port_per_rank() -> None:
    env = slurm_env(rank=3, node=1, local=1)
    config = tf_config(LaunchEnv.from_env(env), env)
    assert config == {
        "cluster": {"worker": ["cpu07:31000", "cpu07:31001", "cpu08:31002", "cpu08:31003", "gpu1:31004"]},
        "task": {"type": "worker", "index": 3},
    }


def test_cyclic_distribution_is_refused() -> None:
    env = slurm_env(rank=1, node=1, local=0)  # rank 1 on the second node: srun --distribution=cyclic
    with pytest.raises(ValidationError, match="block"):
        tf_config(LaunchEnv.from_env(env), env)


def test_single_node_torchrun_and_multinode_torchrun() -> None:
    env = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "10.0.0.5", "MASTER_PORT": "4000"}
    assert tf_config(LaunchEnv.from_env(env), env)["cluster"]["worker"] == ["10.0.0.5:4000", "10.0.0.5:4001"]
    env.update(WORLD_SIZE="4")  # two nodes of two: the second node's name is unknown to torchrun's variables
    with pytest.raises(ValidationError, match="srun"):
        tf_config(LaunchEnv.from_env(env), env)


def test_user_tf_config_wins_and_ours_is_exported() -> None:
    env = slurm_env(rank=0, node=0, local=0)
    env[TF_CONFIG] = json.dumps({"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 0}})
    assert export_tf_config(LaunchEnv.from_env(env), env)["cluster"]["worker"] == ["a:1", "b:1"]
    del env[TF_CONFIG]
    exported = export_tf_config(LaunchEnv.from_env(env), env)
    assert json.loads(env[TF_CONFIG]) == exported and exported["task"]["index"] == 0
