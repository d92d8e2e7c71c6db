"""benchmarks/cudnn_fusion_probe_h100.py on the CPU: its shapes are ResNet-50's 53 convolutions, --shapes picks
them, and without a GPU it refuses in one line naming the fix; where the cuDNN frontend imports, its graphs lower
(validate and build the operation graph: the steps that need no GPU)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from jpwr.errors import ExitCode

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "cudnn_fusion_probe_h100.py"
_spec = importlib.util.spec_from_file_location("cudnn_fusion_probe_h100", SCRIPT)
assert _spec is not None and _spec.loader is not None
probe = importlib.util.module_from_spec(_spec)
sys.modules["cudnn_fusion_probe_h100"] = probe
_spec.loader.exec_module(probe)


def test_the_shapes_are_resnet50s_53_convolutions() -> None:
    shapes = probe.SHAPES
    assert sum(s.count for s in shapes) == 53
    assert sum(s.count for s in shapes if s.kernel == 1) == 36  # 16 conv1 + 16 conv3 + 4 downsamples
    assert sum(s.after_bn_relu for s in shapes) == 32  # every conv2 and conv3 reads a batch norm + ReLU output
    assert len({s.label for s in shapes}) == len(shapes)
    assert [s.out_side for s in shapes if s.label in ("3x3/128-128@56/s2", "7x7/3-64@224/s2")] == [28, 112]


def test_shapes_are_picked_by_label_or_kernel_group() -> None:
    assert [s.label for s in probe.select_shapes("3x3/64-64@56, 1x1/512-2048@7")] == ["1x1/512-2048@7",
                                                                                     "3x3/64-64@56"]
    assert {s.kernel for s in probe.select_shapes("3x3")} == {3}
    assert len(probe.select_shapes("3x3")) == 7
    assert len(probe.select_shapes("all")) == len(probe.SHAPES)
    args = probe.build_parser().parse_args(["--out", "o"])
    assert (args.shapes, args.batch, args.dtype, args.plans) == ("all", 256, "bf16", 2)


def test_the_summary_fuses_the_apply_only_where_a_bn_relu_output_is_read() -> None:
    shape = probe.SHAPES[0]  # 1x1/64-256@56: 4 convolutions, 3 of them conv3 (after bn2 + ReLU), 1 downsample
    micros = {probe.TORCH_CONV: 100, probe.TORCH_STATS: 150, probe.TORCH_SBR: 260, probe.INDUCTOR_STATS: 140,
              probe.INDUCTOR_SBR: 200, probe.CUDNN_CONV: 110, probe.CUDNN_STATS: 115, probe.CUDNN_SBR: 125}
    rows = [{"shape": shape.label, "case": case, "status": "OK", "µs": us} for case, us in micros.items()]
    rows.append({"shape": probe.SHAPES[1].label, "case": probe.TORCH_CONV, "status": "unsupported: no"})
    lines = probe.summary(rows, probe.SHAPES[:2])
    assert lines[0].startswith("Forward per iteration over 4 of ResNet-50's 53 convolutions")
    assert lines[1].endswith("statistics): 0.74 ms")  # 140 + 3 x 200 µs
    # 115 + 3 x 125 µs
    assert lines[2].startswith("- cuDNN fused ((c) after a BN-ReLU, (b) elsewhere): 0.49 ms; saved 0.25 ms")
    assert lines[3] == "- the convolutions alone: torch 0.40 ms, cuDNN graph (a) 0.44 ms"
    assert lines[4] == "- not counted (a needed case failed or was skipped): 1x1/256-64@56"


def test_an_unknown_shape_is_refused_naming_the_label_form(capsys: pytest.CaptureFixture[str]) -> None:
    assert probe.main(["--out", "unused", "--shapes", "1x1/64-256@55"]) == ExitCode.USAGE
    error = capsys.readouterr().err.strip()
    assert error == (f"{probe.PROG}: error: --shapes: unknown 1x1/64-256@55. Fix: name all, 1x1, 3x3, 7x7 or labels "
                     "like 3x3/128-128@56/s2")


def test_without_a_gpu_it_refuses_in_one_line_naming_the_fix(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: the probe would run")
    assert probe.main(["--out", str(tmp_path / "out"), "--shapes", "3x3"]) == ExitCode.USAGE
    error = capsys.readouterr().err.strip()
    assert error == (f"{probe.PROG}: error: no CUDA GPU is visible here: cuDNN's graphs are built and timed on one. "
                     "Fix: run it on a GPU machine (docs/perf-notes.md, 'Issue 58, cuDNN graph route')")
    assert not (tmp_path / "out").exists()  # refused before anything was written


@pytest.mark.parametrize("case", [probe.CUDNN_CONV, probe.CUDNN_STATS, probe.CUDNN_SBR])
def test_each_cudnn_graph_lowers_where_the_frontend_imports(case: str) -> None:
    cudnn = pytest.importorskip("cudnn")
    for shape in probe.select_shapes("3x3/128-128@56/s2,1x1/256-1024@14"):
        graph, tensors = probe.build_graph(cudnn, shape, case, 2, "bf16", None)
        probe.lower(graph)
        assert list(tensors["y"].get_dim()) == [2, shape.cout, shape.out_side, shape.out_side]
        assert list(tensors["y"].get_stride()) == probe.nhwc_stride(2, shape.cout, shape.out_side, shape.out_side)
        assert ("sum" in tensors) == (case != probe.CUDNN_CONV)
