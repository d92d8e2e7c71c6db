"""--cuda-graphs (issue 58): megatron-core's own CUDA graphs, without Transformer Engine. On the CPU: the option
reaches megatron's real TransformerConfig, torch has the graph-safe generator API that megatron's RNG tracker needs,
and every configuration megatron would assert on deep inside the first step is refused before any work. The graphs
themselves run only on a GPU (docs/perf-notes.md, "to measure")."""

from __future__ import annotations

import pytest

from jpwr.errors import ExitCode
from llm_training.cli import build_parser, main
from llm_training.config import CUDA_GRAPH_WARMUP, TrainConfig, resolve


def _config(*args: str) -> TrainConfig:
    return resolve(build_parser().parse_args(["train", "--model", "tiny", *args]), 1)


@pytest.mark.parametrize(("choice", "scope"), [("layers", []), ("step", ["full_iteration"])])
def test_the_choice_reaches_megatrons_config(choice: str, scope: list[str]) -> None:
    from megatron.core.transformer.enums import CudaGraphScope

    from llm_training.model import transformer_config

    config = transformer_config(_config("--cuda-graphs", choice), "cuda")
    assert config.cuda_graph_impl == "local"  # megatron's own implementation: no Transformer Engine
    assert config.cuda_graph_scope == [CudaGraphScope[name] for name in scope]  # [] = the whole layer
    assert config.cuda_graph_warmup_steps == CUDA_GRAPH_WARMUP
    assert transformer_config(_config(), "cuda").cuda_graph_impl == "none"  # the default is unchanged


def test_torch_has_the_graph_safe_rng_that_megatrons_tracker_asks_for() -> None:
    from megatron.core.tensor_parallel import random

    random.initialize_rng_tracker(use_cudagraphable_rng=True, force_reset=True)
    try:
        assert random.get_cuda_rng_tracker().use_cudagraphable_rng
    finally:
        random.initialize_rng_tracker(force_reset=True)
    assert not random.get_cuda_rng_tracker().use_cudagraphable_rng


def _refused(capsys: pytest.CaptureFixture, args: list[str], *fragments: str) -> None:
    code = main(["validate", "--model", "tiny", *args])
    err = capsys.readouterr().err
    assert code == ExitCode.USAGE and "Fix:" in err, err
    for fragment in fragments:
        assert fragment in err, err


@pytest.mark.parametrize(("args", "fragments"), [
    (["--device", "cpu", "--cuda-graphs", "layers"], ("CUDA graphs record GPU work", "--cuda-graphs none")),
    (["--device", "cuda", "--cuda-graphs", "layers", "--recompute", "full"],
     ("only without recompute", "--cuda-graphs step with --recompute full")),
    (["--device", "cuda", "--cuda-graphs", "layers", "--recompute", "selective"], ("use --recompute none",)),
    (["--device", "cuda", "--cuda-graphs", "step", "--recompute", "selective"],
     ("recomputed attention's dropout", "--attention-dropout 0")),
    (["--device", "cuda", "--cuda-graphs", "step", "--warmup-iterations", str(CUDA_GRAPH_WARMUP + 1)],
     (f"--warmup-iterations {CUDA_GRAPH_WARMUP + 2} or more",)),
    (["--device", "cuda", "--cuda-graphs", "step", "--replay-phases", "3"], ("--cuda-graphs layers or none",)),
])
def test_what_megatron_would_assert_on_is_refused_before_any_work(capsys: pytest.CaptureFixture, args: list[str],
                                                                  fragments: tuple[str, ...]) -> None:
    _refused(capsys, args, *fragments)


def test_expandable_segments_need_nccl_graph_registration_off(capsys: pytest.CaptureFixture,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    monkeypatch.delenv("NCCL_GRAPH_REGISTER", raising=False)
    _refused(capsys, ["--device", "cuda", "--cuda-graphs", "layers"], "export NCCL_GRAPH_REGISTER=0")
    monkeypatch.setenv("NCCL_GRAPH_REGISTER", "0")
    assert main(["validate", "--model", "tiny", "--device", "cuda", "--cuda-graphs", "layers"]) == ExitCode.OK
    capsys.readouterr()


def test_graphed_configurations_megatron_takes_pass_validate(capsys: pytest.CaptureFixture) -> None:
    for args in (["--cuda-graphs", "layers"], ["--cuda-graphs", "step", "--recompute", "full"]):
        assert main(["validate", "--model", "tiny", "--device", "cuda", *args]) == ExitCode.OK, capsys.readouterr()
    capsys.readouterr()


@pytest.mark.parametrize(("choice", "where"), [("none", "cuda"), ("layers", "cuda"), ("step", "cpu")])
def test_step_graphs_get_host_batches_that_megatron_copies_on_its_own_stream(choice: str, where: str) -> None:
    """Seen on an H100: with --cuda-graphs step and batches already sent to the GPU, megatron's StaticBufferLoader
    copied them on its own stream before our copy had landed (the embedding's gather read token ids out of range)."""
    import torch

    from llm_training.data import batch_device

    assert batch_device(_config("--cuda-graphs", choice), torch.device("cuda")).type == where
