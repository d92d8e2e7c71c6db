"""Keras/TensorFlow backend on the CPU: custom-loop training, TFRecord input, 2-worker MultiWorkerMirroredStrategy."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from resnet50.cli import build_parser, main
from resnet50.config import TrainConfig
from resnet50.flops import resnet50_flops
from tests.driver_helpers import with_options
from tests.resnet50.conftest import REPO, RESNET, SMALL, assert_loss_decreased, clean_env, free_port, read_record

tf = pytest.importorskip("tensorflow")


def test_fixed_batch_bf16_training(tmp_path: Path) -> None:
    code = main(["train", "--framework", "tensorflow", *SMALL, "--precision", "bf16", "--warmup-iterations", "1",
                 "--iterations", "4", "--out-dir", str(tmp_path)])
    record = read_record(tmp_path)
    assert code == 0 and record["status"] == "OK"
    assert_loss_decreased(record)
    metrics = record["metrics"]
    assert metrics["variant"] == "v1" and "keras ResNet50 v1" in metrics["architecture"]
    assert metrics["flops_per_image_training"] == 3 * resnet50_flops("v1", 64).forward
    assert record["hardware"]["strategy"] == "MirroredStrategy" and record["software"]["keras"]
    assert metrics["iterations"] == 4 and record["windows"][-1]["work"] == {"images": 32}


def test_tfrecord_reader_and_training(tmp_path: Path) -> None:
    data = tmp_path / "tfrecords"
    assert main(["make-data", str(data), "--format", "tfrecord", "--images", "24", "--shards", "3",
                 "--image-size", "40"]) == 0
    assert sorted(p.name for p in data.iterdir()) == [f"train-0000{i}-of-00003" for i in range(3)]
    args = build_parser().parse_args(["train", "--framework", "tensorflow", "--data", str(data), "--image-size", "32",
                                      "--global-batch-size", "4"])
    from resnet50.tf_data import tfrecord_dataset

    # pipeline 1 of 2, two replicas: per-replica batch 2, a third of the files... records of its own shard
    context = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=1, num_replicas_in_sync=2)
    images, labels = next(iter(tfrecord_dataset(TrainConfig.from_args(args), context)))
    assert images.shape == (2, 32, 32, 3) and images.dtype == tf.float32
    assert float(tf.reduce_min(images)) >= -1.0 and float(tf.reduce_max(images)) <= 1.0
    assert labels.dtype == tf.int32 and all(0 <= int(x) < 1000 for x in labels)
    code = main(["train", "--framework", "tensorflow", *with_options(SMALL, "--image-size", "32", "--global-batch-size",
                                                                     "4"), "--data", str(data),
                 "--precision", "fp32", "--warmup-iterations", "1", "--iterations", "2",
                 "--out-dir", str(tmp_path / "run")])
    record = read_record(tmp_path / "run")
    assert code == 0 and record["config"]["data_format"] == "tfrecord" and record["metrics"]["iterations"] == 2


@pytest.mark.slow
def test_multiworker_two_processes_from_slurm_env(tmp_path: Path) -> None:
    """Two real workers as two 'nodes' of one task (both on this host, as in a local Slurm cluster);
    TF_CONFIG derived from Slurm's variables on CPU-only nodes, energy gathered from both node leaders."""
    port = free_port(2)
    cmd = [*RESNET, "train", "--framework", "tensorflow", "--image-size", "32", "--global-batch-size", "4",
           "--device", "cpu", "--lr", "0.002", "--log-interval", "1", "--precision", "fp32",
           "--warmup-iterations", "1", "--iterations", "2", "--out-dir", str(tmp_path)]
    slurm = {"SLURM_NTASKS": "2", "SLURM_JOB_NUM_NODES": "2", "SLURM_JOB_ID": "4242", "SLURM_LOCALID": "0",
             "SLURM_STEP_NODELIST": "localhost,127.0.0.1", "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
             "SLURM_TASKS_PER_NODE": "1(x2)", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"}
    workers = [subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=clean_env(SLURM_PROCID=str(r), SLURM_NODEID=str(r), SLURMD_NODENAME=f"n{r}",
                                              **slurm))
               for r in (0, 1)]
    outputs = [w.communicate(timeout=300) for w in workers]
    for worker, (_out, err) in zip(workers, outputs, strict=True):
        assert worker.returncode == 0, err[-3000:]
    record = read_record(tmp_path)
    assert record["status"] == "OK" and record["hardware"]["strategy"] == "MultiWorkerMirroredStrategy"
    assert record["launch"]["launcher"] == "slurm" and record["launch"]["num_nodes"] == 2
    assert record["config"]["devices"] == 2
    assert record["config"]["per_device_batch_size"] == 2 and record["hardware"]["workers"] == 2
    losses = [loss for _step, loss in record["metrics"]["losses"]]
    assert len(losses) == 3 and all(abs(loss) < 1e6 for loss in losses)
    # energy was gathered from both node leaders; neither has a sampler, so the sum is unavailable, with the reason
    assert "no jpwr sampler" in record["windows"][-1]["energy"]["unavailable_reason"]
    assert record["metrics"]["energy_wh"] is None
    assert "JOULEBENCH_RESULT" in outputs[0][0] and "JOULEBENCH_RESULT" not in outputs[1][0]
