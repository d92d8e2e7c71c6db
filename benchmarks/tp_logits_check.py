#!/usr/bin/env python3
"""Tensor-parallel logits against one GPU's: the static engine split over N ranks vs the same weights whole.

Run from the repository root on a node with N GPUs, one process per GPU (a shape that fits one GPU, twice over in
fp32 on rank 0's: llama-8b on an 80 GB H100):

    torchrun --nproc-per-node 4 benchmarks/tp_logits_check.py --preset llama-8b --out-dir $OUT/tp-logits
    torchrun --nproc-per-node 2 benchmarks/tp_logits_check.py --preset tiny --device cpu --out-dir /tmp/t  # smoke

Every rank builds its part of the preset (llm_inference/shards.py: random weights drawn per block, the same values
at every TP size); rank 0 also builds the whole model (TP=1) in the run's precision and in fp32. Compared, as
benchmarks/inference_engine_h100.py compares the engines: the prompt's last-position logits and one decode step's
(largest deviation, largest |logit|, their ratio, the smallest cosine over rows, argmax agreement) of TP=N and
TP=1 against the fp32 reference and against each other, then the greedy tokens of TP=N (compiled, CUDA graphs
with NCCL inside) and TP=1. Rank 0 writes tp_logits.json and prints the table.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.common import markdown_table  # noqa: E402 (after the repository is on sys.path)


def main() -> int:
    import torch
    import torch.distributed as dist

    from joulebench.launch import LaunchEnv
    from llm_inference import shards, tensor_parallel
    from llm_inference.engine import make_inputs
    from llm_inference.presets import PRESETS
    from llm_inference.static_engine import StaticEngine, attended_length
    from llm_inference.tasks import Batch

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="llama-8b")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--out-dir", required=True, type=Path)
    args = parser.parse_args()
    launch = LaunchEnv.from_env()
    device = torch.device("cuda", launch.local_rank) if args.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    tp = tensor_parallel.start(launch, device)
    shape = PRESETS[args.preset]
    batch = Batch((37, 120, 64, 120), 32)  # left padding in three rows
    inputs = make_inputs(batch, shape.vocab_size, args.seed, device)

    def logits_and_tokens(engine: StaticEngine) -> dict[str, torch.Tensor]:
        with torch.inference_mode():
            state, prefill = engine.prefill_logits(inputs)
            state.tokens.copy_(inputs["input_ids"][:, -1])  # one decode step on the same token everywhere
            step = engine.decode_logits(state, attended_length(batch.padded_length + 1))
            engine.prepare([batch])
            return {"prefill": prefill.float(), "step": step.float(),
                    "tokens": engine.generate(inputs, batch.output_length)}

    split = logits_and_tokens(StaticEngine(shards.rank_model(shape, None, dtype, device, args.seed, tp), device))
    if tp.rank == 0:
        whole = logits_and_tokens(StaticEngine(shards.rank_model(shape, None, dtype, device, args.seed, None), device))
        reference = logits_and_tokens(StaticEngine(
            shards.rank_model(shape, None, torch.float32, device, args.seed, None), device, compile_decode=False))
        rows = [compare(f"{where}: {name}", mine[where], ref[where])
                for where in ("prefill", "step")
                for name, mine, ref in ((f"TP={tp.size} vs fp32", split, reference), ("TP=1 vs fp32", whole, reference),
                                        (f"TP={tp.size} vs TP=1", split, whole))]
        equal = split["tokens"] == whole["tokens"]
        rows.append({"where": f"greedy {batch.output_length} tokens: TP={tp.size} vs TP=1 (captured steps)",
                     "argmax agree": equal.float().mean().item()})
        args.out_dir.mkdir(parents=True, exist_ok=True)
        result = {"preset": args.preset, "tensor_parallel": tp.size, "precision": str(dtype), "rows": rows,
                  "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"}
        (args.out_dir / "tp_logits.json").write_text(json.dumps(result, indent=2) + "\n")
        print(markdown_table(rows, ["where", "max |Δ|", "max |logit|", "max |Δ| / max |logit|", "cosine",
                                    "argmax agree"]))
    dist.barrier()
    tensor_parallel.finish(tp)
    return 0


def compare(name: str, mine: Any, ref: Any) -> dict[str, Any]:
    import torch

    return {"where": name, "max |Δ|": (mine - ref).abs().max().item(), "max |logit|": ref.abs().max().item(),
            "max |Δ| / max |logit|": ((mine - ref).abs().max() / ref.abs().max()).item(),
            "cosine": torch.nn.functional.cosine_similarity(mine, ref, dim=-1).min().item(),
            "argmax agree": (mine.argmax(-1) == ref.argmax(-1)).float().mean().item()}


if __name__ == "__main__":
    sys.exit(main())
