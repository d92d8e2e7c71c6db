"""Workload tasks: input and output length distributions, drawn with a fixed seed.

A task is what ML.ENERGY calls a task type: chat answers are long and prompts short, summaries the
reverse, code completion in between, classification-style requests answer in a few tokens. Lengths
are drawn from clipped log-normal distributions (median and spread below; chosen to resemble the
shapes of public chat/summarisation/code traces, not fitted to any one dataset).

Static batching, as `generate` does it: the requests of a batch are left-padded to the longest
prompt and all generate the batch's output length (drawn once per batch), since one `generate`
call produces the same number of new tokens for every sequence. Padding is not counted as work.
"""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class LengthDistribution:
    """Clipped log-normal: median, multiplicative spread (sigma of log), bounds (tokens)."""

    median: int
    sigma: float
    low: int
    high: int

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        values = np.round(self.median * np.exp(self.sigma * rng.standard_normal(n)))
        return np.clip(values, self.low, self.high).astype(np.int64)


@dataclasses.dataclass(frozen=True)
class Task:
    name: str
    description: str
    input_length: LengthDistribution
    output_length: LengthDistribution


TASKS: dict[str, Task] = {
    "chat": Task("chat", "chat-like: short prompts, long answers",
                 LengthDistribution(192, 0.5, 32, 512), LengthDistribution(256, 0.25, 128, 384)),
    "summarization": Task("summarization", "long-prompt summarisation: long documents, short summaries",
                          LengthDistribution(1536, 0.3, 768, 3072), LengthDistribution(96, 0.25, 48, 160)),
    "code": Task("code", "code completion: medium context, medium completion",
                 LengthDistribution(512, 0.4, 128, 1024), LengthDistribution(128, 0.3, 64, 256)),
    "classification": Task("classification", "short classification-style: short prompt, a few tokens out",
                           LengthDistribution(128, 0.4, 32, 384), LengthDistribution(4, 0.3, 2, 8)),
    "tiny": Task("tiny", "test workload (CPU, CI)",
                 LengthDistribution(12, 0.3, 6, 20), LengthDistribution(6, 0.0, 6, 6)),
}


@dataclasses.dataclass(frozen=True)
class Batch:
    """One batch of requests: prompt lengths (real tokens) and the forced output length."""

    input_lengths: tuple[int, ...]
    output_length: int

    @property
    def size(self) -> int:
        return len(self.input_lengths)

    @property
    def padded_length(self) -> int:
        return max(self.input_lengths)

    @property
    def input_tokens(self) -> int:
        return sum(self.input_lengths)

    @property
    def output_tokens(self) -> int:
        return self.size * self.output_length


def draw_batches(task: Task, batch_size: int, num_batches: int, seed: int,
                 output_length: int | None = None) -> list[Batch]:
    """The run's batches; the same seed gives the same lengths on every machine (numpy PCG64)."""
    rng = np.random.default_rng(seed)
    batches = []
    for _ in range(num_batches):
        inputs = task.input_length.draw(rng, batch_size)
        out = int(task.output_length.draw(rng, 1)[0]) if output_length is None else output_length
        batches.append(Batch(tuple(int(n) for n in inputs), out))
    return batches


def batches_extent(batches: list[Batch]) -> tuple[int, int]:
    """(longest padded prompt, longest prompt + output) of a run's batches: what the engines allocate for, and so
    what the memory estimate sizes (tighter than the task's extremes: a batch of 512 chat prompts is padded to its
    own longest prompt and has one output length, not the longest of each)."""
    return max(b.padded_length for b in batches), max(b.padded_length + b.output_length for b in batches)


def longest_sequence(task: Task, output_length: int | None = None) -> int:
    """The most positions any request of this task can need (for position limits and the memory estimate)."""
    return task.input_length.high + (task.output_length.high if output_length is None else output_length)
