"""The requests of an open-loop load: when each arrives and how long its prompt and answer are.

Open loop, as MLPerf's Server scenario: arrival times are fixed before the load starts and do not wait for
the engine, so a slow engine builds a queue instead of slowing the offered load. Three sources:
- Poisson arrivals at a rate (exponential gaps; the first request arrives one gap after the start),
- constant arrivals (gaps of 1/rate, the first at the start),
- `--rate max`: every request queued at the start (all arrival times 0),
or a replayed JSONL trace (`load_trace`).

Warm-up convention: warm-up requests are the load's own first requests, drawn from the same process at the
same rate (`arrivals` covers them: draw `warmup + count` arrival times). So the counted requests meet an
engine already in that rate's steady state (rows and queue filled as the rate fills them), not a burst
of warm-up requests queued ahead of them at t=0 (which would inflate the first counted TTFTs at low
rates). Under `--rate max` all of them arrive at 0 anyway.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np

from joulebench.arguments import comma_list
from jpwr import ValidationError
from llm_inference.tasks import Task

PROCESSES = ("poisson", "constant")
MAX_RATE = 1e6  # requests/s: far above any server; a finite rate above it is refused
_RATE_EXPECTED = f"expected a positive number of requests/s, or max; at most {MAX_RATE:g}"
_TRACE_FORMAT = ('one JSON object a line: {"arrival_s": seconds >= 0 (non-decreasing), "output_tokens": int >= 1, '
                 'and exactly one of "input_tokens": int >= 1, "prompt_ids": [token ids >= 0], "prompt": "text"}')
_PROMPT_FIELDS = ("input_tokens", "prompt_ids", "prompt")


@dataclasses.dataclass(frozen=True)
class Request:
    id: int  # 0..n-1 in arrival order
    arrival_s: float  # seconds after the load's start (non-decreasing in id)
    input_tokens: int
    output_tokens: int
    prompt_ids: tuple[int, ...] | None = None  # a trace's token ids; None: the engine draws random ids (seeded by id)
    warmup: bool = False


def parse_rate(text: str) -> float:
    """An argparse `type` for --rate: requests/s, or `max` (math.inf: everything queued at the start).

    "inf" is refused although float() reads it: the spelling for "as fast as possible" is `max`, so a
    typo'd or computed infinity never passes as a deliberate choice."""
    if text.strip().lower() == "max":
        return math.inf
    try:
        rate = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a rate ({_RATE_EXPECTED})") from None
    if not math.isfinite(rate) or not 0 < rate <= MAX_RATE:
        raise argparse.ArgumentTypeError(f"{text} is not a usable rate ({_RATE_EXPECTED}, e.g. 2.5)")
    return rate


def parse_rates(text: str) -> tuple[float, ...]:
    """An argparse `type` for --rates: comma-separated rates, kept in the order given (one record each); a
    repeated rate would measure the same point twice under one name, so it is refused."""
    rates = tuple(parse_rate(part) for part in comma_list(text, "rate", "1,2,4,8,max"))
    repeated = sorted({rate for rate in rates if rates.count(rate) > 1})
    if repeated:
        names = ", ".join("max" if math.isinf(rate) else f"{rate:g}" for rate in repeated)
        raise argparse.ArgumentTypeError(f"{text!r} repeats {names} (expected distinct rates, e.g. 1,2,4,8,max)")
    return rates


def arrival_times(process: str, rate: float, count: int, seed: int) -> np.ndarray:
    """`count` arrival times (seconds after the start, non-decreasing); `rate` = math.inf: all 0."""
    if process not in PROCESSES:
        raise ValueError(f"unknown arrival process {process!r}; known: {', '.join(PROCESSES)}")
    if math.isinf(rate):
        return np.zeros(count)
    if process == "constant":
        return np.arange(count) / rate
    return np.cumsum(np.random.default_rng(seed).exponential(1.0 / rate, count))


def draw_requests(task: Task, arrivals: np.ndarray, seed: int, output_length: int | None = None,
                  warmup: int = 0) -> list[Request]:
    """One request per arrival (warm-up included: the first `warmup` are flagged), each with its own input and
    output length from the task (numpy PCG64 seeded with `seed`, inputs drawn before outputs, as draw_batches);
    `output_length` forces every answer's length."""
    count = len(arrivals)
    if not 0 <= warmup <= count:
        raise ValueError(f"warmup {warmup} is outside [0, {count}] (arrivals include the warm-up requests)")
    rng = np.random.default_rng(seed)
    inputs = task.input_length.draw(rng, count)
    outputs = task.output_length.draw(rng, count) if output_length is None else np.full(count, output_length)
    return [Request(i, float(arrivals[i]), int(inputs[i]), int(outputs[i]), warmup=i < warmup) for i in range(count)]


def load_trace(path: str | Path, tokenize: Callable[[str], list[int]] | None = None,
               vocab_size: int | None = None) -> list[Request]:
    """A replayed load: one request per non-blank line of a JSONL file, in file order (ids 0..n-1).

    A text prompt is tokenized with `tokenize` (the checkpoint's tokenizer); without one only token counts or
    token ids can be replayed. Every defect is refused with the file and line named, before any device work: also a
    prompt token id the model's vocabulary (`vocab_size`) does not have, which the embedding would meet mid-run as an
    IndexError."""
    path = Path(path)
    if not path.is_file():
        raise ValidationError(f"--trace {path} does not exist (or is not a file)",
                              f"give the path of a JSONL trace: {_TRACE_FORMAT}")
    requests: list[Request] = []
    previous_line = 0
    for number, raw in enumerate(path.read_bytes().split(b"\n"), start=1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ValidationError(f"--trace {path} line {number} is not UTF-8 ({exc.reason} at byte {exc.start})",
                                  "save the trace as UTF-8") from None
        if not line.strip():
            continue
        request = _trace_request(path, number, line, len(requests), tokenize, vocab_size)
        if requests and request.arrival_s < requests[-1].arrival_s:
            raise ValidationError(
                f"--trace {path}: arrival_s decreases from {requests[-1].arrival_s:g} (line {previous_line}) to "
                f"{request.arrival_s:g} (line {number})",
                "sort the trace by arrival_s (arrivals are replayed in file order)")
        requests.append(request)
        previous_line = number
    if not requests:
        raise ValidationError(f"--trace {path} holds no requests (it is empty or blank)",
                              f"give at least one request, {_TRACE_FORMAT}")
    return requests


def _trace_request(path: Path, number: int, line: str, index: int, tokenize: Callable[[str], list[int]] | None,
                   vocab_size: int | None) -> Request:
    """One trace line as a Request, or the line's defect named."""
    def refuse(problem: str, fix: str = f"write {_TRACE_FORMAT}") -> ValidationError:
        return ValidationError(f"--trace {path} line {number}: {problem}", fix)

    try:
        entry = json.loads(line)
    except json.JSONDecodeError as exc:
        raise refuse(f"not valid JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(entry, dict):
        raise refuse(f"a JSON {type(entry).__name__}, not an object")
    extra = sorted(set(entry) - {"arrival_s", "output_tokens", *_PROMPT_FIELDS})
    if extra:
        raise refuse(f"unknown field(s) {', '.join(map(repr, extra))}")
    missing = [name for name in ("arrival_s", "output_tokens") if name not in entry]
    if missing:
        raise refuse(f"missing field(s) {', '.join(map(repr, missing))}")
    prompts = [name for name in _PROMPT_FIELDS if name in entry]
    if len(prompts) != 1:
        raise refuse(f"has {' and '.join(map(repr, prompts)) if prompts else 'none'} of "
                     f"{', '.join(map(repr, _PROMPT_FIELDS))}; exactly one is needed")
    arrival = entry["arrival_s"]
    if isinstance(arrival, bool) or not isinstance(arrival, int | float):
        raise refuse(f"arrival_s is {arrival!r}, not a number")
    if not math.isfinite(arrival) or arrival < 0:
        raise refuse(f"arrival_s is {arrival!r}; it must be a finite number of seconds >= 0")
    output_tokens = _whole(entry["output_tokens"], 1, "output_tokens", refuse)
    prompt_ids: tuple[int, ...] | None = None
    if "input_tokens" in entry:
        input_tokens = _whole(entry["input_tokens"], 1, "input_tokens", refuse)
    else:
        if "prompt_ids" in entry:
            ids = entry["prompt_ids"]
            if not isinstance(ids, list):
                raise refuse(f"prompt_ids is {ids!r}, not a list of token ids")
        elif tokenize is None:
            raise refuse("a text prompt, but no tokenizer is loaded",
                         "text prompts need --checkpoint with a tokenizer; or give input_tokens or prompt_ids")
        elif not isinstance(entry["prompt"], str):
            raise refuse(f"prompt is {entry['prompt']!r}, not text")
        else:
            ids = [int(token) for token in tokenize(entry["prompt"])]  # numpy ints from some tokenizers
        prompt_ids = tuple(_whole(token, 0, "a prompt token id", refuse) for token in ids)
        if not prompt_ids:
            raise refuse("the prompt has no tokens", "give a prompt of at least one token")
        beyond = [token for token in prompt_ids if token >= vocab_size] if vocab_size is not None else []
        if beyond and vocab_size is not None:
            raise refuse(f"prompt token id {beyond[0]} is beyond the model's vocabulary of {vocab_size} (ids 0 to "
                         f"{vocab_size - 1}; {len(beyond)} such id(s) on this line)",
                         "write the trace with the tokenizer of the model it is replayed on, or replay it on that "
                         "model (--preset/--checkpoint)")
        input_tokens = len(prompt_ids)
    return Request(index, float(arrival), input_tokens, output_tokens, prompt_ids)


def _whole(value: object, lowest: int, name: str, refuse: Callable[[str], ValidationError]) -> int:
    """A JSON whole number >= lowest (not a bool, not 3.0: a length written as a float is a defect upstream)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < lowest:
        raise refuse(f"{name} is {value!r}; it must be a whole number >= {lowest}")
    return value


def check_context(requests: list[Request], max_positions: int, model_name: str) -> None:
    """Refuse the first request whose prompt and answer together exceed the model's positions."""
    for request in requests:
        needed = request.input_tokens + request.output_tokens
        if needed > max_positions:
            raise ValidationError(
                f"request {request.id} needs {needed} positions (input {request.input_tokens} + output "
                f"{request.output_tokens}) but {model_name} has {max_positions}",
                "shorten that request's prompt or output_tokens (or --output-length), or use a model with more "
                "positions")
