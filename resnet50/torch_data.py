"""Input for the torch backend: a fixed synthetic batch on the device, or an ImageFolder JPEG tree.

The synthetic batch is made once on the device (as tf_cnn_benchmarks' synthetic mode does), so
the steady window measures the model and not a host pipeline. The JPEG path uses the standard
ImageNet training transforms with a DistributedSampler, one shard per rank.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
import torchvision
from PIL import Image
from torchvision.transforms import v2 as transforms

from jpwr import ValidationError
from jpwr.output import atomic_path
from resnet50.config import TrainConfig, jpeg_root
from resnet50.flops import NUM_CLASSES

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
Batch = tuple[torch.Tensor, torch.Tensor]


def synthetic_batch(config: TrainConfig, batch: int, device: torch.device, seed: int) -> Batch:
    """One random batch (normalised-image statistics, uniform labels) created on `device`."""
    generator = torch.Generator(device=device).manual_seed(seed)
    images = torch.randn(batch, 3, config.image_size, config.image_size, device=device, generator=generator)
    if config.channels_last:
        images = images.contiguous(memory_format=torch.channels_last)
    labels = torch.randint(0, NUM_CLASSES, (batch,), device=device, generator=generator)
    return images, labels


def jpeg_batches(config: TrainConfig, batch: int, device: torch.device, rank: int, world: int) -> Iterator[Batch]:
    """Endless per-rank batches from an ImageFolder tree, moved to `device` without blocking the host."""
    transform = transforms.Compose([
        transforms.ToImage(),
        transforms.RandomResizedCrop(config.image_size, antialias=True),
        transforms.RandomHorizontalFlip(),
        transforms.ToDtype(torch.float32, scale=True),
        transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD),
    ])
    dataset = torchvision.datasets.ImageFolder(str(jpeg_root(config.data)), transform=transform)
    sampler = torch.utils.data.DistributedSampler(dataset, world, rank, shuffle=True, seed=config.seed, drop_last=True)
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=batch, sampler=sampler, drop_last=True, num_workers=config.data_workers,
        pin_memory=device.type == "cuda", persistent_workers=config.data_workers > 0,
    )
    if len(loader) == 0:
        raise ValidationError(
            f"--data {config.data} has {len(dataset)} images, less than one batch of {batch} per each of {world} ranks",
            "use a larger data set or a smaller --global-batch-size",
        )
    return _cycle(loader, sampler, device, config.channels_last)


def _cycle(loader: torch.utils.data.DataLoader, sampler: torch.utils.data.DistributedSampler,
           device: torch.device, channels_last: bool) -> Iterator[Batch]:
    memory_format = torch.channels_last if channels_last else torch.contiguous_format
    epoch = 0
    while True:
        sampler.set_epoch(epoch)
        for images, labels in loader:
            yield (images.to(device, non_blocking=True, memory_format=memory_format),
                   labels.to(device, non_blocking=True))
        epoch += 1


def write_jpeg_tree(root: Path, classes: int, per_class: int, image_size: int, seed: int) -> int:
    """Write a tiny ImageFolder tree `<root>/train/<class>/<n>.jpg` of noise images; returns the image count."""
    rng = np.random.default_rng(seed)
    for index in range(classes):
        folder = root / "train" / f"n{index:08d}"
        folder.mkdir(parents=True, exist_ok=True)
        for n in range(per_class):
            pixels = rng.integers(0, 256, (image_size, image_size, 3), dtype=np.uint8)
            with atomic_path(folder / f"{n:05d}.jpg") as tmp:  # whole images or none (the name ends in .tmp)
                Image.fromarray(pixels).save(tmp, format="JPEG", quality=90)
    return classes * per_class
