"""One tensor-parallel rank of tests/llm_inference/test_tensor_parallel.py, started by torchrun (gloo, CPU).

Each rank generates with its part of every model the test names (tokens and first-step logits; rank 0 saves them),
then the job runs `python -m llm_inference run` and `load` with --tensor-parallel 2 as a user would, in the same
processes (they join the group started here).
Usage: torchrun --nproc-per-node 2 -m tests.llm_inference.tp_worker OUT CHECKPOINT...
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from llm_inference.compact_model import CompactModel
from llm_inference.continuous_engine import ContinuousEngine
from llm_inference.engine import make_inputs
from llm_inference.presets import PRESETS
from llm_inference.shards import rank_model
from llm_inference.static_engine import StaticEngine
from llm_inference.tasks import Batch
from llm_inference.tensor_parallel import TensorParallel

CPU = torch.device("cpu")
SEED = 7
NEW_TOKENS = 6
BATCH = Batch((5, 9, 2), NEW_TOKENS)  # left padding of different widths
ROW_PROMPTS = (4, 11)  # the continuous engine's two requests


def generate(model: CompactModel) -> dict[str, torch.Tensor]:
    """The static engine's first-token logits and greedy tokens, and the continuous engine's tokens after its
    admits and steps, on fixed prompts (the same on every rank and in the test's one-device reference)."""
    inputs = make_inputs(BATCH, model.vocab_size, SEED, CPU)
    static = StaticEngine(model, CPU)
    _, logits = static.prefill_logits(inputs)
    tokens = static.generate(inputs, NEW_TOKENS)
    rows = ContinuousEngine(model, CPU)
    rows.prepare(2, 64)
    generator = torch.Generator().manual_seed(SEED)
    rows.admit([0, 1], [torch.randint(1, model.vocab_size, (n,), generator=generator) for n in ROW_PROMPTS])
    steps = [rows.next_tokens().clone()]
    for _ in range(NEW_TOKENS - 1):
        rows.step(2, 64)
        steps.append(rows.next_tokens().clone())
    return {"logits": logits.clone(), "tokens": tokens, "rows": torch.stack(steps, dim=1)}


def main(out: Path, checkpoints: list[str]) -> int:
    import torch.distributed as dist

    from llm_inference.cli import main as cli_main

    dist.init_process_group("gloo")  # torchrun's env://; the commands below join this group
    tp = TensorParallel(dist.get_rank(), dist.get_world_size(), dist.group.WORLD)
    results = {"tiny": generate(rank_model(PRESETS["tiny"], None, torch.float32, CPU, SEED, tp))}
    for directory in checkpoints:
        results[Path(directory).name] = generate(rank_model(PRESETS["tiny"], directory, torch.float32, CPU, SEED, tp))
    if tp.rank == 0:
        torch.save(results, out / "tokens.pt")
    common = ["--preset", "tiny", "--device", "cpu", "--min-window-s", "0.3", "--output-length", "4",
              "--tensor-parallel", "2", "--no-idle-baseline"]
    ran = cli_main(["run", *common, "--task", "tiny", "--num-batches", "2", "--batch-size", "3",
                    "--out-dir", str(out / "run"), "--run-id", "inf-tp2"])
    loaded = cli_main(["load", *common, "--task", "tiny", "--rate", "max", "--max-concurrency", "4",
                       "--requests", "12", "--out-dir", str(out / "load"), "--run-id", "load-tp2"])
    # both ranks done before either leaves the group: a gloo group left to the interpreter's exit aborted rank 0
    # (SIGABRT) once its peer had gone (CI, 2026-12-06)
    dist.barrier()
    dist.destroy_process_group()
    return ran or loaded


if __name__ == "__main__":
    from joulebench.process_exit import exit_after_run

    exit_after_run(main(Path(sys.argv[1]), sys.argv[2:]))
