"""Model shapes (CARAML's GPT sizes plus `tiny`) and the two run-setting profiles.

Shapes come from CARAML's llm_benchmark_nvidia_amd.yaml and the Graphcore GPT-2 config
(see docs/llm_training.md). Run settings have two profiles:

* default: the fastest configuration measured with this driver (800M on one H100: bf16, MBS 8,
  no recompute, MBS 16 where device memory allows); sizes not yet measured here keep CARAML's parallel
  layout with bf16.
* caraml: CARAML's exact settings, so numbers can be set beside their tables.

The global batch is either fixed (`global_batch_size`) or `microbatches_per_replica` micro-batches
per data-parallel replica (weak scaling); CARAML's 13B/175B use 128 samples per replica.
"""

from __future__ import annotations

import dataclasses

GPT2_VOCAB_SIZE = 50257  # GPT-2 BPE: 50,256 merges-derived tokens plus <|endoftext|>
GPT2_EOD_TOKEN = 50256


@dataclasses.dataclass(frozen=True)
class ModelShape:
    """Architecture of one GPT size (tied embeddings, RoPE, LayerNorm, GeLU MLP with biases)."""

    name: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    ffn_hidden_size: int
    seq_length: int
    vocab_size: int  # before padding to a multiple of 128·TP
    eod_token: int


@dataclasses.dataclass(frozen=True)
class RunSettings:
    """Run settings of one profile for one model size; every field can be overridden on the command line."""

    precision: str
    micro_batch_size: int
    recompute: str
    tensor_parallel: int = 1
    pipeline_parallel: int = 1
    sequence_parallel: bool = False
    global_batch_size: int | None = None  # fixed GBS, else derived:
    microbatches_per_replica: int | None = None  # GBS = MBS · DP · this
    samples_per_replica: int | None = None  # GBS = DP · this (CARAML 13B/175B)
    # Without --micro-batch-size on a GPU, the MBS may grow by doubling up to this, keeping the GBS, where the
    # memory estimate fits the device (llm_training.memory.choose_micro_batch); None: the MBS above, fixed.
    max_micro_batch_size: int | None = None
    lr: float = 1e-4
    min_lr: float = 1e-5
    lr_warmup_samples: int = 216_320
    lr_decay_samples: int = 128_953_125


MODEL_SHAPES: dict[str, ModelShape] = {
    "tiny": ModelShape("tiny", 2, 64, 4, 256, 64, 1000, 999),
    "117M": ModelShape("117M", 12, 768, 12, 3072, 1024, GPT2_VOCAB_SIZE, GPT2_EOD_TOKEN),
    "800M": ModelShape("800M", 16, 2048, 8, 8192, 2048, GPT2_VOCAB_SIZE, GPT2_EOD_TOKEN),
    "13B": ModelShape("13B", 40, 5120, 32, 20480, 2048, GPT2_VOCAB_SIZE, GPT2_EOD_TOKEN),
    "175B": ModelShape("175B", 96, 12288, 96, 49152, 2048, GPT2_VOCAB_SIZE, GPT2_EOD_TOKEN),
}

# The tiny model must visibly learn within a few dozen steps: short warm-up, larger LR.
_TINY = RunSettings(
    precision="fp32", micro_batch_size=2, recompute="none", microbatches_per_replica=2,
    lr=1e-3, min_lr=1e-4, lr_warmup_samples=16, lr_decay_samples=100_000,
)

# Largest MBS the choice by device memory may pick: only MBS 8 and 16 were measured for 800M (one H100 SXM, GBS 64,
# docs/BENCHMARKS.md): MBS 16 (4 micro-batches) 78,727 tokens/s at 59.8 GiB peak allocated against 77,084 for MBS 8
# (37.5 GiB). Larger MBS are not measured: raise the cap after measuring them.
MBS_BY_MEMORY_CAP = 16

DEFAULT_SETTINGS: dict[str, RunSettings] = {
    "tiny": _TINY,
    "117M": RunSettings(precision="bf16", micro_batch_size=8, recompute="none", microbatches_per_replica=8),
    # Measured on one H100 SXM (docs/llm_training.md, docs/BENCHMARKS.md): bf16 MBS 8 beat MBS 4 and fp16;
    # MBS 16 with the same GBS 64 is +2 % more but needs ~60 GiB: MBS 8 is the floor that 40 GB devices run,
    # and devices whose memory fits MBS 16 by the estimate get it (MBS_BY_MEMORY_CAP).
    "800M": RunSettings(precision="bf16", micro_batch_size=8, recompute="none", microbatches_per_replica=8,
                        max_micro_batch_size=MBS_BY_MEMORY_CAP),
    "13B": RunSettings(
        precision="bf16", micro_batch_size=2, recompute="selective", tensor_parallel=2, pipeline_parallel=2,
        sequence_parallel=True, samples_per_replica=128,
    ),
    "175B": RunSettings(
        precision="bf16", micro_batch_size=2, recompute="selective", tensor_parallel=8, pipeline_parallel=8,
        sequence_parallel=True, samples_per_replica=128,
    ),
}

CARAML_SETTINGS: dict[str, RunSettings] = {
    "tiny": _TINY,
    # CARAML runs 117M only on Graphcore IPUs: fp16, micro-batch 1, GBS 512, recompute every layer.
    "117M": RunSettings(precision="fp16", micro_batch_size=1, recompute="full", global_batch_size=512),
    "800M": RunSettings(
        precision="fp16", micro_batch_size=4, recompute="selective", sequence_parallel=True, global_batch_size=32,
    ),
    "13B": RunSettings(
        precision="fp16", micro_batch_size=2, recompute="selective", tensor_parallel=2, pipeline_parallel=2,
        sequence_parallel=True, samples_per_replica=128,
    ),
    "175B": RunSettings(
        precision="bf16", micro_batch_size=2, recompute="selective", tensor_parallel=8, pipeline_parallel=8,
        sequence_parallel=True, samples_per_replica=128,
    ),
}

# CARAML's common Megatron settings (caraml-spec §2), used by both profiles.
INIT_METHOD_STD = 0.0048
ADAM_BETA1, ADAM_BETA2, ADAM_EPS = 0.9, 0.999, 1e-8
WEIGHT_DECAY = 0.1
CLIP_GRAD = 1.0
INITIAL_LOSS_SCALE, LOSS_SCALE_WINDOW, LOSS_SCALE_HYSTERESIS, MIN_LOSS_SCALE = 4096.0, 500, 2, 1.0
SEED = 42
DROPOUT = 0.1  # Megatron's default attention and hidden dropout, which CARAML keeps


def padded_vocab_size(vocab_size: int, tensor_parallel: int, multiple: int = 128) -> int:
    """Megatron pads the vocabulary to a multiple of 128·TP so each TP shard is GEMM-friendly."""
    step = multiple * tensor_parallel
    return -(-vocab_size // step) * step
