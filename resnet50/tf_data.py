"""ImageNet TFRecords for the TensorFlow backend, in the layout tf_cnn_benchmarks reads.

Shards are `<dir>/train-00000-of-01024` ...; each record is a tf.train.Example with
`image/encoded` (JPEG), `image/class/label` (1-1000, 0 = background), synset, text, boxes and
sizes (inception's build_imagenet_data.py convention, also read by NVIDIA's examples and DALI).
The reader shards files over input pipelines (records when there are fewer files than
pipelines), decodes, random-crops, flips, normalises and batches per replica.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import tensorflow as tf

from jpwr.output import atomic_path
from resnet50.config import TrainConfig, tfrecord_pattern
from resnet50.flops import NUM_CLASSES

CROP_MARGIN = 1.14  # resize to this × image size, then random-crop (the usual 256 → 224 ratio)
SHUFFLE_BUFFER = 1024


def _bytes(value: bytes) -> tf.train.Feature:
    return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))


def _ints(*values: int) -> tf.train.Feature:
    return tf.train.Feature(int64_list=tf.train.Int64List(value=list(values)))


def _floats(*values: float) -> tf.train.Feature:
    return tf.train.Feature(float_list=tf.train.FloatList(value=list(values)))


def _example(jpeg: bytes, label: int, size: int, name: str) -> tf.train.Example:
    synset = f"n{label:08d}".encode()
    return tf.train.Example(features=tf.train.Features(feature={
        "image/encoded": _bytes(jpeg), "image/format": _bytes(b"JPEG"), "image/class/label": _ints(label),
        "image/class/synset": _bytes(synset), "image/class/text": _bytes(b"synthetic noise " + synset),
        "image/object/bbox/xmin": _floats(0.0), "image/object/bbox/ymin": _floats(0.0),
        "image/object/bbox/xmax": _floats(1.0), "image/object/bbox/ymax": _floats(1.0),
        "image/object/bbox/label": _ints(label), "image/height": _ints(size), "image/width": _ints(size),
        "image/channels": _ints(3), "image/colorspace": _bytes(b"RGB"), "image/filename": _bytes(name.encode()),
    }))


def write_tfrecords(out: Path, images: int, shards: int, image_size: int, seed: int, subset: str = "train") -> int:
    """Write `images` noise JPEGs with labels 1-1000 into `shards` files named like ImageNet's; returns the count."""
    rng = np.random.default_rng(seed)
    out.mkdir(parents=True, exist_ok=True)
    for shard in range(shards):
        path = out / f"{subset}-{shard:05d}-of-{shards:05d}"
        with atomic_path(path) as tmp, tf.io.TFRecordWriter(str(tmp)) as writer:  # whole shards or none
            for index in range(shard, images, shards):
                pixels = rng.integers(0, 256, (image_size, image_size, 3), dtype=np.uint8)
                jpeg = tf.io.encode_jpeg(pixels, quality=90).numpy()
                label = int(rng.integers(1, NUM_CLASSES + 1))
                writer.write(_example(jpeg, label, image_size, f"{subset}_{index:08d}.JPEG").SerializeToString())
    return images


def parse_record(serialized: tf.Tensor, image_size: int, channels_last: bool) -> tuple[tf.Tensor, tf.Tensor]:
    """One record → (normalised float32 image, label 0-999)."""
    features = tf.io.parse_single_example(serialized, {
        "image/encoded": tf.io.FixedLenFeature([], tf.string),
        "image/class/label": tf.io.FixedLenFeature([], tf.int64),
    })
    image = tf.io.decode_jpeg(features["image/encoded"], channels=3)
    resized = round(image_size * CROP_MARGIN)
    image = tf.image.resize(image, (resized, resized))
    image = tf.image.random_crop(image, (image_size, image_size, 3))
    image = tf.image.random_flip_left_right(image) / 127.5 - 1.0
    if not channels_last:
        image = tf.transpose(image, (2, 0, 1))
    return image, tf.cast(features["image/class/label"] - 1, tf.int32)


def tfrecord_dataset(config: TrainConfig, context: tf.distribute.InputContext) -> tf.data.Dataset:
    """This input pipeline's endless batches of `per-replica batch` images."""
    pattern = tfrecord_pattern(config.data)
    files = tf.io.gfile.glob(pattern)
    pipelines, index = context.num_input_pipelines, context.input_pipeline_id
    file_ds = tf.data.Dataset.list_files(pattern, shuffle=True, seed=config.seed)
    if len(files) >= pipelines:
        records = file_ds.shard(pipelines, index).interleave(
            tf.data.TFRecordDataset, cycle_length=min(8, len(files)), num_parallel_calls=tf.data.AUTOTUNE,
            deterministic=False,
        )
    else:
        records = tf.data.TFRecordDataset(file_ds).shard(pipelines, index)
    batch = context.get_per_replica_batch_size(config.global_batch_size)
    return (
        records.shuffle(SHUFFLE_BUFFER, seed=config.seed + index).repeat()
        .map(lambda r: parse_record(r, config.image_size, config.channels_last), num_parallel_calls=tf.data.AUTOTUNE)
        .batch(batch, drop_remainder=True)
        .prefetch(tf.data.AUTOTUNE)
    )
