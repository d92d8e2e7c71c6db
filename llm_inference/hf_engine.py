"""The `hf` engine: transformers' own `generate`, the baseline the static engine is compared with.

Greedy, with the end-of-sequence token disabled (also the model's own), so every sequence gets exactly
the requested number of tokens (max_new_tokens; without an end-of-sequence token there is nothing for a
minimum length to suppress). The step clock is generate's logits processor: it runs right after each
step's forward pass.

The avoidable loss removed (docs/perf-notes.md, issue 16): on Hopper GPUs PyTorch prefers cuDNN's
attention, which builds an execution graph for every new key length. In `generate` the key length
grows by one each step, so every step of a first pass over a batch paid that build (llama-1b, batch 1
on an H100: more than 55 ms per token instead of about 12 once the graphs are cached). SDPA's
flash and memory-efficient kernels need no per-shape set-up, so calls run with those (and math as the
fallback), which is what a plain `generate` gets wherever cuDNN attention is not preferred.
"""

from __future__ import annotations

import torch
from torch.nn.attention import sdpa_kernel
from transformers import GenerationConfig, LogitsProcessorList

from llm_inference.engine import PAD_TOKEN, SHAPE_FREE_ATTENTION, StepClock, Timing
from llm_inference.tasks import Batch


class HFEngine:
    """A transformers model and its `generate` (dynamic KV cache, eager forward passes)."""

    name = "hf"

    def __init__(self, model: torch.nn.Module, device: torch.device) -> None:
        # generate() fills unset fields of the call's GenerationConfig from the model's: clear the model's
        # end-of-sequence token too, so no sequence can stop (or have that token suppressed) early.
        model.generation_config.eos_token_id = None
        self.model = model
        self.device = device
        self.clock = StepClock(device)

    def describe(self) -> dict[str, object]:
        return {"engine": self.name, "cuda_graphs": False,
                "sdpa_backends": [backend.name for backend in SHAPE_FREE_ATTENTION]}

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()

    def prepare(self, batches: list[Batch]) -> float:
        """Nothing to set up: the dynamic cache grows inside generate."""
        return 0.0

    @torch.inference_mode()
    def prefill(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        """The prompt's forward pass as generate's first step runs it: KV cache built, last logits, first token."""
        with sdpa_kernel(SHAPE_FREE_ATTENTION):
            out = self.model(**inputs, use_cache=True, logits_to_keep=1)
        return out.logits[:, -1, :].argmax(dim=-1)

    @torch.inference_mode()
    def generate(self, inputs: dict[str, torch.Tensor], new_tokens: int) -> torch.Tensor:
        """Exactly `new_tokens` greedy tokens per sequence."""
        config = GenerationConfig(max_new_tokens=new_tokens, do_sample=False, eos_token_id=None,
                                  pad_token_id=PAD_TOKEN, use_cache=True)
        self.clock.begin()
        with sdpa_kernel(SHAPE_FREE_ATTENTION):
            out = self.model.generate(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"],
                                      generation_config=config, logits_processor=LogitsProcessorList([self.clock]))
        return out[:, inputs["input_ids"].shape[1]:]

    def timing(self) -> Timing:
        """Timing of the last generate call; needs the device finished (the window's sync does that)."""
        return self.clock.timing()
