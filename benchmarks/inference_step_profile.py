#!/usr/bin/env python3
"""Per-step cost of the inference engines on one GPU, no meter: where transformers' generate loses time,
and what the static engine's decode step costs per batch size.

    python benchmarks/inference_step_profile.py --out-dir $OUT/profile
    python benchmarks/inference_step_profile.py --sections hf --out-dir /tmp/p     # only the generate variants

Section `hf` (llama-1b, batch 1, bf16): ms per new token (wall clock, device synced before and after) of
plain `model.generate` beside the call the driver made before issue 16 and that call minus one of its
parts at a time, and the current `--engine hf`; then a torch.profiler table of the driver's old call.
Section `static`: the static engine's set-up (cache + CUDA-graph capture) and its ms per token for chat-
like prompts at several batch sizes, with the peak memory beside the driver's memory estimate.
Section `eager-decode`: the same with the decode step's layer pieces uncompiled (the engine before they were
compiled); `compiled-step` (experiment): the whole decode step compiled by inductor, per attended length.
Writes profile_<sections>.json (+ profile_table.txt).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import torch  # noqa: E402 (after the repository is on sys.path)
from transformers import GenerationConfig, LogitsProcessorList  # noqa: E402

from llm_inference import memory  # noqa: E402
from llm_inference.compact_model import CompactModel  # noqa: E402
from llm_inference.engine import PAD_TOKEN, StepClock, build_model, make_inputs  # noqa: E402
from llm_inference.hf_engine import HFEngine  # noqa: E402
from llm_inference.presets import PRESETS  # noqa: E402
from llm_inference.static_engine import DecodeState, StaticEngine  # noqa: E402
from llm_inference.tasks import TASKS, Batch, draw_batches  # noqa: E402

CUDA = torch.device("cuda")


def per_token_ms(call: Any, repeats: int) -> tuple[float, int]:
    """Median wall ms per generated token over `repeats` calls (device synced around each), and tokens per call."""
    times, tokens = [], 0
    for _ in range(repeats):
        torch.cuda.synchronize()
        started = time.perf_counter()
        tokens = call()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - started) / tokens * 1e3)
    return statistics.median(times), tokens


def hf_variants(new_tokens: int, repeats: int) -> dict[str, Any]:
    shape = PRESETS["llama-1b"]
    model = build_model(shape, None, "bf16", "sdpa", CUDA, seed=1)
    batch = Batch((192,), new_tokens)
    inputs = make_inputs(batch, shape.vocab_size, 1, CUDA)
    ids, mask = inputs["input_ids"], inputs["attention_mask"]
    clock = StepClock(CUDA)

    def old_call(with_clock: bool = True, min_new: bool = True, with_mask: bool = True) -> int:
        """The driver's generate call before issue 16 (and with one part removed)."""
        config = GenerationConfig(max_new_tokens=new_tokens, min_new_tokens=new_tokens if min_new else None,
                                  do_sample=False, eos_token_id=None, pad_token_id=PAD_TOKEN, use_cache=True)
        clock.begin()
        with torch.inference_mode():
            out = model.generate(input_ids=ids, attention_mask=mask if with_mask else None, generation_config=config,
                                 logits_processor=LogitsProcessorList([clock] if with_clock else []))
        return out.shape[1] - ids.shape[1]

    def plain() -> int:
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=new_tokens)
        return out.shape[1] - ids.shape[1]

    engine = HFEngine(model, CUDA)
    variants = {
        "plain model.generate(ids, max_new_tokens)": plain,
        "driver before issue 16": old_call,
        "  without the step-clock logits processor": lambda: old_call(with_clock=False),
        "  without min_new_tokens": lambda: old_call(min_new=False),
        "  without the attention mask": lambda: old_call(with_mask=False),
        "--engine hf now": lambda: engine.generate(inputs, new_tokens).shape[1],
    }
    plain()  # warm-up: kernels chosen, allocator grown
    result: dict[str, Any] = {}
    for name, call in variants.items():
        try:
            ms, tokens = per_token_ms(call, repeats)
            result[name] = {"ms_per_token": ms, "tokens": tokens}
        except Exception as exc:  # a failing variant is a row with its error
            result[name] = {"error": f"{type(exc).__name__}: {exc}"}
        print(f"[hf] {name}: {result[name]}", flush=True)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
        old_call()
    result["profiler_table"] = prof.key_averages().table(sort_by="cpu_time_total", row_limit=25)
    return result


class WholeStepCompiled(StaticEngine):
    """Experiment: the whole decode step (embedding, every layer, cache writes, logits) compiled by inductor, one
    specialisation per attended length, each compiled before its capture (dynamo must not compile inside one)."""

    def __init__(self, model: CompactModel, device: torch.device) -> None:
        super().__init__(model, device, compile_decode=False)
        torch._dynamo.config.cache_size_limit = 64
        self._whole_step = torch.compile(super().decode_logits, dynamic=False)

    def decode_logits(self, state: DecodeState, length: int) -> torch.Tensor:
        return self._whole_step(state, length)

    def _capture(self, state: DecodeState, lengths: set[int]) -> None:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for length in sorted(lengths):
                state.cache.clear()
                state.step.zero_()
                self._decode(state, length)
        torch.cuda.current_stream().wait_stream(side)
        super()._capture(state, lengths)


def static_speed(preset: str, sizes: list[int], new_tokens: int, variant: str) -> list[dict[str, Any]]:
    """variant: static (as shipped: inductor-compiled layer pieces in the decode step), eager-decode (the same
    pieces uncompiled, the engine before that change), compiled-step (experiment: the whole step compiled)."""
    shape = PRESETS[preset]
    started = time.monotonic()
    model = CompactModel.from_transformers(build_model(shape, None, "bf16", "sdpa", CUDA, seed=1))
    engine = (WholeStepCompiled(model, CUDA) if variant == "compiled-step"
              else StaticEngine(model, CUDA, compile_decode=variant == "static"))
    torch.cuda.empty_cache()
    build_s = time.monotonic() - started
    rows = []
    task = TASKS["chat"]
    for size in sizes:
        row: dict[str, Any] = {"preset": preset, "batch": size, "variant": variant, "build_s": build_s}
        try:
            torch.cuda.reset_peak_memory_stats()
            (batch,) = draw_batches(task, size, 1, seed=1234, output_length=new_tokens)
            inputs = make_inputs(batch, shape.vocab_size, 1, CUDA)
            row["setup_s"] = engine.prepare([batch])
            begun = time.perf_counter()
            engine.generate(inputs, new_tokens)  # warm-up (and, compiled, the prefill shapes' compilation)
            engine.sync()
            row["first_generate_s"] = time.perf_counter() - begun
            wall = []
            for _ in range(2):
                begun = time.perf_counter()
                engine.generate(inputs, new_tokens)
                engine.sync()
                wall.append(time.perf_counter() - begun)
            timing = engine.timing()
            row.update(prompt=batch.padded_length, new_tokens=new_tokens, graphs=engine.describe()["captured_graphs"],
                       ttft_ms=timing.ttft_s * 1e3, ms_per_token=statistics.median(timing.inter_token_s) * 1e3,
                       output_tokens_per_s=size * new_tokens / min(wall),
                       peak_memory_gib=torch.cuda.max_memory_allocated() / 1024**3,
                       estimate_gib=memory.estimate_memory(shape, "bf16", size, task.input_length.high,
                                                           task.input_length.high + task.output_length.high,
                                                           "static").total_gib)
        except Exception as exc:
            row["error"] = f"{type(exc).__name__}: {exc}"
            traceback.print_exc()
        print(f"[static] {row}", flush=True)
        rows.append(row)
    del engine
    torch.cuda.empty_cache()
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sections", default="hf,static", help="any of hf, static, eager-decode, compiled-step")
    parser.add_argument("--hf-new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--static-new-tokens", type=int, default=128)
    parser.add_argument("--static", default="llama-1b:1,64,1024;llama-8b:1,8,64,256",
                        help="preset:batch sizes;... for the static section")
    parser.add_argument("--eager-decode", default="llama-1b:1,64;llama-8b:1,8",
                        help="preset:batch sizes;... for the eager-decode section (the uncompiled pieces)")
    parser.add_argument("--compiled-step", default="llama-1b:1",
                        help="preset:batch sizes;... for the compiled-step section (experiment)")
    parser.add_argument("--out-dir", required=True)
    args = parser.parse_args()
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    sections = args.sections.split(",")
    result: dict[str, Any] = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                              "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    if "hf" in sections:
        try:
            result["hf"] = hf_variants(args.hf_new_tokens, args.repeats)
            (out / "profile_table.txt").write_text(result["hf"].pop("profiler_table"))
        except Exception as exc:
            result["hf"] = {"error": f"{type(exc).__name__}: {exc}"}
            traceback.print_exc()
        torch.cuda.empty_cache()
    for section in ("static", "eager-decode", "compiled-step"):
        if section not in sections:
            continue
        result[section] = []
        for item in getattr(args, section.replace("-", "_")).split(";"):
            preset, sizes = item.split(":")
            result[section] += static_speed(preset, [int(s) for s in sizes.split(",")], args.static_new_tokens,
                                            section)
            (out / f"profile_{'_'.join(sections)}.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / f"profile_{'_'.join(sections)}.json").write_text(json.dumps(result, indent=2) + "\n")
    variants = ("static", "eager-decode", "compiled-step")
    print(json.dumps({k: v for k, v in result.items() if k not in variants}, indent=1))
    for row in [row for variant in variants for row in result.get(variant, [])]:
        print({k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
