"""The fused batch-1 decode path (`--decode-tuning fused`, llm_inference/fused_decode.py) against today's path.

The Triton kernels run here in Triton's interpreter (TRITON_INTERPRET=1, CPU tensors, fp32), in a child process
because the interpreter is chosen when Triton is imported, as tests/llm_inference/test_decode_attention.py does.
Checked there: each GEMV form (plain, RMSNorm before, residual after, gate/up with SiLU·up; row counts that are no
multiple of a program's rows, inputs no multiple of its tile) against torch; a whole decode pass of the tiny Llama
through the fused kernels against the eager path on the same cache, for a lockstep row with left padding (RoPE
positions from the row's start) and an independent row (from 0), logits and every cache entry; the static engine
pinned to the variant against the eager engine (first-step logits, greedy tokens of a generation), its batch-2 pass
on today's path, unchanged; the continuous engine's one-row step; GPT-2 left on the compiled path. Tolerances
are fp32 ones relative to the largest value (FP32_FLOOR, the fp32 bound of benchmarks/inference_engine_h100.py's
logits check, which checks bf16 on a GPU): the interpreter sums in another order than torch, nothing else differs.
Here, without a GPU: the kernels compile for an H100 (sm_90, Triton's own ptxas) with 16-byte weight loads and
without register spills at the block sizes llama-1b and llama-8b get; the driver refuses the variant on the CPU in
one line, and the GEMV sweep script without a GPU.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from benchmarks.inference_engine_h100 import FP32_FLOOR
from jpwr.errors import ExitCode
from llm_inference.cli import main
from tests.ptxas import bundled_ptxas, spill_bytes

REPO = Path(__file__).resolve().parents[2]
FP32_RELATIVE = FP32_FLOOR  # the logits check's fp32 bound, relative to the largest value compared

CHILD = textwrap.dedent("""
    import torch
    import torch.nn.functional as F
    from llm_inference import fused_decode
    from llm_inference.compact_model import CompactModel
    from llm_inference.continuous_engine import ContinuousEngine
    from llm_inference.engine import build_model, make_inputs
    from llm_inference.kv_cache import KVCache
    from llm_inference.presets import PRESETS, ModelPreset
    from llm_inference.static_engine import StaticEngine, attended_length
    from llm_inference.tasks import Batch

    torch.manual_seed(0)
    cpu = torch.device("cpu")
    worst = {}

    def note(name, got, want):
        error = ((got - want).abs().max() / want.abs().max()).item()
        worst[name] = max(worst.get(name, 0.0), error)

    # rows, inputs, SMs: 25 programs of 2 rows with a partial one; one program over a partial tile; 16 rows
    for rows, size, sms in [(50, 70, 4), (33, 600, 1), (16, 1030, 132)]:
        x, weight, norm, residual = torch.randn(size), torch.randn(rows, size), torch.randn(size), torch.randn(rows)
        normed = F.rms_norm(x, (size,), norm, 1e-5)
        note("gemv", fused_decode.gemv(x, weight, sms), weight @ x)
        note("gemv", fused_decode.gemv(x, weight, sms, norm=norm, eps=1e-5), weight @ normed)
        note("gemv", fused_decode.gemv(x, weight, sms, residual=residual), residual + weight @ x)
        gate_up = torch.randn(2 * rows, size)
        gate, up = (gate_up @ normed).chunk(2)
        note("gemv", fused_decode.gemv(x, gate_up, sms, norm=norm, eps=1e-5, glu=True), F.silu(gate) * up)

    model = CompactModel.from_transformers(build_model(PRESETS["tiny"], None, "fp32", "sdpa", cpu, 3))
    eager, fused = StaticEngine(model, cpu), StaticEngine(model, cpu, tuning="fused")
    # a decode pass over a filled cache: a lockstep row whose prompt starts at 5, an independent row from 0
    for cache in (KVCache.lockstep(model, 1, 128, cpu), KVCache.independent(model, 1, 128, cpu)):
        cache.data.normal_()
        if cache.start is not None:
            cache.begin(torch.tensor([5]), 70)
        else:
            cache.occupy(torch.tensor([0]), torch.tensor([70]))
        twin = KVCache(cache.data.clone(), cache.length, cache.start, cache.active, cache.row_index)
        tokens, rope = torch.tensor([17]), model.rope_tables(128, torch.float32)
        want = eager._decode_pass(twin, tokens, rope, 128)
        note("pass", fused_decode.decode_pass(model, cache, tokens, rope, 128, 4), want)
        note("cache", cache.data, twin.data)
    # the engines: first decode step's logits and a generation's greedy tokens; batch 2 runs the compiled pieces
    steps, tokens = {}, {}
    with torch.inference_mode():
        for name, engine in (("eager", eager), ("fused", fused)):
            for batch in (Batch((37,), 6), Batch((37, 20), 6)):
                inputs = make_inputs(batch, model.vocab_size, 1, cpu)
                state, prefill = engine.prefill_logits(inputs)
                state.tokens.copy_(prefill.argmax(-1))
                steps[name, batch.size] = engine.decode_logits(state, attended_length(38))
                tokens[name, batch.size] = engine.generate(inputs, batch.output_length)
        note("engine step", steps["fused", 1], steps["eager", 1])
        rows, prompt = {}, torch.randint(0, model.vocab_size, (30,))
        for name in ("eager", "fused"):
            rows[name] = engine = ContinuousEngine(model, cpu, tuning=name if name == "fused" else "auto")
            engine.prepare(2, 128)
            engine.admit([0], [prompt])
        rows["fused"].state.cache.data.copy_(rows["eager"].state.cache.data)
        for name in ("eager", "fused"):
            rows[name].step(1, 64)
    print("SAME", int(torch.equal(tokens["fused", 1], tokens["eager", 1])),
          int(torch.equal(steps["fused", 2], steps["eager", 2])),
          int(torch.equal(rows["fused"].next_tokens(), rows["eager"].next_tokens())))
    note("continuous cache", rows["fused"].state.cache.data, rows["eager"].state.cache.data)
    gpt2 = ModelPreset("tiny-gpt2", "gpt2", 1, 64, 4, 4, 128, 512, 256, True, "test")
    gpt2_engine = StaticEngine(CompactModel.from_transformers(build_model(gpt2, None, "fp32", "sdpa", cpu, 3)), cpu,
                               tuning="fused")
    print("DETAIL", fused.describe()["decode_fused"], "|", gpt2_engine.describe()["decode_fused"], "|",
          sorted(fused.fused_variants), sorted(gpt2_engine.fused_variants))
    auto = StaticEngine(model, cpu, compile_decode=True)  # compiled lazily: nothing compiles here
    pinned = StaticEngine(model, cpu, compile_decode=True, tuning="fused")
    print("AUTO", " ".join(",".join(names) for names in (auto.decode_variants, auto.tuning_candidates(1),
                                                         auto.tuning_candidates(8), pinned.tuning_candidates(8))),
          "|", auto.describe()["decode_fused"])
    print("WORST", " ".join(f"{name.replace(' ', '_')}={value:.3e}" for name, value in worst.items()))
""")


def test_fused_path_matches_todays_path_in_tritons_interpreter() -> None:
    pytest.importorskip("triton", reason="Triton is not installed (CPU-only torch wheel): the kernels cannot run")
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    worst = dict(item.split("=") for item in done.stdout.split("WORST")[1].split())
    assert set(worst) == {"gemv", "pass", "cache", "engine_step", "continuous_cache"}
    assert all(float(value) < FP32_RELATIVE for value in worst.values()), worst
    assert done.stdout.split("SAME")[1].split()[:3] == ["1", "1", "1"]  # tokens; batch 2 and one row unchanged
    detail = done.stdout.split("DETAIL")[1].splitlines()[0]
    assert detail.split("|")[0].strip() == "fused Triton kernels at batch 1, compiled pieces at larger batches"
    assert "compiled pieces at every batch: the fused kernels compute Llama layers" in detail.split("|")[1]
    assert detail.split("|")[2].split() == ["['eager']", "[]"]
    # `auto` times the fused variant at one row only (elsewhere it runs the default pieces); pinned, it is the one
    variants, one_row, eight_rows, pinned = done.stdout.split("AUTO")[1].split("|")[0].split()
    assert variants == one_row == "default,coordinate-descent,fused"
    assert (eight_rows, pinned) == ("default,coordinate-descent", "fused")
    assert done.stdout.split("AUTO")[1].split("|")[1].splitlines()[0].strip() == (
        "fused Triton kernels at batch 1 where `auto` chose them")


def test_auto_leaves_out_a_fused_variant_that_cannot_run() -> None:
    """Without a GPU (and outside Triton's interpreter) `auto` has no fused candidate, and the record says nothing
    of one; pinned, the variant stays and the record says why its kernels do not run."""
    import torch

    from llm_inference.compact_model import CompactModel
    from llm_inference.engine import build_model
    from llm_inference.presets import PRESETS
    from llm_inference.static_engine import StaticEngine

    cpu = torch.device("cpu")
    model = CompactModel.from_transformers(build_model(PRESETS["tiny"], None, "fp32", "sdpa", cpu, 3))
    auto = StaticEngine(model, cpu, compile_decode=True)
    assert list(auto.decode_variants) == auto.tuning_candidates(1) == ["default", "coordinate-descent"]
    assert auto.describe()["decode_fused"] is None
    pinned = StaticEngine(model, cpu, compile_decode=True, tuning="fused")
    assert list(pinned.decode_variants) == pinned.tuning_candidates(1) == ["fused"]
    assert str(pinned.describe()["decode_fused"]).startswith("compiled pieces at every batch: ")
    # too few replays to time (no device work): the first candidate, not what an earlier shape chose
    auto.decode_tuning = "coordinate-descent"
    choice = auto.choose_tuning(lambda: None, lambda: None, 2, None, [], rows=1)
    assert choice.variant == auto.decode_tuning == "default" and choice.step_ms == {}


@pytest.mark.parametrize("pdl", [False, True])
@pytest.mark.parametrize(("preset", "sms"), [("llama-1b", 132), ("llama-8b", 132)])
def test_kernels_compile_for_an_h100_without_spills(preset: str, sms: int, pdl: bool) -> None:
    """Each fused kernel at the block sizes this preset's GEMVs get on an H100's 132 SMs compiles for sm_90 with
    Triton's bundled ptxas, keeps its accumulators in registers (a spill would turn the weight stream into
    local-memory traffic) and within 128 of them (four programs of 4 warps an SM: PROGRAMS_PER_SM); launched as a
    programmatic dependent (PDL), it loads its first weights before waiting for the previous kernel."""
    triton = pytest.importorskip("triton", reason="Triton is not installed: nothing to compile")
    bundled_ptxas()  # skipped where this Triton has none
    from llm_inference.decode_attention import GRID_DEPENDENCY_CONTROL

    if pdl and not GRID_DEPENDENCY_CONTROL:
        pytest.skip("this Triton has no grid dependency control (Triton < 3.4): PDL is never used with it")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from llm_inference import fused_decode
    from llm_inference.presets import PRESETS

    shape = PRESETS[preset]
    half = shape.head_dim // 2
    gemv_types = {"x": "*bf16", "norm": "*bf16", "weight": "*bf16", "residual": "*bf16", "out": "*bf16",
                  "rows": "i32", "size": "i32", "row_stride": "i32", "eps": "fp32"}
    qkv_types = {"x": "*bf16", "norm": "*bf16", "weight": "*bf16", "cos": "*bf16", "sin": "*bf16", "lengths": "*i64",
                 "starts": "*i64", "query": "*bf16", "keys": "*bf16", "values": "*bf16",
                 **{name: "i32" for name in ("size", "row_stride", "rope_stride", "k_head", "k_position", "v_head",
                                             "v_position")}, "eps": "fp32"}
    qkv_block = fused_decode.qkv_block_rows(shape.num_attention_heads + 2 * shape.num_key_value_heads, half, sms)
    kernels = [(fused_decode._qkv_kernel, qkv_types, {
        "HEADS": shape.num_attention_heads, "KV_HEADS": shape.num_key_value_heads, "HEAD_DIM": shape.head_dim,
        "FROM_ZERO": False, "BLOCK_ROWS": qkv_block, "PDL": pdl})]
    for rows, norm, glu, residual in [(shape.hidden_size, False, False, True), (shape.intermediate_size, True, True,
                                                                                False), (shape.vocab_size, True,
                                                                                         False, False)]:
        kernels.append((fused_decode._gemv_kernel, gemv_types, {"NORM": norm, "GLU": glu, "RESIDUAL": residual,
                                                                 "BLOCK_ROWS": fused_decode.block_rows(rows, sms),
                                                                 "PDL": pdl}))
    for kernel, types, constants in kernels:
        constants["BLOCK_K"] = fused_decode.TILE // constants["BLOCK_ROWS"]
        signature = {**types, **{name: "constexpr" for name in constants}}
        # as Triton's launcher specialises them: pointers and sizes divisible by 16 (these shapes' all are): 16-byte
        # vector loads, which need more registers than scalar ones
        aligned = {(index,): [["tt.divisibility", 16]] for index, kind in enumerate(types.values()) if kind != "fp32"}
        compiled = triton.compile(ASTSource(kernel, signature, constants, attrs=aligned),
                                  target=GPUTarget("cuda", 90, 32))
        ptx = compiled.asm["ptx"]
        assert "ld.global.v4" in ptx  # the weight stream in 16-byte loads
        assert ("griddepcontrol.wait" in ptx) == pdl
        if pdl:  # the first weight tile is loaded before the wait for the previous kernel
            assert ptx.index("ld.global.v4") < ptx.index("griddepcontrol.wait")
        stores, loads, report = spill_bytes(ptx)
        assert (stores, loads) == (0, 0), (constants, report)
        registers = re.search(r"Used (\d+) registers", report)
        assert registers is not None and int(registers[1]) <= 128, (constants, report)


def test_block_rows_give_every_sm_programs() -> None:
    from llm_inference.fused_decode import MAX_BLOCK_ROWS, MIN_BLOCK_ROWS, PROGRAMS_PER_SM, block_rows

    assert block_rows(128256, 132) == MAX_BLOCK_ROWS  # the LM head: as wide as a program gets
    assert block_rows(2048, 132) == 2 and PROGRAMS_PER_SM * 132 <= 2048 // 2  # llama-1b's hidden rows
    assert block_rows(8, 132) == MIN_BLOCK_ROWS  # fewer rows than SMs: the narrowest tile, never zero


@pytest.mark.parametrize("command", ["validate", "run"])
def test_fused_variant_is_refused_on_the_cpu(command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Before any model is built: one line naming the device and the fix."""
    code = main([command, "--preset", "tiny", "--device", "cpu", "--decode-tuning", "fused", "--out-dir",
                 str(tmp_path / "out")][:-2 if command == "validate" else None])
    assert code == ExitCode.USAGE
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and len(err) <= 160
    assert "--decode-tuning fused runs Triton kernels on a CUDA GPU, not on cpu" in err
    assert not list(tmp_path.rglob("run_record.json"))


def test_gemv_benchmark_refuses_without_a_gpu(tmp_path: Path) -> None:
    """benchmarks/fused_gemv_h100.py (the GPU allowance's tuning sweep) says in one line why it cannot run here."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is here: the script would measure")
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "fused_gemv_h100.py"), "--out", str(tmp_path)],
                          env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=120)
    assert done.returncode == ExitCode.USAGE and done.stderr.strip() == (
        "benchmarks/fused_gemv_h100.py: error: no CUDA GPU here: the fused kernels and cuBLAS are timed on one. Fix: "
        "run it on a GPU machine")


def test_attention_kernels_wait_for_their_predecessor_as_dependents() -> None:
    """Launched as programmatic dependents (the fused step on sm_90), both split-attention kernels wait for the
    previous kernel before their first global load: the query and the K/V they read are its writes."""
    triton = pytest.importorskip("triton", reason="Triton is not installed: nothing to compile")
    bundled_ptxas()
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from llm_inference import decode_attention

    if not decode_attention.GRID_DEPENDENCY_CONTROL:
        pytest.skip("this Triton has no grid dependency control (Triton < 3.4): PDL is never used with it")

    pointers = ("query", "keys", "values", "firsts", "lasts", "partial", "maxima", "sums")
    pieces_types = {**{name: "*fp32" if name in ("partial", "maxima", "sums") else "*i64" if name.endswith("sts")
                       else "*bf16" for name in pointers},
                    **{name: "i32" for name in ("q_row", "q_head", "q_group", "k_row", "k_head", "k_position", "v_row",
                                                "v_head", "v_position", "last_stride")},
                    "scale": "fp32", "piece_positions": "i32", "pieces": "i32", "length": "i32"}
    combine_types = {"partial": "*fp32", "maxima": "*fp32", "sums": "*fp32", "out": "*bf16", "o_row": "i32",
                     "o_head": "i32", "o_group": "i32", "pieces": "i32"}
    shape = {"KV_HEADS": 8, "GROUPS": 4, "HEAD_DIM": 128, "BLOCK_GROUPS": 16, "PDL": True}
    for kernel, types, constants in [
            (decode_attention._pieces_kernel, pieces_types, {**shape, "BLOCK_POSITIONS": decode_attention.SPLIT_BLOCK,
                                                             "FROM_ZERO": False, "DOT_PRECISION": "tf32"}),
            (decode_attention._combine_kernel, combine_types, shape)]:
        signature = {**types, **{name: "constexpr" for name in constants}}
        ptx = triton.compile(ASTSource(kernel, signature, constants), target=GPUTarget("cuda", 90, 32)).asm["ptx"]
        assert ptx.index("griddepcontrol.wait") < ptx.index("ld.global")
