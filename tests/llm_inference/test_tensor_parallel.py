"""Tensor parallelism on the CPU: two gloo ranks compute the tokens one process computes, and the refusals.

One torchrun job of two ranks (under jpwr with the fake H100 NVML trace, as users meter a multi-process run) does
all the two-rank work once for the module (tests/llm_inference/tp_worker.py): greedy tokens of the static and the
continuous engine for the tiny preset (random weights drawn per shard), a tiny Llama checkpoint and a GPT-2-shaped
checkpoint whose vocabulary does not split evenly, then a `run --tensor-parallel 2` with its record and a
`load --tensor-parallel 2` (rank 0's scheduler, the other rank following). The one-device references come from the
established path: transformers' model taken into compact code.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel

from joulebench.figures import record_problems, work_devices
from joulebench.record import read_run_record
from jpwr import ValidationError
from llm_inference import validation
from llm_inference.checkpoint import save_checkpoint
from llm_inference.cli import main
from llm_inference.compact_model import CompactModel
from llm_inference.config import InferenceConfig
from llm_inference.memory import estimate_memory
from llm_inference.presets import PRESETS, ModelPreset
from llm_inference.shards import rank_model
from llm_inference.tensor_parallel import TensorParallel
from tests.conftest import FAKES_DIR, H100_TRACE_DIR, TESTS_DIR
from tests.driver_helpers import read_record, run_cmd
from tests.llm_inference.tp_worker import CPU, SEED, generate

# 501 vocabulary rows: 251 on rank 0, 250 (padded to 251) on rank 1
GPT2_SHAPE = GPT2Config(n_embd=64, n_layer=2, n_head=4, n_positions=128, vocab_size=501, bos_token_id=500,
                        eos_token_id=500)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, dict[str, torch.Tensor]]]:
    """The two-rank job's output directory and rank 0's results per model (the job's exit asserted)."""
    out = tmp_path_factory.mktemp("tp")
    llama = out / "llama-ckpt"
    save_checkpoint("tiny", llama, "fp32", SEED, False)
    gpt2 = out / "gpt2-ckpt"
    torch.manual_seed(SEED)
    GPT2LMHeadModel(GPT2_SHAPE).save_pretrained(gpt2)
    env = {**os.environ, "JPWR_FAKE_NVML_TRACE": str(H100_TRACE_DIR),
           "PYTHONPATH": f"{FAKES_DIR}:{TESTS_DIR.parent}", "OMP_NUM_THREADS": "1"}
    jpwr = [sys.executable, "-m", "jpwr", "--methods", "nvml", "--out", str(out / "energy"), "--"]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
                str(_free_port()), "-m", "tests.llm_inference.tp_worker", str(out), str(llama), str(gpt2)]
    result = run_cmd([*jpwr, *torchrun], env, out)
    statuses = {name: {k: v for k, v in json.loads(path.read_text()).items() if k in ("status", "status_reason")}
                for name in ("run", "load") if (path := out / name / "run_record.json").is_file()}
    assert result.returncode == 0, (statuses, result.stderr.splitlines()[-15:])  # each run's status, the last lines
    return out, torch.load(out / "tokens.pt")


def _one_device(directory: Path) -> CompactModel:
    return CompactModel.from_transformers(AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32))


@pytest.mark.parametrize("name", ["tiny", "llama-ckpt", "gpt2-ckpt"])
def test_two_ranks_compute_the_tokens_and_logits_of_one_device(two_ranks, name):
    out, results = two_ranks
    model = (rank_model(PRESETS["tiny"], None, torch.float32, CPU, SEED, None) if name == "tiny"
             else _one_device(out / name))
    reference, split = generate(model), results[name]
    assert split["logits"].shape == reference["logits"].shape == (3, model.vocab_size)
    assert torch.allclose(split["logits"], reference["logits"], rtol=1e-4, atol=1e-5)
    assert torch.equal(split["tokens"], reference["tokens"])  # the static engine, left-padded rows
    assert torch.equal(split["rows"], reference["rows"])  # the continuous engine, rows of their own lengths


def test_the_two_rank_record_states_the_split_and_the_job_s_devices(two_ranks):
    out, _ = two_ranks
    record = read_record(out / "run")
    assert record["status"] == "OK" and record["run_id"] == "inf-tp2"
    assert record["config"]["tensor_parallel"] == 2 and record["launch"]["world_size"] == 2
    assert record["metrics"]["devices"] == 2 and record["hardware"]["devices"] == 2
    per_rank, tiny = record["config"]["per_rank"], PRESETS["tiny"]
    assert per_rank["heads"] == tiny.num_attention_heads // 2 and per_rank["kv_heads"] == tiny.num_key_value_heads // 2
    assert per_rank["admitted_batch"] is None  # host memory is no device's: n/a, not 0
    assert record["config"]["engine_detail"]["rank_kv_heads"] == per_rank["kv_heads"]
    steady = next(w for w in record["windows"] if w["name"] == "steady")
    devices = [(d["node"], d["uuid"] or d["index"]) for d in steady["energy"]["per_device"]]
    assert devices and len(devices) == len(set(devices))  # each metered GPU once, not once per rank
    assert record["metrics"]["energy_per_output_token_j"] > 0


def test_a_two_rank_load_is_served_by_rank_zero_s_scheduler(two_ranks):
    out, _ = two_ranks
    record = read_record(out / "load")
    assert record["status"] == "OK" and record["run_id"] == "load-tp2" and record["config"]["tensor_parallel"] == 2
    detail = record["config"]["engine_detail"]
    assert detail["engine"] == "continuous" and detail["tensor_parallel"] == 2 and detail["rows"] == 4
    steady = next(w for w in record["windows"] if w["name"] == "steady")
    assert steady["work"]["output_tokens"] > 0 and steady["energy"]["energy_j"] > 0
    assert record["metrics"]["requests_counted"] > 0 and record["hardware"]["devices"] == 2


def test_run_and_load_divide_throughput_by_the_devices_that_did_the_work(two_ranks):
    """One per-device rule (issue 61): at tensor parallel 2, `run` and `load` both divide by the two ranks' devices,
    which each record names, not by the metered devices (the fake trace meters one GPU); the reader's check agrees."""
    out, _ = two_ranks
    for name in ("run", "load"):
        record = read_run_record(out / name / "run_record.json")
        m, steady = record.metrics, record.window("steady")
        assert steady is not None and steady.energy is not None and steady.energy.devices == 1, name
        assert work_devices(record) == m["devices"] == record.hardware["devices"] == 2, name
        assert m["output_tokens_per_s_per_device"] == pytest.approx(m["output_tokens_per_s"] / 2), name
        assert "1 metered devices but the run used 2" in str(m["energy_warning"]), name
        assert not [p for p in record_problems(record) if "per_s_per_device" in p], name
    record = read_run_record(out / "run" / "run_record.json")
    assert record_problems(record) == []
    record.metrics["output_tokens_per_s_per_device"] = record.metrics["output_tokens_per_s"]  # by the metered device
    assert [p for p in record_problems(record) if "per device of the 2 named" in p]  # the reader holds the rule too


def test_a_rank_holds_the_parameters_its_estimate_counts():
    """ModelPreset.rank_parameter_count against the weights a rank really builds (rank 0: it adds the biases)."""
    gpt2 = ModelPreset("g", "gpt2", 2, 64, 4, 4, 256, 501, 128, True, "test")
    for shape in (PRESETS["tiny"], gpt2):
        model = rank_model(shape, None, torch.float32, CPU, SEED, TensorParallel(0, 2, None))
        tensors = [model.embed, model.lm_head, model.final_norm.weight, model.final_norm.bias, model.position_embed,
                   *(t for layer in model.layers for part in dataclasses.astuple(layer) for t in part)]
        assert sum(t.numel() for t in tensors if t is not None) == shape.rank_parameter_count(2)
    assert PRESETS["llama-70b"].rank_parameter_count(1) == PRESETS["llama-70b"].parameter_count()


def test_a_rank_s_memory_estimate_holds_its_part_of_the_cache_and_weights():
    shape = PRESETS["llama-70b"]
    whole, rank = (estimate_memory(shape, "bf16", 8, 1024, 2048, "static", n) for n in (1, 4))
    assert rank.kv_cache_gib == pytest.approx(whole.kv_cache_gib / 4)
    assert whole.weights_gib / 4 < rank.weights_gib < whole.weights_gib / 3  # the embedding is on every rank


def _config(**changes: object) -> InferenceConfig:
    base = InferenceConfig(preset="tiny", checkpoint=None, tasks=("tiny",), batch_sizes=(1,), num_batches=1,
                           output_length=None, steady_seconds=None, idle_baseline=False, warmup_batches=0,
                           exit_duration_mins=None, precision="fp32", engine="static", attention="sdpa", device="cpu",
                           seed=1, decode_tuning="auto", out_dir="x", run_id="x", energy_methods=None)
    return dataclasses.replace(base, **changes)


@pytest.mark.parametrize(("changes", "problem", "fix"), [
    ({"tensor_parallel": 3}, "does not divide the 4 attention heads of tiny", "--tensor-parallel 1 or 2"),
    ({"preset": "llama-70b", "tasks": ("chat",), "tensor_parallel": 16}, "does not divide the 8 KV heads",
     "--tensor-parallel 1 or 2 or 4 or 8"),
    ({"tensor_parallel": 2, "engine": "hf"}, "--engine hf", "--engine static"),
    ({"tensor_parallel": 2, "energy_methods": "nvml"}, "once per rank", "jpwr -- torchrun"),
])
def test_a_split_the_model_or_the_meter_cannot_take_is_refused(changes, problem, fix):
    with pytest.raises(ValidationError) as refused:
        validation.check_config(_config(**changes))
    assert problem in refused.value.problem and fix in refused.value.fix


def test_the_processes_must_be_the_tensor_parallel_ranks_of_one_node():
    with pytest.raises(ValidationError, match="started as 1 processes with --tensor-parallel 4") as refused:
        validation.check_launch(1, points=1, external_sampler=False, tensor_parallel=4)
    assert "torchrun --nproc-per-node 4" in refused.value.fix
    with pytest.raises(ValidationError, match="over 2 nodes"):
        validation.check_launch(4, points=1, external_sampler=False, tensor_parallel=4, nodes=2)
    with pytest.raises(ValidationError, match="does not divide the 4 GPU") as refused:
        validation.check_node_devices(3, 4)
    assert "CUDA_VISIBLE_DEVICES" in refused.value.fix
    validation.check_node_devices(2, 4)
    validation.check_launch(4, points=1, external_sampler=False, tensor_parallel=4)


def test_validate_names_the_tensor_parallel_fix(capsys):
    assert main(["validate", "--preset", "llama-70b", "--task", "chat", "--tensor-parallel", "3",
                 "--device", "cuda"]) == 64
    assert "--tensor-parallel 1 or 2 or 4 or 8" in capsys.readouterr().err
    assert main(["validate", "--preset", "llama-70b", "--task", "chat", "--tensor-parallel", "4", "--device", "cuda",
                 "--device-memory-gib", "80"]) == 0
    assert main(["validate", "--preset", "llama-70b", "--task", "chat", "--device", "cuda",
                 "--device-memory-gib", "80"]) == 64  # the whole model does not fit one 80 GiB GPU
