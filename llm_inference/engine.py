"""What every engine shares: the model build, the prompts, the step clock, and the calls the windows time.

Models come from transformers: a preset's config with random weights built directly on the device
in the run's dtype (no fp32 copy on the host), or a local checkpoint. The `hf` engine generates with
that model; the `static` engine (the default) takes its weights into compact model code. Both are
greedy and produce exactly the requested number of tokens (no end-of-sequence stop), so every run
executes the same kernels on the same shapes whatever the weights are.

Per-token times: the clock is stamped once per new token, after that step's work is queued; on GPUs
a stamp is a CUDA event (no host sync inside the loop), on CPUs the monotonic clock.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from typing import Any, Protocol

import torch
from torch.nn.attention import SDPBackend
from transformers import AutoModelForCausalLM, GPT2Config, LlamaConfig, LogitsProcessor

from llm_inference.arrivals import Request
from llm_inference.presets import ModelPreset
from llm_inference.tasks import Batch

# SDPA backends that need no set-up per shape: on Hopper, PyTorch prefers cuDNN attention, which builds an execution
# graph for every new key length (tens of ms each): transformers' generate grows the key length every step, and a
# serving engine prefills a new prompt width almost every time (docs/perf-notes.md).
SHAPE_FREE_ATTENTION = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
PAD_TOKEN = 0


def hf_config(shape: ModelPreset) -> Any:
    """The transformers config of a preset's shape."""
    config_class = GPT2Config if shape.family == "gpt2" else LlamaConfig
    return config_class(**shape.hf_config_kwargs())


def build_model(shape: ModelPreset, checkpoint: str | None, precision: str, attention: str,
                device: torch.device, seed: int) -> torch.nn.Module:
    """Random weights from the preset's config (seeded), or the checkpoint's weights; eval mode on `device`."""
    dtype = DTYPES[precision]
    if checkpoint is not None:
        model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=dtype, attn_implementation=attention)
        return model.to(device).eval()
    config = hf_config(shape)
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


def request_prompt(request: Request, vocab_size: int, seed: int) -> torch.Tensor:
    """A load request's prompt on the host: the trace's token ids, or random ids 1..vocab-1 seeded by its id."""
    if request.prompt_ids is not None:
        return torch.tensor(request.prompt_ids, dtype=torch.long)
    generator = torch.Generator().manual_seed(seed * 1_000_003 + request.id)
    return torch.randint(1, vocab_size, (request.input_tokens,), generator=generator)


@dataclasses.dataclass(frozen=True)
class Timing:
    """One generate call: time to first token and the gaps between later tokens (s)."""

    ttft_s: float
    inter_token_s: tuple[float, ...]


class StepClock(LogitsProcessor):
    """Stamps each generated token without syncing the device; also a logits processor for transformers' generate."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.stamps: list[Any] = []
        self.start: Any = None

    def _now(self) -> Any:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter_ns()

    def begin(self) -> None:
        self.stamps = []
        self.start = self._now()

    def stamp(self) -> None:
        self.stamps.append(self._now())

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        self.stamp()
        return scores

    def offsets_s(self) -> list[float]:
        """Seconds from begin() to each token (call after the device finished, e.g. after a sync)."""
        if self.cuda:
            return [self.start.elapsed_time(event) / 1e3 for event in self.stamps]
        return [(stamp - self.start) / 1e9 for stamp in self.stamps]

    def timing(self) -> Timing:
        offsets = self.offsets_s()
        return Timing(offsets[0], tuple(b - a for a, b in itertools.pairwise(offsets)))


class Engine(Protocol):
    """The calls run_point makes; `prepare` does per-shape set-up (allocation, capture) outside the windows."""

    name: str
    device: torch.device

    def describe(self) -> dict[str, object]: ...

    def prepare(self, batches: list[Batch]) -> float: ...

    def prefill(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor: ...

    def generate(self, inputs: dict[str, torch.Tensor], new_tokens: int) -> torch.Tensor: ...

    def timing(self) -> Timing: ...

    def sync(self) -> None: ...
