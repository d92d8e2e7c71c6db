"""`--bn-kernels triton`: our batch-norm + add + ReLU kernels against torch's BatchNorm2d (+ add) (+ ReLU).

The kernels run in Triton's interpreter (TRITON_INTERPRET=1, CPU tensors) in one child process, because the
interpreter is chosen when Triton is imported. Checked there, each case with fresh random data: the output, the
running statistics after two steps, and the gradients dx, dweight, dbias and dresidual, for fp32 and for bf16
channels-last activations (the README's), with row counts that are not multiples of the tile, channel counts
that are not multiples of 64 and more row slices than one tile of their reduction; and a FusedBottleneck (with its
downsample) through torch.compile (aot_eager, fullgraph: our ops stay in the traced graph) against torchvision's
Bottleneck in eager mode. Tolerances, relative
to each tensor's largest value (seen: about 1e-6 in fp32): fp32 within 1e-5; bf16 outputs, dx and dresidual within
1.6e-2 of the fp32 reference on the same bf16 inputs (the output's bf16 rounding is 2^-8 of a value; seen 6e-3),
bf16 dweight, dbias and running statistics (fp32 sums of the same bf16 values) within 1e-5.
On a GPU, benchmarks/perf33_h100.py's resnet50-readme-bn-triton run measures speed and the loss at step 200.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from jpwr.errors import ExitCode
from resnet50.cli import main
from tests.resnet50.conftest import REPO, SMALL

pytest.importorskip("torchvision")

CHILD = textwrap.dedent("""
    import json
    import torch
    from torchvision.models.resnet import Bottleneck
    from resnet50.fused_bn import BatchNormAct, FusedBottleneck

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

    # a whole block (1x1 downsample path, stride 2) through torch.compile, against torchvision's block in eager mode
    torch.manual_seed(5)
    down = lambda norm: torch.nn.Sequential(torch.nn.Conv2d(32, 64, 1, 2, bias=False), norm(64))
    torch.manual_seed(5)
    ref = Bottleneck(32, 16, 2, down(torch.nn.BatchNorm2d)).to(memory_format=torch.channels_last)
    torch.manual_seed(5)
    mine = FusedBottleneck(32, 16, 2, down(BatchNormAct), norm_layer=BatchNormAct).to(memory_format=torch.channels_last)
    compiled = torch.compile(mine, backend="aot_eager", fullgraph=True)
    x = torch.randn(2, 32, 8, 8).to(memory_format=torch.channels_last)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    want, got = ref(xa), compiled(xb)
    grad = torch.randn_like(want)
    want.backward(grad)
    got.backward(grad)
    block = {"y": relative(got, want), "dx": relative(xb.grad, xa.grad),
             "running_var": max(relative(b.running_var, a.running_var)
                                for a, b in zip(ref.modules(), mine.modules()) if isinstance(a, torch.nn.BatchNorm2d))}
    block["dparams"] = max(relative(b.grad, a.grad) for a, b in zip(ref.parameters(), mine.parameters()))
    results["compiled-bottleneck"] = block
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


def test_kernels_match_torch_batch_norm_add_relu(interpreted: dict[str, dict[str, float]]) -> None:
    cases = {name: errors for name, errors in interpreted.items() if name != "compiled-bottleneck"}
    assert len(cases) == 8 and sum("dresidual" in errors for errors in cases.values()) == 4
    for name, errors in cases.items():
        limits = TOLERANCE[name.split("-")[0]]
        assert set(errors) <= set(limits)
        worse = {key: value for key, value in errors.items() if not value <= limits[key]}
        assert not worse, f"{name}: {worse} beyond {limits}"


def test_compiled_fused_bottleneck_matches_torchvision(interpreted: dict[str, dict[str, float]]) -> None:
    """torch.compile traces the custom ops without a graph break (fullgraph) and autograd reaches every parameter."""
    errors = interpreted["compiled-bottleneck"]
    assert set(errors) == {"y", "dx", "running_var", "dparams"}
    assert all(value <= 1e-5 for value in errors.values()), errors


def test_fused_model_has_torchvisions_weights_names_and_eval_outputs() -> None:
    """Same seed, same weights and state_dict names (checkpoints interchange); in eval mode (no Triton kernel runs,
    running statistics) the same outputs as torchvision's resnet50."""
    pytest.importorskip("triton", reason="Triton is not installed (CPU-only torch wheel)")
    import torchvision

    from resnet50.torch_backend import build_model

    torch.manual_seed(3)
    ref = torchvision.models.resnet50(weights=None).eval()
    torch.manual_seed(3)
    mine = build_model("triton").eval()
    ref_state, state = ref.state_dict(), mine.state_dict()
    assert list(ref_state) == list(state)
    assert all(torch.equal(ref_state[key], state[key]) for key in ref_state)
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(mine(x), ref(x), rtol=1e-5, atol=1e-5)


def test_triton_batch_norm_refused_on_the_cpu(capsys: pytest.CaptureFixture) -> None:
    assert main(["train", "--framework", "pytorch", *SMALL, "--bn-kernels", "triton", "--iterations", "1"]) == (
        ExitCode.USAGE)
    err = capsys.readouterr().err
    assert "--bn-kernels triton on the CPU" in err and "Fix: drop --bn-kernels triton" in err
    assert all(len(line) <= 160 for line in err.splitlines())
    assert main(["validate", "--framework", "tensorflow", "--bn-kernels", "triton"]) == ExitCode.USAGE
    assert "--bn-kernels triton with --framework tensorflow" in capsys.readouterr().err


def test_validate_names_the_triton_batch_norm(capsys: pytest.CaptureFixture) -> None:
    assert main(["validate", "--framework", "pytorch", "--bn-kernels", "triton", "--world-size", "1"]) == 0
    assert ", batch norm by own Triton kernels, " in capsys.readouterr().out


def test_kernel_profiles_count_our_kernels_as_batch_norm() -> None:
    """benchmarks/kernel_profile.py's classes put our kernels beside inductor's batch-norm fusions, so the lever's
    profile compares like with like."""
    triton = pytest.importorskip("triton", reason="Triton is not installed (CPU-only torch wheel)")
    import resnet50.bn_kernels as kernels
    from joulebench.analysis.kernel_classes import category

    names = [value.__name__ for name, value in vars(kernels).items()
             if isinstance(value, triton.runtime.jit.JITFunction) and not name.startswith("_")]
    assert len(names) == 6
    assert {category(name) for name in names} == {"triton (batch-norm fusions)"}
