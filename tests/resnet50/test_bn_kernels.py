"""`--bn-kernels triton[-conv]`: our batch-norm + add + ReLU kernels against torch's BatchNorm2d (+ add) (+ ReLU),
and our 1x1 convolution GEMM that measures the batch statistics against torch's conv2d and its output's statistics.

The kernels run in Triton's interpreter (TRITON_INTERPRET=1, CPU tensors) in one child process, because the
interpreter is chosen when Triton is imported. The interpreter multiplies bf16 tiles in tl.dot as their raw 16-bit
integers (Triton 3.8: it stores bf16 as uint16 and hands those to numpy's matmul); the child widens them to fp32
first, as the GPU's tensor cores do (exact bf16 products, fp32 sums). Checked there, each case with fresh random
data: the output, the running statistics after two steps, and the gradients dx, dweight, dbias and dresidual, for
fp32 and for bf16 channels-last activations (the README's), with row counts that are not multiples of the tile,
channel counts that are not multiples of 64 and more row slices than one tile of their reduction. The convolution
GEMM: fp32 and bf16, strides 1 and 2, row counts not multiples of its 128-row tile, channel counts not multiples of
its tiles, several tiles per program and several programs' moments to merge, and a mean 10^3 standard deviations
from zero (where an fp32 sum of squares less the squared sum loses the variance). A FusedBottleneck and a
ConvStatsBottleneck (with the downsample, stride 2) through torch.compile (aot_eager, fullgraph: our ops stay in the
traced graph, counted there) against torchvision's Bottleneck in eager mode: outputs, all gradients, running
statistics. Tolerances, relative to each tensor's largest value (seen: about 1e-6 in fp32): fp32 within 1e-5; bf16
outputs, dx and dresidual within 1.6e-2 of the fp32 reference on the same bf16 inputs (the output's bf16 rounding is
2^-8 of a value; seen 6e-3), bf16 dweight, dbias and running statistics (fp32 sums of the same bf16 values) within
1e-5; the GEMM's statistics within 1e-5 of torch's statistics of the output it wrote (1e-4 at that far mean).
On a GPU, benchmarks/perf33_h100.py's resnet50-readme-bn-triton[-conv] runs measure speed and the loss at step 200.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from typing import Any

import pytest
import torch

from jpwr.errors import ExitCode
from resnet50.cli import main
from tests.ptxas import bundled_ptxas, spill_bytes
from tests.resnet50.conftest import REPO, SMALL

pytest.importorskip("torchvision")

CHILD = textwrap.dedent("""
    import json
    import numpy as np
    import torch
    import triton.language as tl
    from triton.runtime import interpreter
    from torchvision.models.resnet import Bottleneck
    import resnet50.bn_kernels
    from resnet50.fused_bn import BatchNormAct, ConvStatsBottleneck, FusedBottleneck

    def widened(handle):  # bf16 bits (uint16) to the fp32 they stand for
        if handle.dtype.scalar != tl.bfloat16:
            return handle
        return interpreter.TensorHandle((handle.data.astype(np.uint32) << 16).view(np.float32), tl.float32)

    integer_dot = interpreter.InterpreterBuilder.create_dot
    interpreter.InterpreterBuilder.create_dot = lambda self, a, b, *rest: integer_dot(self, widened(a), widened(b),
                                                                                        *rest)

    def relative(got, want):
        return ((got.double() - want.double()).abs().max() / want.double().abs().max().clamp_min(1e-12)).item()

    def case(dtype, shape, residual, relu, seed):
        torch.manual_seed(seed)
        n, c, h, w = shape
        x = (torch.randn(shape) * 2 + 0.7).to(dtype).to(memory_format=torch.channels_last)
        res = torch.randn(shape).to(dtype).to(memory_format=torch.channels_last)
        ref = torch.nn.BatchNorm2d(c)
        with torch.no_grad():
            ref.weight.uniform_(0.5, 1.5)
            ref.bias.uniform_(-0.5, 0.5)
        mine = BatchNormAct(c)
        mine.load_state_dict(ref.state_dict())
        mine.relu = relu
        errors = {}
        for step in range(2):  # two steps: the running statistics' update composes
            xa, xb = x.float().clone().requires_grad_(), x.clone().requires_grad_()
            ra, rb = res.float().clone().requires_grad_(), res.clone().requires_grad_()
            want = ref(xa) + ra if residual else ref(xa)
            want = torch.relu(want) if relu else want
            got = mine(xb, rb if residual else None)
            grad = torch.randn(shape).to(dtype).to(memory_format=torch.channels_last)
            want.backward(grad.float())
            got.backward(grad)
            assert got.dtype == dtype and got.is_contiguous(memory_format=torch.channels_last)
            errors = {"y": relative(got, want), "dx": relative(xb.grad, xa.grad),
                      "dweight": relative(mine.weight.grad, ref.weight.grad),
                      "dbias": relative(mine.bias.grad, ref.bias.grad)}
            if residual:
                errors["dresidual"] = relative(rb.grad, ra.grad)
            for p in (*ref.parameters(), *mine.parameters()):
                p.grad = None
            x = (torch.randn(shape) * 2 + 0.7).to(dtype).to(memory_format=torch.channels_last)
        errors["running_mean"] = relative(mine.running_mean, ref.running_mean)
        errors["running_var"] = relative(mine.running_var, ref.running_var)
        assert int(mine.num_batches_tracked) == int(ref.num_batches_tracked) == 2
        return errors

    results = {}
    # (N, C, H, W): rows N·H·W of 90 and 300 (not multiples of the 64-row tile), channels 12 and 80 (a partial tile);
    # 4,608 rows of 4 channels: 72 row slices, more than one tile of the partial sums' reduction
    for dtype in (torch.float32, torch.bfloat16):
        for i, (shape, residual, relu) in enumerate([((2, 12, 5, 9), False, False), ((3, 80, 10, 10), False, True),
                                                     ((2, 12, 5, 9), True, True), ((2, 4, 48, 48), True, True)]):
            name = f"{str(dtype).split('.')[1]}-{i}-{'res' if residual else 'nores'}-{'relu' if relu else 'norelu'}"
            results[name] = case(dtype, shape, residual, relu, seed=i)

    def conv_case(dtype, shape, out_channels, stride, offset, programs, seed):
        torch.manual_seed(seed)
        resnet50.bn_kernels.PROGRAMS_WANTED = programs  # few programs: several row tiles each
        x = (torch.randn(shape) + offset).to(dtype).to(memory_format=torch.channels_last)
        weight = (torch.rand(out_channels, shape[1], 1, 1) / shape[1]).to(dtype)
        y, mean, invstd, var = torch.ops.joulebench.conv1x1_batch_norm_stats(x, weight, stride, 1e-5)
        resnet50.bn_kernels.PROGRAMS_WANTED = 1024
        assert y.dtype == dtype and y.is_contiguous(memory_format=torch.channels_last)
        wrote = y.double()
        biased = wrote.var((0, 2, 3), unbiased=False)
        naive = (y.float() ** 2).mean((0, 2, 3)) - y.float().mean((0, 2, 3)) ** 2  # fp32 E[y²] − E[y]², for contrast
        return {"y": relative(y, torch.nn.functional.conv2d(x.float(), weight.float(), stride=stride)),
                "mean": relative(mean, wrote.mean((0, 2, 3))), "var": relative(var, wrote.var((0, 2, 3))),
                "invstd": relative(invstd, 1 / (biased + 1e-5).sqrt()), "spread": (biased.sqrt() / mean).max().item(),
                "naive_var": relative(naive, biased)}

    # dtype, (N, Cin, H, W), Cout, stride, offset, programs wanted: rows 126, 1024, 75, 720; channels 24 -> 40 (partial
    # tiles), 80 -> 144 (two K steps, two channel tiles) in 1 program of 8 tiles, 16 -> 20 at stride 2 (9x9 to 5x5),
    # 24 -> 40 in 3 programs of 2, 2 and 1 tiles (the last one partial)
    for i, args in enumerate([(torch.float32, (2, 24, 9, 7), 40, 1, 0.5, 1024),
                              (torch.float32, (4, 80, 16, 16), 144, 1, 0.5, 2),
                              (torch.bfloat16, (3, 16, 9, 9), 20, 2, 0.5, 1024),
                              (torch.bfloat16, (2, 24, 18, 20), 40, 1, 0.5, 3)]):
        results[f"conv-{str(args[0]).split('.')[1]}-{i}"] = conv_case(*args, seed=10 + i)
    results["conv-float32-far-mean"] = conv_case(torch.float32, (2, 24, 18, 20), 40, 1, 300.0, 3, seed=20)

    def bottleneck(block_class):  # a block (1x1 downsample, stride 2) compiled, against torchvision's eager
        down = lambda norm: torch.nn.Sequential(torch.nn.Conv2d(32, 64, 1, 2, bias=False), norm(64))
        torch.manual_seed(5)
        ref = Bottleneck(32, 16, 2, down(torch.nn.BatchNorm2d)).to(memory_format=torch.channels_last)
        torch.manual_seed(5)
        mine = block_class(32, 16, 2, down(BatchNormAct), norm_layer=BatchNormAct).to(memory_format=torch.channels_last)
        traced = []  # the ops dynamo's graph calls: which of ours ran

        def backend(graph, example_inputs):
            traced.extend(str(node.target) for node in graph.graph.nodes if node.op == "call_function")
            return torch._dynamo.lookup_backend("aot_eager")(graph, example_inputs)

        compiled = torch.compile(mine, backend=backend, fullgraph=True)
        x = (torch.randn(2, 32, 8, 8) * 2 + 1).to(memory_format=torch.channels_last)
        xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
        want, got = ref(xa), compiled(xb)
        grad = torch.randn_like(want)
        want.backward(grad)
        got.backward(grad)
        norms = [(a, b) for a, b in zip(ref.modules(), mine.modules()) if isinstance(a, torch.nn.BatchNorm2d)]
        return {"y": relative(got, want), "dx": relative(xb.grad, xa.grad),
                "dparams": max(relative(b.grad, a.grad) for a, b in zip(ref.parameters(), mine.parameters())),
                "running_mean": max(relative(b.running_mean, a.running_mean) for a, b in norms),
                "running_var": max(relative(b.running_var, a.running_var) for a, b in norms),
                "ops": {op: sum(f"joulebench.{op}" in target for target in traced)
                        for op in ("conv1x1_batch_norm_stats", "batch_norm_stats", "bn_act_apply")}}

    results["compiled-bottleneck"] = bottleneck(FusedBottleneck)
    results["compiled-conv-stats-bottleneck"] = bottleneck(ConvStatsBottleneck)
    print("RESULTS " + json.dumps(results))
""")
SUMS = ("dweight", "dbias", "running_mean", "running_var")
TOLERANCE = {"float32": dict.fromkeys(("y", "dx", "dresidual", *SUMS), 1e-5),
             "bfloat16": {**dict.fromkeys(("y", "dx", "dresidual"), 1.6e-2), **dict.fromkeys(SUMS, 1e-5)}}


@pytest.fixture(scope="module")
def interpreted() -> dict[str, dict[str, float]]:
    """The child's worst relative error per case and quantity."""
    pytest.importorskip("triton", reason="Triton is not installed (CPU-only torch wheel): the kernels cannot run")
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    results: dict[str, dict[str, float]] = json.loads(done.stdout.split("RESULTS ", 1)[1])
    return results

H100_SHARED_BYTES_PER_BLOCK = 227 * 1024  # the most shared memory one block may take on sm_90


def test_kernels_match_torch_batch_norm_add_relu(interpreted: dict[str, dict[str, float]]) -> None:
    cases = {name: errors for name, errors in interpreted.items() if name.split("-")[0] in TOLERANCE}
    assert len(cases) == 8 and sum("dresidual" in errors for errors in cases.values()) == 4
    for name, errors in cases.items():
        limits = TOLERANCE[name.split("-")[0]]
        assert set(errors) <= set(limits)
        worse = {key: value for key, value in errors.items() if not value <= limits[key]}
        assert not worse, f"{name}: {worse} beyond {limits}"


def test_conv_gemm_matches_torch_conv_and_its_output_statistics(interpreted: dict[str, dict[str, float]]) -> None:
    cases = {name: errors for name, errors in interpreted.items() if name.startswith("conv-")}
    assert len(cases) == 5 and sum("bfloat16" in name for name in cases) == 2
    far = cases.pop("conv-float32-far-mean")
    for name, errors in cases.items():
        assert set(errors) == {"y", "mean", "var", "invstd", "spread", "naive_var"}
        limits = {"y": 1.6e-2 if "bfloat16" in name else 1e-5, "mean": 1e-5, "var": 1e-5, "invstd": 1e-5}
        worse = {key: errors[key] for key, limit in limits.items() if not errors[key] <= limit}
        assert not worse, f"{name}: {worse}"
    # std/mean below 1e-3: the fp32 sum of squares less the squared sum loses the variance (seen 0.39), the moments'
    # merge keeps it to 1e-4 (seen 4e-5; its error grows with mean/std linearly, not quadratically)
    assert far["spread"] < 1e-3 and far["naive_var"] > 0.1
    assert far["y"] <= 1e-5 and far["mean"] <= 1e-5 and far["var"] <= 1e-4 and far["invstd"] <= 1e-4, far


@pytest.mark.parametrize("block", ["compiled-bottleneck", "compiled-conv-stats-bottleneck"])
def test_compiled_fused_bottleneck_matches_torchvision(interpreted: dict[str, dict[str, float]], block: str) -> None:
    """torch.compile traces the custom ops without a graph break (fullgraph) and autograd reaches every parameter."""
    errors = dict(interpreted[block])
    ops = errors.pop("ops")
    assert set(errors) == {"y", "dx", "dparams", "running_mean", "running_var"}
    assert all(value <= 1e-5 for value in errors.values()), errors
    # four norms; with the statistics in the convolutions, the three 1x1s (conv1, conv3, downsample) measure theirs
    fused = 3 if block == "compiled-conv-stats-bottleneck" else 0
    assert ops == {"conv1x1_batch_norm_stats": fused, "batch_norm_stats": 4 - fused, "bn_act_apply": 4}


def test_fused_models_have_torchvisions_weights_names_and_eval_outputs() -> None:
    """Both fused models (triton, triton-conv): same seed, same weights and state_dict names (checkpoints
    interchange); in eval mode (no Triton kernel runs, running statistics) the same outputs as torchvision's."""
    pytest.importorskip("triton", reason="Triton is not installed (CPU-only torch wheel)")
    import torchvision

    from resnet50.torch_backend import build_model

    torch.manual_seed(3)
    ref = torchvision.models.resnet50(weights=None).eval()
    ref_state = ref.state_dict()
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        want = ref(x)
    for bn_kernels in ("triton", "triton-conv"):
        torch.manual_seed(3)
        mine = build_model(bn_kernels).eval()
        state = mine.state_dict()
        assert list(ref_state) == list(state)
        assert all(torch.equal(ref_state[key], state[key]) for key in ref_state)
        with torch.no_grad():
            torch.testing.assert_close(mine(x), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("bn_kernels", ["triton", "triton-conv"])
def test_triton_batch_norm_refused_on_the_cpu(capsys: pytest.CaptureFixture, bn_kernels: str) -> None:
    assert main(["train", "--framework", "pytorch", *SMALL, "--bn-kernels", bn_kernels, "--iterations", "1"]) == (
        ExitCode.USAGE)
    err = capsys.readouterr().err
    assert f"--bn-kernels {bn_kernels} on the CPU" in err and f"Fix: drop --bn-kernels {bn_kernels} (" in err
    assert all(len(line) <= 160 for line in err.splitlines())
    assert main(["validate", "--framework", "tensorflow", "--bn-kernels", bn_kernels]) == ExitCode.USAGE
    assert f"--bn-kernels {bn_kernels} with --framework tensorflow" in capsys.readouterr().err


@pytest.mark.parametrize("bn_kernels", ["triton", "triton-conv"])
def test_triton_batch_norm_refused_on_a_gpu_without_triton(monkeypatch: pytest.MonkeyPatch, bn_kernels: str) -> None:
    """A CUDA machine whose torch came without Triton (the import system finds no module `triton`)."""
    import importlib.util

    from jpwr import ValidationError
    from resnet50.config import TrainConfig, check_devices

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *rest: None if name == "triton" else find_spec(
        name, *rest))
    with pytest.raises(ValidationError) as refused:
        check_devices(TrainConfig(framework="pytorch", bn_kernels=bn_kernels), 1, "cuda")
    assert str(refused.value) == (f"--bn-kernels {bn_kernels} but Triton is not installed. Fix: install torch's CUDA "
                                  "wheel (it brings triton), or pass --bn-kernels inductor")


@pytest.mark.parametrize(("bn_kernels", "label"), [("triton", ", batch norm by own Triton kernels, "), (
    "triton-conv", ", batch norm by own Triton kernels, its statistics in the 1x1 convolutions, ")])
def test_validate_names_the_triton_batch_norm(capsys: pytest.CaptureFixture, bn_kernels: str, label: str) -> None:
    assert main(["validate", "--framework", "pytorch", "--bn-kernels", bn_kernels, "--world-size", "1"]) == 0
    assert label in capsys.readouterr().out


def test_kernel_profiles_count_our_kernels_as_batch_norm_and_convolution() -> None:
    """benchmarks/kernel_profile.py's classes put our batch-norm kernels beside inductor's batch-norm fusions and our
    convolution GEMM beside cuDNN's convolutions, so the lever's profile compares like with like."""
    triton = pytest.importorskip("triton", reason="Triton is not installed (CPU-only torch wheel)")
    import resnet50.bn_kernels as kernels
    import resnet50.conv_stats as conv
    from joulebench.analysis.kernel_classes import category

    def jitted(module: Any) -> set[str]:  # its own Triton functions: kernels and the helpers they inline
        return {value.__name__ for value in vars(module).values() if isinstance(value, triton.runtime.jit.JITFunction)
                and value.__module__ == module.__name__}

    launched = {name for name in jitted(kernels) if name.startswith("triton_batch_norm_")}  # the rest are inlined
    assert len(launched) == 6
    assert {category(name) for name in launched} == {"triton (batch-norm fusions)"}
    assert [category(name) for name in jitted(conv)] == ["convolution"]


def test_conv_gemm_compiles_for_an_h100_without_spills() -> None:
    """The GEMM at the launch configurations ResNet-50's 1x1 convolutions get compiles for sm_90 with Triton's bundled
    ptxas into Hopper's tensor-core instructions (wgmma), and keeps its accumulator and moments in registers. Per tile
    width and element type (bf16, and fp32 for --precision fp32), the heaviest configuration is compiled (the deepest
    pipeline, the strided row mapping where one has it) and its shared memory fits an H100 block (227 KiB): the
    others differ only by fewer stages or less index code (five compiles, about a second each: the fifth the bf16
    128-wide tile with FLATTEN, whose pipeline holds more in shared memory)."""
    bundled_ptxas()  # skips without Triton or its ptxas
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from resnet50 import conv_stats
    from resnet50.fused_bn import fused_resnet50, gemm_shaped

    with torch.device("meta"):
        model = fused_resnet50(conv_stats=True)
    convs = [conv for conv in model.modules() if isinstance(conv, torch.nn.Conv2d) and gemm_shaped(conv)]
    assert len(convs) == 16 * 2 + 4  # conv1 and conv3 of 16 blocks, 4 downsamples
    heaviest: dict[tuple[str, int], tuple[int, bool, dict[str, int]]] = {}
    for conv in convs:
        for element, size in (("bf16", 2), ("fp32", 4)):
            config = conv_stats.launch_config(conv.in_channels, conv.out_channels, size)
            weight = (config["num_stages"], conv.stride[0] != 1, config)
            key = (element, config["BLOCK_N"])
            heaviest[key] = max(heaviest.get(key, weight), weight, key=lambda w: w[:2])
    assert sorted(heaviest) == [("bf16", 64), ("bf16", 128), ("fp32", 64), ("fp32", 128)]
    # and the bf16 128-wide tile with its tile and K loops pipelined as one (FLATTEN, the sweep's option)
    stages, strided, config = heaviest[("bf16", 128)]
    cases = [*heaviest.items(), (("bf16", 128), (stages, strided, {**config, "FLATTEN": True}))]
    for (element, _), (_stages, strided, config) in cases:
        types = {"x_ptr": f"*{element}", "w_ptr": f"*{element}", "y_ptr": f"*{element}", "partial_ptr": "*fp32",
                 **dict.fromkeys(("rows", "in_channels", "out_channels", "height", "width", "out_height",
                                  "out_width", "stride", "tiles_per_program"), "i32")}
        # as Triton's launcher specialises them: pointers and ResNet-50's channel counts divisible by 16
        aligned = {(index,): [["tt.divisibility", 16]] for index, (name, kind) in enumerate(types.items())
                   if kind.startswith("*") or name.endswith("_channels")}
        constants = {"STRIDED": strided, "FLATTEN": False,
                     **{key: value for key, value in config.items() if key.isupper()}}
        options = {key: value for key, value in config.items() if not key.isupper()}
        signature = {**types, **dict.fromkeys(constants, "constexpr")}
        compiled = triton.compile(ASTSource(conv_stats.conv1x1_gemm_with_batch_norm_stats, signature, constants,
                                            attrs=aligned), target=GPUTarget("cuda", 90, 32), options=options)
        assert "wgmma" in compiled.asm["ptx"], element
        assert compiled.metadata.shared <= H100_SHARED_BYTES_PER_BLOCK, (element, config, compiled.metadata.shared)
        stores, loads, report = spill_bytes(compiled.asm["ptx"])
        assert (stores, loads) == (0, 0), (element, constants, report)
