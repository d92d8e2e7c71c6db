"""The default profile's micro-batch size chosen by device memory (issue 33): the GBS stays, the MBS grows."""

from __future__ import annotations

import dataclasses

import pytest

from llm_training import memory
from llm_training.cli import build_parser, main
from llm_training.config import MBS_FROM_OPTION, MBS_FROM_PRESET, resolve
from llm_training.presets import MBS_BY_MEMORY_CAP

H100_GIB = 81559 * 2**20 / 2**30  # torch.cuda.get_device_properties(...).total_memory of an H100 80GB HBM3
A100_40_GIB = 40536 * 2**20 / 2**30  # the same of an A100-SXM4-40GB


def _cfg(*args: str, world: int = 1):
    return resolve(build_parser().parse_args(["train", "--model", "800M", *args]), world)


def test_estimate_of_800m_at_seq_2048_by_micro_batch():
    # Measured peaks on one H100 (docs/BENCHMARKS.md): MBS 8 37.5 GiB, MBS 16 59.8 GiB; the estimate is above both.
    gib = {mbs: memory.estimate_memory(_cfg("--micro-batch-size", str(mbs), "--global-batch-size", "64")).total_gib
           for mbs in (8, 16, 32)}
    assert gib == pytest.approx({8: 43.7, 16: 69.2, 32: 120.1}, abs=0.05)
    assert gib[16] <= memory.MBS_MEMORY_SHARE * H100_GIB < gib[32]


@pytest.mark.parametrize("device_gib", [80.0, H100_GIB])
def test_80_gib_device_gets_mbs_16_with_the_same_global_batch(device_gib):
    cfg = _cfg()
    assert (cfg.micro_batch_size, cfg.global_batch_size, cfg.micro_batch_size_from) == (8, 64, MBS_FROM_PRESET)
    chosen = memory.choose_micro_batch(cfg, device_gib)
    assert (chosen.micro_batch_size, chosen.global_batch_size, chosen.num_microbatches) == (16, 64, 4)
    assert chosen.micro_batch_size_from == (
        f"chosen by memory: estimate 69.2 GiB of {device_gib:.1f} GiB; MBS cap {MBS_BY_MEMORY_CAP}")
    # Everything but the MBS and its reason is the resolved configuration.
    assert dataclasses.replace(chosen, micro_batch_size=8, micro_batch_size_from=MBS_FROM_PRESET) == cfg


@pytest.mark.parametrize("device_gib", [40.0, A100_40_GIB, 48.0])
def test_40_gib_device_keeps_the_preset_mbs_8(device_gib):
    chosen = memory.choose_micro_batch(_cfg(), device_gib)
    assert (chosen.micro_batch_size, chosen.global_batch_size, chosen.num_microbatches) == (8, 64, 8)
    assert chosen.micro_batch_size_from.startswith("preset, kept by memory: estimate 43.7 GiB of ")
    assert "MBS 16 would need 69.2 GiB > 90%" in chosen.micro_batch_size_from


def test_the_cap_holds_on_a_device_that_would_fit_more():
    chosen = memory.choose_micro_batch(_cfg(), 1000.0)  # MBS 32 and 64 fit by the estimate, but are unmeasured
    assert chosen.micro_batch_size == MBS_BY_MEMORY_CAP == 16


def test_explicit_micro_batch_size_wins():
    for mbs in ("8", "4"):
        cfg = _cfg("--micro-batch-size", mbs)
        chosen = memory.choose_micro_batch(cfg, 80.0)
        assert chosen == cfg and chosen.micro_batch_size == int(mbs)
        assert chosen.micro_batch_size_from == MBS_FROM_OPTION
    # Too large for the device: still the user's (the fit warning says so, the choice does not override it).
    assert memory.choose_micro_batch(_cfg("--micro-batch-size", "32"), 40.0).micro_batch_size == 32


def test_global_batch_not_divisible_by_the_larger_mbs_stays():
    cfg = _cfg("--global-batch-size", "24")  # 3 micro-batches of 8; 16 does not divide 24
    chosen = memory.choose_micro_batch(cfg, 80.0)
    assert (chosen.micro_batch_size, chosen.global_batch_size, chosen.num_microbatches) == (8, 24, 3)
    assert "MBS 16 does not divide the 24 samples per replica" in chosen.micro_batch_size_from
    # Per replica: GBS 96 over DP 2 is 48 samples each, which MBS 16 divides.
    dp2 = memory.choose_micro_batch(_cfg("--global-batch-size", "96", world=2), 80.0)
    assert (dp2.micro_batch_size, dp2.global_batch_size, dp2.num_microbatches) == (16, 96, 3)


def test_cpu_and_unknown_memory_keep_the_preset():
    cfg = _cfg()
    chosen = memory.choose_micro_batch(cfg, None)  # the CPU: no device memory
    assert (chosen.micro_batch_size, chosen.global_batch_size) == (8, 64)
    assert chosen.micro_batch_size_from == "preset: no device memory to choose by"


def test_only_presets_with_a_cap_change():
    caraml = _cfg("--caraml")  # CARAML's exact settings: MBS 4, GBS 32
    assert memory.choose_micro_batch(caraml, 80.0) == caraml
    for model in ("117M", "13B"):  # not measured: the preset MBS stays
        cfg = resolve(build_parser().parse_args(["train", "--model", model]), 4)
        assert memory.choose_micro_batch(cfg, 80.0) == cfg


def test_validate_states_the_choice_for_the_given_device_memory(capsys):
    assert main(["validate", "--model", "800M", "--device-memory-gib", "80"]) == 0
    out = capsys.readouterr().out
    assert ("MBS 16 (chosen by memory: estimate 69.2 GiB of 80.0 GiB; MBS cap 16), GBS 64 (4 micro-batches per "
            "replica)") in out
    assert main(["validate", "--model", "800M", "--device-memory-gib", "40"]) == 0
    out = capsys.readouterr().out
    assert "MBS 8 (preset, kept by memory: estimate 43.7 GiB of 40.0 GiB;" in out and "(8 micro-batches" in out
    # The CPU keeps the preset whatever memory is named.
    assert main(["validate", "--model", "tiny", "--device", "cpu", "--device-memory-gib", "80"]) == 0
    assert "MBS 2 (preset)" in capsys.readouterr().out


@pytest.mark.parametrize(("args", "world", "in_flight"), [
    ((), 1, 1),  # no pipeline: one micro-batch's activations at a time, however many micro-batches
    (("--pipeline-parallel", "2"), 2, 2),
    (("--pipeline-parallel", "4", "--global-batch-size", "16", "--micro-batch-size", "8"), 4, 2),  # 2 micro-batches
])
def test_micro_batches_in_flight_bound_the_estimate_and_the_forward_replay(args, world, in_flight):
    """The forward replay runs in chunks of this many micro-batches (llm_training.train: it ran out of memory on an
    H100 holding all four graphs of MBS 16); the estimate counts the same number."""
    cfg = _cfg(*args, world=world)
    assert cfg.micro_batches_in_flight == in_flight
    one = dataclasses.replace(cfg, global_batch_size=cfg.micro_batch_size * cfg.data_parallel)  # one micro-batch
    assert memory.estimate_memory(cfg).activations_gib == pytest.approx(
        memory.estimate_memory(one).activations_gib * in_flight)
