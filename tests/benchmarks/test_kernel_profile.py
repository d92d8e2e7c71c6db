"""benchmarks/kernel_profile.py without a GPU: kernel categories, option splitting, workload checks."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from jpwr.errors import ExitCode, ValidationError

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "kernel_profile.py"
GPT_PROFILE = REPO / "benchmarks" / "results" / "2026-11-22-h100-perf" / "call1" / "prof.txt"

_spec = importlib.util.spec_from_file_location("kernel_profile", SCRIPT)
kernel_profile = importlib.util.module_from_spec(_spec)
sys.modules["kernel_profile"] = kernel_profile
_spec.loader.exec_module(kernel_profile)


def _profiled_gpt_kernels() -> list[tuple[str, str]]:
    """(kernel name, category) rows of the committed H100 GPT-800M profile (written by the old llm_profile.py)."""
    lines = GPT_PROFILE.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("top ")) + 1
    return [(line.split(" | ")[0], line.split(" | ")[-1]) for line in lines[start:] if line.strip()]


@pytest.mark.parametrize(("name", "recorded"), _profiled_gpt_kernels())
def test_gpt_kernels_keep_the_category_of_the_h100_profile(name: str, recorded: str) -> None:
    assert kernel_profile.category(name) == recorded


@pytest.mark.parametrize(("name", "expected"), [
    ("sm90_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize128x128x64_warpgroupsize1x1x1_"
     "execute_segment_k_off_kernel__5x_cudnn", "convolution"),
    ("sm80_xmma_dgrad_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize64x64x64_stage5_warpsize2x2x1_"
     "g1_tensor16x8x16_kernel", "convolution"),
    ("sm80_xmma_wgrad_implicit_gemm_indexed_wo_smem_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize128x128x32",
     "convolution"),
    ("void cutlass__5x_cudnn::Kernel<cutlass_tensorop_bf16_s16816fprop_optimized_bf16_128x128_32x5_nhwc_align8>",
     "convolution"),
    ("void cudnn::cnn::conv2d_grouped_direct_kernel<false, true, false, false, 0, 0, int, float>", "convolution"),
    ("cudnn::bn_fw_tr_1C11_kernel_NCHW", "batchnorm"),
    ("void cudnn::bn_bw_1C11_kernel_new<__nv_bfloat16, float, float2, 512, true, 1>", "batchnorm"),
    ("void cudnn::batchnorm_fwtr_nhwc_semiPersist<__nv_bfloat16, float, 512, true, false, true>", "batchnorm"),
    ("void at::native::batch_norm_collect_statistics_channels_last_kernel<at::native::Var, float, float, 4>",
     "batchnorm"),
    ("triton_red_fused__native_batch_norm_legit_functional_relu_0", "triton (batch-norm fusions)"),
    ("triton_poi_fused__native_batch_norm_legit_functional_add_relu_threshold_backward_3",
     "triton (batch-norm fusions)"),
    ("triton_poi_fused_convolution_0", "triton (compiled fusions)"),
    ("triton_poi_fused__to_copy_convert_element_type_1", "triton (compiled fusions)"),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x256_4x1x1_cga1x1x1_kernel0_0",
     "attention"),
    ("sm80_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize96x128x64_stage3_warpsize2x2x1_tensor16x8x16_kernel", "gemm"),
    ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::"
     "FusedSgdMathFunctor<float, 3>>", "optimizer"),
    ("void at::native::(anonymous namespace)::max_pool_forward_nhwc<c10::BFloat16>", "elementwise/other"),
])
def test_resnet_kernels_get_their_own_categories(name: str, expected: str) -> None:
    assert kernel_profile.category(name) == expected


def test_report_groups_kernels_and_names_the_workload() -> None:
    kernels = {"sm90_xmma_fprop_implicit_gemm_x": (600.0, 53.0), "cudnn::bn_fw_tr_1C11_kernel_NCHW": (400.0, 53.0)}
    text = kernel_profile.report(kernels, span_us=2000.0, header="workload: resnet50; config: --compile; x", top=1)
    lines = text.splitlines()
    assert lines[0] == "workload: resnet50; config: --compile; x"
    assert lines[1] == "per iteration: wall 2.0 ms (profiler on), kernel time 1.0 ms, device idle 50.0%"
    assert lines[4:6] == ["convolution | 0.6 | 60.0%", "batchnorm | 0.4 | 40.0%"]
    assert lines[-1] == "sm90_xmma_fprop_implicit_gemm_x | 0.6 | 53 | 60.0% | convolution"


def test_options_after_the_separator_belong_to_the_workload() -> None:
    args, rest = kernel_profile.parse_args(["--workload", "resnet50", "--out", "p.txt", "--steps", "3", "--",
                                            "--compile", "--global-batch-size", "256"])
    assert (args.workload, args.out, args.steps, args.warmup) == ("resnet50", "p.txt", 3, 4)
    assert rest == ["--compile", "--global-batch-size", "256"]
    with pytest.raises(ValidationError, match="--steps 0"):
        kernel_profile.parse_args(["--workload", "llm", "--out", "p.txt", "--steps", "0"])


def test_resnet50_options_are_those_of_python_m_resnet50() -> None:
    config = kernel_profile.resnet50_config(["--compile", "--global-batch-size", "128", "--precision", "fp16"])
    assert (config.framework, config.device, config.compile, config.global_batch_size, config.precision) == (
        "pytorch", "cuda", True, 128, "fp16")
    with pytest.raises(ValidationError, match="--framework tensorflow"):
        kernel_profile.resnet50_config(["--framework", "tensorflow"])
    with pytest.raises(SystemExit) as ended:  # the driver's parser: a batch of at least 1
        kernel_profile.resnet50_config(["--global-batch-size", "0"])
    assert ended.value.code == 2
    with pytest.raises(ValidationError, match="--device cpu"):
        kernel_profile.resnet50_config(["--device", "cpu"])


def test_bad_workload_options_exit_with_usage_code(tmp_path: Path) -> None:
    out = tmp_path / "prof.txt"
    argv = ["--workload", "resnet50", "--out", str(out), "--", "--framework", "tensorflow"]
    assert kernel_profile.main(argv) == ExitCode.USAGE
    assert not out.exists()


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch not installed")
def test_resnet50_workload_without_a_gpu_stops_before_device_work() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: building the workload would start device work")
    with pytest.raises(ValidationError, match="--device cuda"):
        kernel_profile.build_resnet50(["--global-batch-size", "8"])


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch not installed")
def test_inference_workload_is_the_static_engine_on_a_gpu() -> None:
    """The driver's own options and refusals; anything but the static engine on one GPU is refused by name."""
    import torch

    for argv, named in ((["--device", "cpu"], "--device cpu"), (["--engine", "hf"], "--engine hf"),
                        (["--batch-sizes", "1,8"], "batch sizes 1, 8"),
                        (["--objective", "energy"], "without a sampler")):
        with pytest.raises(ValidationError, match=named):
            kernel_profile.build_inference(argv)
    with pytest.raises(SystemExit) as ended:  # the driver's parser: a batch of at least 1
        kernel_profile.build_inference(["--batch-sizes", "0"])
    assert ended.value.code == 2
    if not torch.cuda.is_available():
        with pytest.raises(ValidationError, match="no CUDA GPU"):
            kernel_profile.build_inference(["--preset", "tiny"])


def test_importing_the_script_does_not_import_torch() -> None:
    code = (f"import importlib.util, sys; s = importlib.util.spec_from_file_location('kp', {str(SCRIPT)!r}); "
            "m = sys.modules['kp'] = importlib.util.module_from_spec(s); s.loader.exec_module(m); "
            "assert m.category('nvjet_sm90_tst') == 'gemm'; assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch not installed")
def test_profiled_intervals_land_on_the_monotonic_clock_between_the_anchors() -> None:
    """The mapping --intervals-out uses, on CPU ops (a CUDA kernel is a device event of the same profile)."""
    import time

    import torch
    from torch.profiler import ProfilerActivity, profile

    a = torch.ones(256, 256)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        anchors = [kernel_profile.clock_anchor(torch)]
        before = time.monotonic_ns()
        for _ in range(5):
            a @ a
        after = time.monotonic_ns()
        anchors.append(kernel_profile.clock_anchor(torch))
    data = kernel_profile.kernel_intervals(prof.events(), anchors, torch.autograd.DeviceType.CPU)
    assert data["kind"] == "joulebench.kernel_intervals" and kernel_profile.ANCHOR not in data["names"]
    matmuls = [i for i, k in enumerate(data["name_index"]) if data["names"][k] == "aten::mm"]
    assert len(matmuls) == 5
    slack = 2_000_000  # the profiler's own clock against the host's: well under the 2 ms allowed here
    for i in matmuls:
        assert before - slack <= data["t0_ns"][i] <= data["t1_ns"][i] <= after + slack


def test_intervals_out_needs_a_sampler(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("JPWR_ADDR", raising=False)
    with pytest.raises(ValidationError, match="--intervals-out without a jpwr sampler"):
        kernel_profile.parse_args(["--workload", "llm", "--out", "p.txt", "--intervals-out", "k.json"])
