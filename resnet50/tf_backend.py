"""TensorFlow backend: Keras 3 `keras.applications.ResNet50` (v1) in a custom distributed loop.

One process per node (MirroredStrategy over its GPUs) or several workers
(MultiWorkerMirroredStrategy, TF_CONFIG from the launch environment). The step is
`strategy.run` inside a `tf.function`, because Keras 3 `model.fit` fails under
MultiWorkerMirroredStrategy (keras-team/keras#20585). Mixed precision through Keras policies
(fp16 adds a LossScaleOptimizer); --xla compiles each replica's forward and backward pass.
"""

from __future__ import annotations

import json
import os
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from joulebench.launch import LaunchEnv
from joulebench.phases import Replay
from joulebench.record_types import HardwareBlock
from jpwr.phases import PhaseRecorder
from resnet50.config import MOMENTUM, WEIGHT_DECAY, TrainConfig
from resnet50.flops import NUM_CLASSES
from resnet50.tf_cluster import export_tf_config
from resnet50.tf_data import tfrecord_dataset

GRADIENT_PACK_BYTES = 32 << 20  # all-reduce gradients in ~32 MiB packs, not one collective per variable
POLICIES = {"bf16": "mixed_bfloat16", "fp16": "mixed_float16", "fp32": "float32"}


def _gpus(config: TrainConfig) -> list[Any]:
    return [] if config.device == "cpu" else tf.config.list_physical_devices("GPU")


def discover(config: TrainConfig, launch: LaunchEnv) -> tuple[int, str]:
    """Replicas = workers × local GPUs (or one CPU replica per worker); lists devices without initialising them."""
    gpus = _gpus(config)
    return launch.world_size * max(1, len(gpus)), "cuda" if gpus else "cpu"


def create(config: TrainConfig, launch: LaunchEnv) -> TensorFlowBackend:
    return TensorFlowBackend(config, launch)


def _strategy(config: TrainConfig, launch: LaunchEnv, gpus: list[Any]) -> tf.distribute.Strategy:
    if config.device == "cpu":
        tf.config.set_visible_devices([], "GPU")
    if launch.world_size > 1:
        export_tf_config(launch)
        # MWMS turns on grappler's scoped-allocator pass for its all-reduces; with gradients already packed
        # (bytes_per_pack) it only adds graph-optimisation time: 40 s -> 17 s first step on 2 CPU workers.
        tf.config.optimizer.set_experimental_options({"scoped_allocator_optimization": False})
        implementation = (tf.distribute.experimental.CommunicationImplementation.NCCL if gpus
                          else tf.distribute.experimental.CommunicationImplementation.RING)
        return tf.distribute.MultiWorkerMirroredStrategy(
            communication_options=tf.distribute.experimental.CommunicationOptions(
                bytes_per_pack=GRADIENT_PACK_BYTES, implementation=implementation
            )
        )
    return tf.distribute.MirroredStrategy(devices=None if gpus else ["/cpu:0"])


class TensorFlowBackend:
    def __init__(self, config: TrainConfig, launch: LaunchEnv) -> None:
        self.config = config
        self.launch = launch
        gpus = _gpus(config)
        self.devices, self.device_kind = discover(config, launch)
        self.gpu_names = [tf.config.experimental.get_device_details(g).get("device_name", g.name) for g in gpus]
        keras.utils.set_random_seed(config.seed)
        keras.mixed_precision.set_global_policy(POLICIES[config.precision])
        keras.config.set_image_data_format("channels_last" if config.channels_last else "channels_first")
        self.strategy = _strategy(config, launch, gpus)
        replicas = self.strategy.num_replicas_in_sync
        if replicas != self.devices:
            raise RuntimeError(f"strategy has {replicas} replicas, expected {self.devices} (uneven GPUs per worker?)")
        size = config.image_size
        shape = (size, size, 3) if config.channels_last else (3, size, size)
        with self.strategy.scope():
            self.model = keras.applications.ResNet50(
                weights=None, input_shape=shape, classes=NUM_CLASSES, classifier_activation=None
            )
            optimizer = keras.optimizers.SGD(config.lr, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY)
            if config.precision == "fp16":
                optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
            optimizer.build(self.model.trainable_variables)
            self.optimizer = optimizer
        self.per_replica_batch = config.per_device_batch(self.devices)
        self._gradients = tf.function(self._replica_gradients, jit_compile=config.xla)
        self._step = tf.function(self._distributed_step)
        self._last: tf.Tensor | None = None
        self.fixed: tuple[Any, Any] | None = None
        if config.synthetic:
            self.fixed = self.strategy.experimental_distribute_values_from_function(
                lambda context: self._synthetic(shape, context.replica_id_in_sync_group)
            )
        else:
            dataset = self.strategy.distribute_datasets_from_function(lambda ctx: tfrecord_dataset(config, ctx))
            self.iterator = iter(dataset)

    def _synthetic(self, shape: tuple[int, int, int], replica: int) -> tuple[tf.Tensor, tf.Tensor]:
        """A fixed random batch created on the replica's own device."""
        seed = (self.config.seed, 1 + replica)
        images = tf.random.stateless_normal((self.per_replica_batch, *shape), seed=seed)
        labels = tf.random.stateless_uniform((self.per_replica_batch,), seed=seed, maxval=NUM_CLASSES, dtype=tf.int32)
        return images, labels

    def _replica_gradients(self, images: tf.Tensor, labels: tf.Tensor) -> tuple[tf.Tensor, list[tf.Tensor]]:
        """Forward and backward on one replica; the loss is pre-divided by the global batch (gradients are summed)."""
        with tf.GradientTape() as tape:
            logits = tf.cast(self.model(images, training=True), tf.float32)
            per_image = keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)
            loss = tf.nn.compute_average_loss(per_image, global_batch_size=self.config.global_batch_size)
            scaled = self.optimizer.scale_loss(loss) if self.config.precision == "fp16" else loss
        return loss, tape.gradient(scaled, self.model.trainable_variables)

    def _replica_step(self, images: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
        loss, grads = self._gradients(images, labels)
        self.optimizer.apply(grads, self.model.trainable_variables)  # all-reduces (sum) across replicas first
        return loss

    def _distributed_step(self, images: Any, labels: Any) -> tf.Tensor:
        losses = self.strategy.run(self._replica_step, args=(images, labels))
        return self.strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)

    def hardware(self) -> HardwareBlock:
        return {
            "device_kind": self.device_kind, "device_name": self.gpu_names[0] if self.gpu_names else "cpu",
            "devices": self.devices, "devices_per_worker": self.devices // self.launch.world_size,
            "workers": self.launch.world_size, "nodes": self.launch.num_nodes, "cpu_count": os.cpu_count(),
            "strategy": "MultiWorkerMirroredStrategy" if self.launch.world_size > 1 else "MirroredStrategy",
        }

    def train_step(self) -> tf.Tensor:
        images, labels = self.fixed if self.fixed is not None else next(self.iterator)
        self._last = self._step(images, labels)
        return self._last

    def sync(self) -> None:
        if self._last is not None:
            self._last.numpy()  # the value is ready only once the whole step (its all-reduce included) has run

    def loss_value(self, handle: tf.Tensor) -> float:
        return float(handle.numpy())

    def mark_phases(self, recorder: PhaseRecorder) -> None:
        """No phase marks: forward, backward and the update run inside one tf.function (out of scope, issue 17)."""

    def phase_replays(self) -> list[Replay]:
        return []  # config validation refuses --replay-phases with TensorFlow

    def _per_replica(self, value: Any) -> Any:
        return self.strategy.experimental_distribute_values_from_function(lambda _context: tf.constant(value))

    def any_rank(self, flag: bool) -> bool:
        if self.launch.world_size == 1:
            return flag
        total = self.strategy.reduce(tf.distribute.ReduceOp.SUM, self._per_replica(float(flag)), axis=None)
        return bool(total.numpy() > 0)

    def gather(self, obj: Any) -> list[Any]:
        """Objects as JSON bytes, padded to a common length for the strategy's gather; one entry per worker."""
        if self.launch.world_size == 1:
            return [obj]
        data = np.frombuffer(json.dumps(obj).encode(), dtype=np.uint8).astype(np.int32)
        lengths = self.strategy.gather(self._per_replica([len(data)]), axis=0).numpy()
        padded = np.zeros((1, int(lengths.max())), dtype=np.int32)  # collectives take no uint8
        padded[0, : len(data)] = data
        rows = self.strategy.gather(self._per_replica(padded), axis=0).numpy()
        local = self.strategy.num_replicas_in_sync // self.launch.world_size  # replica ids are worker-major
        return [json.loads(rows[i, : lengths[i]].astype(np.uint8).tobytes()) for i in range(0, len(rows), local)]

    def close(self) -> None:
        keras.mixed_precision.set_global_policy("float32")  # global state: leave the process as found
        keras.config.set_image_data_format("channels_last")
