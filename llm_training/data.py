"""Training data: megatron-core's MockGPTDataset by default, a Megatron .bin/.idx dataset with --data-path.

Throughput does not depend on token values, so mock data is the default for benchmarking. Each
data-parallel replica reads its own contiguous share of every global batch; tensor- and
pipeline-parallel ranks of one replica read the same samples, so no broadcast is needed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import torch
from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig, MockGPTDataset

from llm_training.config import TrainConfig
from llm_training.corpus import check_corpus

BATCH_KEYS = ("tokens", "labels", "loss_mask", "position_ids")


@dataclasses.dataclass(frozen=True)
class TokenInfo:
    """The two tokenizer facts the datasets need (no tokenizer is loaded for training)."""

    vocab_size: int
    eod: int

    @property
    def unique_identifiers(self) -> dict[str, object]:
        """megatron hashes this into the dataset description (cache key)."""
        return {"class": type(self).__name__, "vocab_size": self.vocab_size, "eod": self.eod}


def build_train_dataset(cfg: TrainConfig, num_samples: int) -> GPTDataset:
    """Build on every rank (rank 0 first, megatron's builder synchronises); index caches go to out_dir. A corpus
    megatron could not read is a FormatError naming the file (llm_training.corpus), the run FAILED with its record."""
    if cfg.data_path:
        check_corpus(cfg.data_path, cfg.seq_length, cfg.vocab_size)
    blend = ([cfg.data_path], None) if cfg.data_path else None
    ds_config = GPTDatasetConfig(
        random_seed=cfg.seed,
        sequence_length=cfg.seq_length,
        blend=blend,
        split="1,0,0",
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
        create_attention_mask=False,  # attention is causal inside SDPA
        tokenizer=TokenInfo(cfg.vocab_size, cfg.eod_token),
        path_to_cache=str(Path(cfg.out_dir) / "data_cache"),
    )
    cls = GPTDataset if cfg.data_path else MockGPTDataset
    datasets = BlendedMegatronDatasetBuilder(cls, [num_samples, 0, 0], lambda: True, ds_config).build()
    return datasets[0]


def batch_device(cfg: TrainConfig, device: torch.device) -> torch.device:
    """Where a micro-batch is handed to megatron. With `--cuda-graphs step` megatron's StaticBufferLoader copies it
    into the graph's static buffers on a stream of its own that does not wait for the compute stream, so a batch
    this iterator had already sent to the GPU could still be in flight there (seen on an H100: the embedding's
    gather read token ids out of range, a device-side assert, only without CUDA_LAUNCH_BLOCKING). It gets the
    pinned host batch instead and makes the copy itself, ordered on its stream."""
    return torch.device("cpu") if cfg.cuda_graphs == "step" else device


def micro_batches(dataset: GPTDataset, cfg: TrainConfig, dp_rank: int, device: torch.device) -> Iterator[dict]:
    """Endless stream of this replica's micro-batches, global batch after global batch."""
    per_replica = cfg.global_batch_size // cfg.data_parallel
    # A copy from pageable host memory makes CUDA wait for the stream first; pinned memory keeps
    # the copy asynchronous, so the host can queue the next micro-batch while the GPU computes.
    pin = device.type == "cuda"
    target = batch_device(cfg, device)
    step = 0
    while True:
        first = (0 if cfg.overfit_batch else step) * cfg.global_batch_size + dp_rank * per_replica
        for k in range(cfg.num_microbatches):
            start = first + k * cfg.micro_batch_size
            items = [dataset[(start + i) % len(dataset)] for i in range(cfg.micro_batch_size)]
            batch = {key: torch.stack([torch.as_tensor(item[key]) for item in items]) for key in BATCH_KEYS}
            yield {key: (t.pin_memory() if pin else t).to(target, non_blocking=True) for key, t in batch.items()}
        step += 1
