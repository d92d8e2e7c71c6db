"""Every configuration check, through the `validate` command JUBE calls (no GPU, no torch import needed)."""

from __future__ import annotations

import pytest

from jpwr.errors import ExitCode, ValidationError
from llm_training import validation
from llm_training.cli import main
from tests.llm_training.conftest import LLM, run_cmd


def validate(capsys, *args: str) -> tuple[int, str, str]:
    """`validate` of a GPU layout (`--device cuda` unless the case names a device: `auto` would check it for this
    host, which has no GPU)."""
    device = [] if "--device" in args else ["--device", "cuda"]
    code = main(["validate", *device, *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--model", "7B"], ["unknown model preset --model '7B'", "tiny, 117M, 800M, 13B, 175B"]),
        (["--model", "800M", "--world-size", "3", "--tensor-parallel", "2"],
         ["world size 3 is not divisible by TP 2 × PP 1 = 2", "multiple of 2"]),
        (["--model", "800M", "--world-size", "3", "--pipeline-parallel", "3"],
         ["16 layers cannot be split evenly over --pipeline-parallel 3"]),
        (["--model", "800M", "--world-size", "3", "--tensor-parallel", "3"],
         ["8 attention heads cannot be split over --tensor-parallel 3"]),
        (["--model", "800M", "--world-size", "2", "--micro-batch-size", "4", "--global-batch-size", "12"],
         ["--global-batch-size 12 is not divisible by --micro-batch-size 4 × data-parallel size 2 = 8", "e.g. 8"]),
        (["--model", "800M", "--data-path", "/nonexistent/oscar_text_document"],
         ["/nonexistent/oscar_text_document.bin", "PREFIX.bin and PREFIX.idx"]),
        (["--model", "800M", "--hidden-size", "2050"],
         ["--hidden-size 2050 is not divisible by --num-attention-heads 8"]),
        (["--model", "800M", "--world-size", "2", "--tensor-parallel", "2", "--ffn-hidden-size", "8191",
          "--no-sequence-parallel"], ["--ffn-hidden-size 8191 is not divisible by --tensor-parallel 2"]),
        (["--model", "800M", "--world-size", "2", "--tensor-parallel", "2", "--sequence-parallel",
          "--seq-length", "2047"], ["--seq-length 2047 is not divisible by --tensor-parallel 2"]),
        (["--model", "800M", "--nodes", "2", "--devices-per-node", "4", "--world-size", "6"],
         ["--nodes 2 × --devices-per-node 4 = 8 is not --world-size 6"]),
    ],
)
def test_each_invalid_configuration_names_values_and_fix(capsys, args, expected):
    code, out, err = validate(capsys, *args)
    assert code == ExitCode.USAGE
    assert out == ""
    assert "Fix:" in err
    for text in expected:
        assert text in err


@pytest.mark.parametrize("option", ["--micro-batch-size", "--exit-duration-mins", "--world-size"])
def test_zero_is_refused_by_the_parser_with_the_option_named(capsys, option):
    with pytest.raises(SystemExit) as ended:
        validate(capsys, "--model", "800M", option, "0")
    assert ended.value.code == 2 and option in capsys.readouterr().err


def test_caraml_13b_layout_on_44_nodes_is_valid_and_reports_derived_batch(capsys):
    code, out, err = validate(capsys, "--model", "13B", "--caraml", "--nodes", "44", "--devices-per-node", "4")
    assert code == ExitCode.OK, err
    # CARAML: TP 2, PP 2, DP = 176/4 = 44, GBS = 128 per replica = 5632, MBS 2 -> 64 micro-batches.
    assert "TP 2 × PP 2 × DP 44" in out
    assert "GBS 5632 (64 micro-batches per replica)" in out
    assert "fp16" in out


def test_caraml_800m_profile_is_caramls_settings(capsys):
    code, out, _ = validate(capsys, "--model", "800M", "--caraml", "--world-size", "4")
    assert code == ExitCode.OK
    assert "fp16, MBS 4 (preset), GBS 32 (2 micro-batches per replica), recompute selective" in out


def test_default_800m_is_the_fastest_measured_setting(capsys):
    code, out, _ = validate(capsys, "--model", "800M")
    assert code == ExitCode.OK
    assert ("bf16, MBS 8 (preset: no device memory to choose by), GBS 64 (8 micro-batches per replica), "
            "recompute none") in out


def test_memory_estimate_refuses_with_estimate_capacity_and_a_fix_that_fits(capsys):
    code, _, err = validate(capsys, "--model", "175B", "--world-size", "64", "--tensor-parallel", "8",
                            "--pipeline-parallel", "8", "--micro-batch-size", "64", "--device-memory-gib", "80")
    assert code == ExitCode.USAGE
    assert "refused by the memory estimate" in err and "but the device has 80.0 GiB" in err
    assert "Fix: use --micro-batch-size " in err  # the largest smaller MBS whose estimate fits (test_memory_fix.py)
    code, _, err = validate(capsys, "--model", "800M", "--device-memory-gib", "80")
    assert code == ExitCode.OK and err == ""
    # Over the device by the estimate but within its measured overshoot (800M MBS 8 runs on 40 GB cards): a warning.
    code, _, err = validate(capsys, "--model", "800M", "--micro-batch-size", "8", "--device-memory-gib", "40")
    assert code == ExitCode.OK and "WARNING" in err and "but the device has 40.0 GiB" in err


H100_SXM_GIB = "79.6"  # what torch reports for an 80 GB H100 SXM (docs/llm_training.md)
GPT13B_ONE_NODE = ("--model", "13B", "--nodes", "1", "--devices-per-node", "4", "--device-memory-gib", H100_SXM_GIB)


def _estimate_gib(*args: str) -> float:
    from llm_training.cli import build_parser
    from llm_training.config import resolve
    from llm_training.memory import estimate_memory

    return estimate_memory(resolve(build_parser().parse_args(["train", "--model", "13B", *args]), 4)).total_gib


@pytest.mark.parametrize(("tp", "pp"), [("2", "2"), ("4", "1")])
def test_gpt13b_model_parallel_layouts_fit_a_4_gpu_80gb_node(capsys, tp, pp):
    code, out, err = validate(capsys, *GPT13B_ONE_NODE, "--tensor-parallel", tp, "--pipeline-parallel", pp)
    estimate = _estimate_gib("--tensor-parallel", tp, "--pipeline-parallel", pp)
    assert code == ExitCode.OK and err == ""
    assert f"world 4 = TP {tp} × PP {pp} × DP 1" in out and "GBS 128 (64 micro-batches per replica)" in out
    assert f"estimated {estimate:.1f} GiB/device of {H100_SXM_GIB} GiB" in out


def test_gpt13b_data_parallel_layout_is_refused_naming_estimate_capacity_and_the_layouts_that_fit(capsys):
    code, out, err = validate(capsys, *GPT13B_ONE_NODE, "--tensor-parallel", "2", "--pipeline-parallel", "1")
    estimate = _estimate_gib("--tensor-parallel", "2", "--pipeline-parallel", "1")
    assert code == ExitCode.USAGE and out == "" and estimate > float(H100_SXM_GIB)
    assert f"TP=2 PP=1 DP=2 MBS=2 bf16 recompute=selective needs about {estimate:.1f} GiB per device" in err
    assert f"but the device has {H100_SXM_GIB} GiB" in err
    fits = [f"--tensor-parallel {tp} --pipeline-parallel {pp} "
            f"({_estimate_gib('--tensor-parallel', tp, '--pipeline-parallel', pp):.1f} GiB)"
            for tp, pp in (("2", "2"), ("4", "1"))]
    assert "Fix: no MBS or recompute change fits" in err and all(fit in err for fit in fits)


def test_bf16_refused_on_pre_ampere_gpu_but_not_on_rocm_or_cpu():
    with pytest.raises(ValidationError, match=r"compute capability 7\.0.*Fix: use --precision fp16"):
        validation.check_precision("bf16", "cuda", (7, 0))
    validation.check_precision("bf16", "cuda", (9, 0))
    validation.check_precision("bf16", "cuda", (9, 0), is_rocm=True)
    validation.check_precision("fp16", "cuda", (7, 0))
    validation.check_precision("bf16", "cpu")


def test_gpu_only_attention_kernel_refused_on_cpu_before_any_work(capsys):
    code, _, err = validate(capsys, "--model", "tiny", "--device", "cpu", "--attention-backend", "cudnn")
    assert code == ExitCode.USAGE
    assert "--attention-backend cudnn on the CPU" in err and "Fix: use --attention-backend auto" in err
    validation.check_attention_backend("cudnn", "cuda")
    validation.check_attention_backend("math", "cpu")


def test_validate_process_exit_code_and_stderr(fake_env, tmp_path):
    result = run_cmd([*LLM, "validate", "--model", "800M", "--world-size", "3", "--tensor-parallel", "2"],
                     fake_env(), tmp_path, timeout=60)
    assert result.returncode == ExitCode.USAGE
    assert result.stderr.startswith("llm_training: error: world size 3 is not divisible")
