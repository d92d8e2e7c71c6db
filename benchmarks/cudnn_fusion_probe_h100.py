#!/usr/bin/env python3
"""Issue 58 on one GPU: MLPerf's fused ResNet-50 forward through cuDNN's graph API (`nvidia-cudnn-frontend`), each
of ResNet-50's convolution shapes at GBS 256 (channels-last), against what torch runs today; no meter (this decides
whether the route is worth wiring into resnet50, docs/perf-notes.md "Issue 58, cuDNN graph route").

    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/nvidia_cudnn_frontend-1.28.0-*.whl
    PYTHONPATH=/tmp/site python3 benchmarks/cudnn_fusion_probe_h100.py --out $OUT/cudnn
    PYTHONPATH=/tmp/site python3 benchmarks/cudnn_fusion_probe_h100.py --shapes 1x1/128-512@28,3x3 --plans 4 --out o

Per shape, cuDNN graphs built once each (heuristics A then FALLBACK; the first --plans plans that build are timed,
the fastest kept): (a) conv_fprop alone; (b) conv_fprop + genstats (per-channel sum and sum of squares of the
output, fp32: the batch norm's statistics in the convolution's epilogue); (c) scale, bias and ReLU on the input
(the previous batch norm's apply, "SBR") -> conv_fprop -> genstats (MLPerf's fused forward). Each is checked
against torch on the same tensors (F.conv2d of the input, or of relu(x*scale+bias) rounded to the input's type;
statistics from that output in float64). Beside them, what torch runs: F.conv2d channels-last (cuDNN through torch,
cudnn.benchmark on as the resnet50 driver sets it); F.conv2d + torch.var_mean over N,H,W; SBR + F.conv2d +
var_mean, eager (SBR three kernels) and with SBR and the statistics compiled by inductor (one kernel each, as the
compiled training step has them). Time: mean of REPEATS calls by CUDA events after WARMUP calls, the GPU held
back while the calls are queued (a CUDA graph replays the training step: launch costs are not the kernels').
GB/s: the fused form's bytes (input, weights and output once) over that time, for every case of a shape alike.

One JSON line per row (prefix CUDNNPROBE), results.md / results.json under --out rewritten after each shape, and
the sum over ResNet-50's 53 convolutions (each shape times its occurrences) of the unfused and the fused forward.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import textwrap
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.common import exit_status, markdown_table, queued_seconds, write_results  # noqa: E402
from benchmarks.resnet50_convs import SHAPES, ConvShape  # noqa: E402
from joulebench.boundary import exit_code_of  # noqa: E402
from jpwr import ValidationError  # noqa: E402

PROG = "benchmarks/cudnn_fusion_probe_h100.py"
REPEATS = 20
WARMUP = 3
MATCH = 2e-2  # largest accepted difference from torch, relative to the output's largest value (bf16: 2^-8)
HEURISTICS = ("A", "FALLBACK")
ERROR_CHARS = 2000  # of an error's text kept in a row (cuDNN lists every engine's decline)
CALL_SITE = re.compile(r"[\w.:>-]+(\(\))?")  # a decline reason that only names where it was raised
EXTRA_PLAN_TRIES = 4  # plans that fail to build, walked past before a case counts as unsupported
INSTALL_FIX = ("on the GPU machine: python3 -m pip install -q --no-index --no-deps --target /tmp/site "
               ".whl/nvidia_cudnn_frontend-1.28.0-*.whl, then run it with PYTHONPATH=/tmp/site")
DTYPES = {"bf16": ("bfloat16", "BFLOAT16"), "fp16": ("float16", "HALF")}  # --dtype: torch's name, cuDNN's name

# The cases of a shape, in table order. SBR = scale, bias and ReLU: the previous batch norm's apply.
TORCH_CONV, TORCH_STATS, TORCH_SBR = "torch conv", "torch conv+var_mean", "torch SBR+conv+var_mean"
INDUCTOR_STATS, INDUCTOR_SBR = "inductor conv+stats", "inductor SBR+conv+stats"
CUDNN_CONV, CUDNN_STATS, CUDNN_SBR = "cuDNN (a) conv", "cuDNN (b) conv+genstats", "cuDNN (c) SBR+conv+genstats"
HEADER = ("shape", "convs", "after BN-ReLU", "case", "status", "µs", "GB/s", "output diff", "stats diff", "plan",
          "build s", "note")


KERNEL_GROUPS = ("1x1", "3x3", "7x7")


def select_shapes(text: str) -> list[ConvShape]:
    """--shapes: comma-separated labels (as the table prints them) or groups (all, 1x1, 3x3, 7x7), in SHAPES order."""
    items = [item.strip() for item in text.split(",") if item.strip()]
    labels = {shape.label for shape in SHAPES}
    unknown = [item for item in items if item not in labels and item not in ("all", *KERNEL_GROUPS)]
    if unknown or not items:
        raise ValidationError(f"--shapes: {'unknown ' + ', '.join(unknown) if unknown else 'names nothing'}",
                              f"name all, {', '.join(KERNEL_GROUPS)} or labels like {SHAPES[16].label}")
    return [shape for shape in SHAPES if "all" in items or shape.label in items
            or shape.label.split("/")[0] in items]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="directory for results.md and results.json")
    parser.add_argument("--shapes", default="all", help="labels or groups (all, 1x1, 3x3, 7x7), comma-separated")
    parser.add_argument("--batch", type=int, default=256, help="images per convolution (GBS 256 on one GPU)")
    parser.add_argument("--dtype", choices=tuple(DTYPES), default="bf16", help="activations and weights")
    parser.add_argument("--plans", type=int, default=2, help="cuDNN plans timed per graph, the fastest kept")
    parser.add_argument("--budget-s", type=float, default=400.0,
                        help="no new shape starts after this many seconds; the rest are rows marked skipped")
    return parser


def nhwc_stride(n: int, c: int, h: int, w: int) -> list[int]:
    """Strides of an (n, c, h, w) tensor laid out channels-last, in elements."""
    del n
    return [h * w * c, 1, w * c, c]


def build_graph(cudnn: Any, shape: ConvShape, case: str, batch: int, dtype: str, handle: Any) -> tuple[Any, dict]:
    """The operation graph of one cuDNN case (no GPU needed to build it), and its tensors by role: x, w, y and,
    as the case has them, scale, bias, sum and sq_sum."""
    io = getattr(cudnn.data_type, DTYPES[dtype][1])
    fp32 = cudnn.data_type.FLOAT
    graph = cudnn.pygraph(io_data_type=io, intermediate_data_type=fp32, compute_data_type=fp32, handle=handle)
    n, c, k, r, h, p = batch, shape.cin, shape.cout, shape.kernel, shape.side, shape.out_side
    tensors = {"x": graph.tensor(name="X", dim=[n, c, h, h], stride=nhwc_stride(n, c, h, h), data_type=io),
               "w": graph.tensor(name="W", dim=[k, c, r, r], stride=nhwc_stride(k, c, r, r), data_type=io)}
    image = tensors["x"]
    if case == CUDNN_SBR:
        for role, name in (("scale", "S"), ("bias", "B")):
            tensors[role] = graph.tensor(name=name, dim=[1, c, 1, 1], stride=nhwc_stride(1, c, 1, 1), data_type=io)
        image = graph.relu(input=graph.bias(input=graph.scale(input=image, scale=tensors["scale"]),
                                            bias=tensors["bias"]))
    y = graph.conv_fprop(image=image, weight=tensors["w"], padding=[shape.padding] * 2, stride=[shape.stride] * 2,
                         dilation=[1, 1])
    tensors["y"] = y.set_output(True).set_dim([n, k, p, p]).set_stride(nhwc_stride(n, k, p, p)).set_data_type(io)
    if case != CUDNN_CONV:
        total, squares = graph.genstats(input=y)
        tensors["sum"] = total.set_output(True).set_data_type(fp32)
        tensors["sq_sum"] = squares.set_output(True).set_data_type(fp32)
    return graph, tensors


def lower(graph: Any) -> None:
    """Validate the graph and build its operation graph: the steps that need no GPU (the CPU test runs them)."""
    graph.validate()
    graph.build_operation_graph()


def why(error: BaseException, width: int = 110) -> str:
    """An error in a table cell (its pipes escaped): where cuDNN lists each engine's decline, its distinct reasons
    that say a condition (not the bare call sites: "finalize_internal()", "status"), else the message's start."""
    text = " ".join(str(error).split())
    reasons = re.findall(r"Reason: (.*?)(?= Warning: | \{\"engineId| \)$|$)", text)
    telling = [reason for reason in dict.fromkeys(reasons) if not CALL_SITE.fullmatch(reason)]
    said = "; ".join(telling) if telling else f"{type(error).__name__}: {text}"
    return (said[:width] + ("…" if len(said) > width else "")).replace("|", "\\|")  # a cell of results.md


class Probe:
    """The GPU side: torch and cuDNN, one handle on torch's stream, inductor's two compiled passes."""

    device = "cuda"

    def __init__(self, torch: Any, cudnn: Any, batch: int, dtype: str, plans: int) -> None:
        self.torch, self.cudnn, self.batch, self.dtype_name, self.plans = torch, cudnn, batch, dtype, plans
        self.dtype = getattr(torch, DTYPES[dtype][0])
        torch.backends.cudnn.benchmark = True  # as the resnet50 driver runs its convolutions
        torch.cuda.init()
        self.handle = cudnn.create_handle()
        cudnn.set_stream(handle=self.handle, stream=torch.cuda.current_stream().cuda_stream)
        torch._dynamo.config.cache_size_limit = 64  # every shape in one dynamic compile, never a silent eager fallback
        self.compiled_sbr = torch.compile(sbr, dynamic=True)
        self.compiled_stats = torch.compile(channel_stats, dynamic=True)

    def seconds(self, call: Callable[[], object]) -> float:
        """Mean seconds of one call (benchmarks.common.queued_seconds: no launch costs)."""
        return queued_seconds(call, REPEATS, WARMUP)

    def tensors(self, shape: ConvShape) -> dict[str, Any]:
        """Inputs, output buffers and torch's references for one shape (seeded: every run draws the same)."""
        torch, F = self.torch, self.torch.nn.functional
        torch.manual_seed(58)
        n, c, k, r, h, p = self.batch, shape.cin, shape.cout, shape.kernel, shape.side, shape.out_side
        cl = torch.channels_last

        def drawn(*size: int, scale: float = 1.0, offset: float = 0.0, uniform: bool = False) -> Any:
            values = torch.rand(*size, device=self.device) if uniform else torch.randn(*size, device=self.device)
            return (values * scale + offset).to(self.dtype).contiguous(memory_format=cl)

        data = {"x": drawn(n, c, h, h), "w": drawn(k, c, r, r, scale=1 / math.sqrt(c * r * r)),
                "scale": drawn(1, c, 1, 1, uniform=True, offset=0.5), "bias": drawn(1, c, 1, 1, scale=0.5),
                "y": torch.empty(n, k, p, p, device=self.device, dtype=self.dtype, memory_format=cl),
                "sum": torch.empty(1, k, 1, 1, device=self.device),
                "sq_sum": torch.empty(1, k, 1, 1, device=self.device)}
        activation = torch.relu(data["x"].float() * data["scale"].float() + data["bias"].float()).to(self.dtype)
        for name, image in (("plain", data["x"]), ("sbr", activation)):
            reference = F.conv2d(image, data["w"], stride=shape.stride, padding=shape.padding)
            wide = reference.double()
            data[f"ref_{name}"] = reference
            data[f"stats_{name}"] = (wide.sum((0, 2, 3)), wide.square().sum((0, 2, 3)), wide.abs().sum((0, 2, 3)))
        return data

    def torch_rows(self, shape: ConvShape, data: dict[str, Any]) -> list[tuple[str, Callable[[], object]]]:
        """What torch runs today for each comparison, as calls on the same tensors."""
        F = self.torch.nn.functional
        x, w, scale, bias = data["x"], data["w"], data["scale"], data["bias"]

        def conv(image: Any) -> Any:
            return F.conv2d(image, w, stride=shape.stride, padding=shape.padding)

        return [(TORCH_CONV, lambda: conv(x)),
                (TORCH_STATS, lambda: channel_stats(conv(x))),
                (TORCH_SBR, lambda: channel_stats(conv(sbr(x, scale, bias)))),
                (INDUCTOR_STATS, lambda: self.compiled_stats(conv(x))),
                (INDUCTOR_SBR, lambda: self.compiled_stats(conv(self.compiled_sbr(x, scale, bias))))]

    def cudnn_case(self, shape: ConvShape, case: str, data: dict[str, Any]) -> dict[str, Any]:
        """Build, check and time one cuDNN graph: the fastest of its first --plans plans that build."""
        cudnn, torch = self.cudnn, self.torch
        began = time.perf_counter()
        graph, tensors = build_graph(cudnn, shape, case, self.batch, self.dtype_name, self.handle)
        lower(graph)
        graph.create_execution_plans([getattr(cudnn.heur_mode, mode) for mode in HEURISTICS])
        graph.check_support()
        build_s = time.perf_counter() - began
        pack = {tensor: data[role] for role, tensor in tensors.items()}
        reference = "sbr" if case == CUDNN_SBR else "plain"
        best: dict[str, Any] = {}
        declined: list[str] = []
        built = 0
        for index in range(graph.get_execution_plan_count()):
            if built == self.plans or len(declined) == self.plans + EXTRA_PLAN_TRIES:
                break
            began = time.perf_counter()
            try:
                graph.build_plan_at_index(index)
            except Exception as error:  # a plan that does not build: the next one may
                declined.append(why(error))
                continue
            finally:
                build_s += time.perf_counter() - began
            built += 1
            workspace = torch.empty(max(graph.get_workspace_size(), 1), device=self.device, dtype=torch.uint8)

            def run(workspace: Any = workspace) -> None:
                graph.execute(pack, workspace, handle=self.handle)

            data["y"].fill_(float("nan"))  # no earlier case's or plan's output can pass for this one's
            data["sum"].zero_()
            data["sq_sum"].zero_()
            try:  # a plan that builds but fails to run: the plans already timed stand
                run()
                checked = self.check(data, reference, "sum" in tensors)
                seconds = self.seconds(run)
                if "sum" in tensors:
                    checked["note"] = self.stats_note(data, reference)
            except Exception as error:
                declined.append(f"ran: {why(error)}")
                continue
            if not best or seconds < best["seconds"]:
                best = {**checked, "seconds": seconds, "plan": graph.get_plan_name_at_index(index)}
        if not best:
            first = declined[0] if declined else "nothing"
            raise cudnn.cudnnGraphNotSupportedError(f"none of the {len(declined)} tried plans built; first: {first}")
        best["build s"] = build_s
        if declined:
            best["note"] = "; ".join(filter(None, (best.get("note"), f"{len(declined)} plan(s) did not build or run")))
        return best

    def check(self, data: dict[str, Any], reference: str, stats: bool) -> dict[str, Any]:
        """The output's and the statistics' largest differences from torch's, and the verdict."""
        expected = data[f"ref_{reference}"]
        scale = expected.abs().max().float().item() or 1.0
        output_diff = (data["y"].float() - expected.float()).abs().max().item() / scale
        result: dict[str, Any] = {"output diff": output_diff}
        worst = output_diff
        if stats:
            result["stats diff"] = self.stats_diff(data, reference)
            worst = max(worst, result["stats diff"])
        result["status"] = "OK" if worst <= MATCH else f"WRONG: off by {worst:.1e} of the largest value"
        return result

    @staticmethod
    def stats_diff(data: dict[str, Any], reference: str) -> float:
        """Largest per-channel difference of the sum (relative to the sum of |y|) and of the sum of squares."""
        total, squares, absolute = data[f"stats_{reference}"]
        sum_diff = ((data["sum"].flatten().double() - total).abs() / absolute.clamp_min(1e-30)).max().item()
        square_diff = ((data["sq_sum"].flatten().double() - squares).abs() / squares.clamp_min(1e-30)).max().item()
        return float(max(sum_diff, square_diff))

    def stats_note(self, data: dict[str, Any], reference: str) -> str:
        """Whether genstats overwrote its outputs on every call (a caller that accumulates would zero them)."""
        calls = 1 + WARMUP + REPEATS
        if self.stats_diff(data, reference) <= MATCH:
            return f"stats overwritten ({calls} calls)"
        _, squares, _ = data[f"stats_{reference}"]
        ratio = data["sq_sum"].double().sum().item() / max(squares.sum().item(), 1e-30)
        return f"stats after {calls} calls: x{ratio:.1f} of one call's"


def sbr(x: Any, scale: Any, bias: Any) -> Any:
    """The batch norm's apply with its ReLU, on a (1, C, 1, 1) scale and bias."""
    import torch

    return torch.relu(x * scale + bias)


def channel_stats(y: Any) -> Any:
    """The batch norm's statistics pass: variance and mean per channel over N, H, W."""
    import torch

    return torch.var_mean(y, dim=(0, 2, 3), correction=0)


def measure_shape(probe: Probe, shape: ConvShape) -> list[dict[str, Any]]:
    """Every case of one shape as table rows; a case that fails is a row saying why."""
    data = probe.tensors(shape)
    moved = shape.bytes_moved(probe.batch, data["x"].element_size())
    rows = []

    def timed(call: Callable[[], object]) -> Callable[[], dict[str, Any]]:
        return lambda: {"status": "OK", "seconds": probe.seconds(call)}

    def built(case: str) -> Callable[[], dict[str, Any]]:
        return lambda: probe.cudnn_case(shape, case, data)

    # the SBR cases only where a batch norm + ReLU output feeds the convolution (the summary uses them nowhere else)
    sbr_cases = {TORCH_SBR, INDUCTOR_SBR, CUDNN_SBR} if not shape.after_bn_relu else set()
    cases = [(name, timed(call)) for name, call in probe.torch_rows(shape, data) if name not in sbr_cases]
    cases += [(name, built(name)) for name in (CUDNN_CONV, CUDNN_STATS, CUDNN_SBR) if name not in sbr_cases]
    for name, measure in cases:
        row: dict[str, Any] = {"shape": shape.label, "convs": shape.count, "after BN-ReLU": shape.after_bn_relu,
                               "case": name}
        try:
            result = measure()
        except Exception as error:  # an unsupported pattern is a row, not the end
            verdict = "unsupported" if isinstance(error, probe.cudnn.cudnnGraphNotSupportedError) else "failed"
            row.update(status=f"{verdict}: {why(error)}", error=" ".join(str(error).split())[:ERROR_CHARS])
        else:
            seconds = result.pop("seconds")
            row.update(result, **{"µs": seconds * 1e6, "GB/s": moved / seconds / 1e9})
        rows.append(row)
        print("CUDNNPROBE " + json.dumps(row), flush=True)
    return rows


def summary(rows: Sequence[dict[str, Any]], shapes: Sequence[ConvShape]) -> list[str]:
    """The forward of the measured shapes summed per iteration (each shape times its occurrences): torch's unfused
    sequences as the compiled step runs them against cuDNN's fused graphs, (c) where the input is a batch norm +
    ReLU output, (b) elsewhere; a shape missing a time is named, not counted."""
    micros = {(row["shape"], row["case"]): row["µs"] for row in rows if row.get("µs") is not None
              and row.get("status") == "OK"}
    totals = {"unfused": 0.0, "fused": 0.0, "torch conv": 0.0, "cuDNN conv": 0.0}
    covered, missing = 0, []
    for shape in shapes:
        plain, fusable = shape.count - shape.after_bn_relu, shape.after_bn_relu
        needed = {"unfused": ((INDUCTOR_STATS, plain), (INDUCTOR_SBR, fusable)),
                  "fused": ((CUDNN_STATS, plain), (CUDNN_SBR, fusable)),
                  "torch conv": ((TORCH_CONV, shape.count),), "cuDNN conv": ((CUDNN_CONV, shape.count),)}
        if any(times and (shape.label, case) not in micros for parts in needed.values() for case, times in parts):
            missing.append(shape.label)
            continue
        covered += shape.count
        for key, parts in needed.items():
            totals[key] += sum(micros[(shape.label, case)] * times for case, times in parts if times) / 1e3
    lines = [f"Forward per iteration over {covered} of ResNet-50's 53 convolutions (each shape x its occurrences):",
             f"- unfused, as the compiled step runs it (inductor SBR where the input is a BN-ReLU output, conv, "
             f"inductor statistics): {totals['unfused']:.2f} ms",
             f"- cuDNN fused ((c) after a BN-ReLU, (b) elsewhere): {totals['fused']:.2f} ms; saved "
             f"{totals['unfused'] - totals['fused']:.2f} ms (the 7,200 img/s target needs 7.2 ms of 42.7)",
             f"- the convolutions alone: torch {totals['torch conv']:.2f} ms, cuDNN graph (a) "
             f"{totals['cuDNN conv']:.2f} ms"] if covered else ["Forward per iteration: no shape has every case "
                                                                "the sums need"]
    if missing:
        lines += textwrap.wrap(f"- not counted (a needed case failed or was skipped): {', '.join(missing)}",
                               width=158, subsequent_indent="  ")
    return lines


def save_tables(out: Path, rows: list[dict[str, Any]], lines: list[str], title: str, versions: dict) -> None:
    """The table and its summary as results.md, the rows as results.json (benchmarks.common.write_results)."""
    table = markdown_table(rows, HEADER, digits=4)
    write_results(out, f"{title}\n\n{table}\n\n" + "\n".join(lines) + "\n",
                  {"versions": versions, "rows": rows, "summary": lines})


def gpu_modules() -> tuple[Any, Any]:
    """torch with a visible GPU, and the cuDNN frontend; else the one-line refusal naming the fix."""
    import torch

    if not torch.cuda.is_available():
        raise ValidationError("no CUDA GPU is visible here: cuDNN's graphs are built and timed on one",
                              "run it on a GPU machine (docs/perf-notes.md, 'Issue 58, cuDNN graph route')")
    try:
        import cudnn
    except ImportError as error:
        raise ValidationError(f"the cuDNN frontend (nvidia-cudnn-frontend) does not import: {error}",
                              INSTALL_FIX) from error
    return torch, cudnn


def probe_main(argv: Sequence[str] | None) -> int:
    args = build_parser().parse_args(argv)
    shapes = select_shapes(args.shapes)
    if args.batch < 1 or args.plans < 1:
        raise ValidationError(f"--batch {args.batch} --plans {args.plans}: both count something", "give each ≥ 1")
    torch, cudnn = gpu_modules()
    began = time.perf_counter()
    probe = Probe(torch, cudnn, args.batch, args.dtype, args.plans)
    versions = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
                "cudnn backend": cudnn.backend_version(), "torch's cudnn": torch.backends.cudnn.version(),
                "cudnn frontend": getattr(cudnn, "__version__", "n/a")}
    title = (f"cuDNN graph fusions vs torch, ResNet-50 convolutions at batch {args.batch}, {args.dtype}, "
             f"channels-last ({', '.join(f'{k} {v}' for k, v in versions.items())})")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    for shape in shapes:
        if time.perf_counter() - began > args.budget_s:
            rows.append({"shape": shape.label, "convs": shape.count, "after BN-ReLU": shape.after_bn_relu,
                         "case": "all", "status": f"skipped: over --budget-s {args.budget_s:g}"})
            print("CUDNNPROBE " + json.dumps(rows[-1]), flush=True)
        else:
            rows += measure_shape(probe, shape)
            torch.cuda.empty_cache()  # this shape's tensors are gone: the next one's fit
        save_tables(out, rows, summary(rows, shapes), title, versions)
    lines = summary(rows, shapes)
    print("\n".join(lines))
    return exit_status(rows)


def main(argv: Sequence[str] | None = None) -> int:
    return exit_code_of(PROG, lambda: probe_main(argv), torch_extra="resnet-pytorch")


if __name__ == "__main__":
    sys.exit(main())
