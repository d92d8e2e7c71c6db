"""The model and the two calls the benchmark times: prefill only, and full generation.

Models come from transformers: a preset's config with random weights built directly on the
device in the run's dtype (no fp32 copy on the host), or a local checkpoint. Generation is
greedy with the end-of-sequence token disabled and min_new_tokens = max_new_tokens, so every
sequence gets exactly the batch's output length whatever the weights are.

Per-token times come from a logits processor, which `generate` calls once per new token right
after that step's forward pass: on GPUs it records a CUDA event (no host sync inside the loop),
on CPUs it reads the monotonic clock (CPU work is synchronous).
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from typing import Any

import torch
from transformers import (
    AutoModelForCausalLM,
    GenerationConfig,
    GPT2Config,
    LlamaConfig,
    LogitsProcessor,
    LogitsProcessorList,
)

from llm_inference.presets import ModelPreset
from llm_inference.tasks import Batch

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
PAD_TOKEN = 0


def build_model(shape: ModelPreset, checkpoint: str | None, precision: str, attention: str,
                device: torch.device, seed: int) -> torch.nn.Module:
    """Random weights from the preset's config (seeded), or the checkpoint's weights; eval mode on `device`."""
    dtype = DTYPES[precision]
    if checkpoint is not None:
        model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=dtype, attn_implementation=attention)
        return model.to(device).eval()
    config_class = GPT2Config if shape.family == "gpt2" else LlamaConfig
    config = config_class(**shape.hf_config_kwargs())
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation=attention)
    return model.eval()


def make_inputs(batch: Batch, vocab_size: int, seed: int, device: torch.device) -> dict[str, torch.Tensor]:
    """Left-padded random prompts (token ids 1..vocab-1) with their attention mask and positions."""
    generator = torch.Generator().manual_seed(seed)
    width = batch.padded_length
    ids = torch.full((batch.size, width), PAD_TOKEN, dtype=torch.long)
    mask = torch.zeros((batch.size, width), dtype=torch.long)
    for row, length in enumerate(batch.input_lengths):
        ids[row, width - length:] = torch.randint(1, vocab_size, (length,), generator=generator)
        mask[row, width - length:] = 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    return {"input_ids": ids.to(device), "attention_mask": mask.to(device), "position_ids": positions.to(device)}


class StepClock(LogitsProcessor):
    """Stamps each generated token (after its forward pass) without syncing the device."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.stamps: list[Any] = []
        self.start: Any = None

    def _stamp(self) -> Any:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter_ns()

    def begin(self) -> None:
        self.stamps = []
        self.start = self._stamp()

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        self.stamps.append(self._stamp())
        return scores

    def offsets_s(self) -> list[float]:
        """Seconds from begin() to each token (call after the device finished, e.g. after a sync)."""
        if self.cuda:
            return [self.start.elapsed_time(event) / 1e3 for event in self.stamps]
        return [(stamp - self.start) / 1e9 for stamp in self.stamps]


@dataclasses.dataclass(frozen=True)
class Timing:
    """One generate call: time to first token and the gaps between later tokens (s)."""

    ttft_s: float
    inter_token_s: tuple[float, ...]


class Engine:
    """A built model plus the prepared inputs of the run's batches."""

    def __init__(self, model: torch.nn.Module, vocab_size: int, device: torch.device) -> None:
        # generate() fills unset fields of the call's GenerationConfig from the model's: clear the model's
        # end-of-sequence token too, so no sequence can stop (or have that token suppressed) early.
        model.generation_config.eos_token_id = None
        self.model = model
        self.vocab_size = vocab_size
        self.device = device
        self.clock = StepClock(device)

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()

    @torch.inference_mode()
    def prefill(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        """The prompt's forward pass as generate's first step runs it: KV cache built, last logits, first token."""
        out = self.model(**inputs, use_cache=True, logits_to_keep=1)
        return out.logits[:, -1, :].argmax(dim=-1)

    @torch.inference_mode()
    def generate(self, inputs: dict[str, torch.Tensor], new_tokens: int) -> tuple[torch.Tensor, StepClock]:
        """Exactly `new_tokens` greedy tokens per sequence; returns the new tokens and the step clock."""
        config = GenerationConfig(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                                  eos_token_id=None, pad_token_id=PAD_TOKEN, use_cache=True)
        self.clock.begin()
        out = self.model.generate(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"],
                                  generation_config=config, logits_processor=LogitsProcessorList([self.clock]))
        return out[:, inputs["input_ids"].shape[1]:], self.clock

    def timing(self) -> Timing:
        """Timing of the last generate call; needs the device finished (the window's sync does that)."""
        offsets = self.clock.offsets_s()
        gaps = tuple(b - a for a, b in itertools.pairwise(offsets))
        return Timing(offsets[0], gaps)
