"""The inference workflow's software energy knobs (issue 46): the decode variant and the objective are sweep
dimensions that reach the driver as its options, each with its own column."""

from __future__ import annotations

import re
import shlex

import pytest

from tests.jube.test_profile import CLEAN_ENV, jbprofile


def _args(settings: dict[str, str]) -> list[str]:
    return shlex.split(settings["JB_TRAIN_ARGS"])


def test_decode_tuning_and_objective_reach_a_static_point() -> None:
    settings = jbprofile.build_settings("inference", [], {"decode_tuning": "auto", "objective": "energy"}, "r",
                                        CLEAN_ENV)
    args = _args(settings)
    assert args[args.index("--decode-tuning") + 1] == "auto" and args[args.index("--objective") + 1] == "energy"
    assert (settings["JB_COORD_DECODE_TUNING"], settings["JB_COORD_OBJECTIVE"]) == ("auto", "energy")
    default = _args(jbprofile.build_settings("inference", [], {"decode_tuning": "", "objective": ""}, "r", CLEAN_ENV))
    assert "--decode-tuning" not in default and "--objective" not in default  # empty: the driver's default


def test_a_serving_point_takes_the_decode_variant_and_ignores_the_objective() -> None:
    settings = jbprofile.build_settings("inference", [], {"rate": "2", "decode_tuning": "default",
                                                          "objective": "energy"}, "r", CLEAN_ENV)
    args = _args(settings)
    assert args[args.index("--decode-tuning") + 1] == "default" and "--objective" not in args
    assert settings["JB_COORD_OBJECTIVE"] == "-"  # the other mode's parameter
    assert "objective=energy ignored: a serving point (rate set)" in settings["JB_NOTE"]


def test_the_compile_mode_reaches_a_pytorch_point_and_a_tensorflow_point_is_refused() -> None:
    settings = jbprofile.build_settings("resnet50", [], {"framework": "pytorch", "compile_mode": "max-autotune"}, "r",
                                        CLEAN_ENV)
    args = _args(settings)
    assert args[args.index("--compile-mode") + 1] == "max-autotune"
    assert settings["JB_COORD_COMPILE_MODE"] == "max-autotune"
    assert "--compile-mode" not in _args(jbprofile.build_settings("resnet50", [], {"framework": "pytorch",
                                                                                 "compile_mode": ""}, "r", CLEAN_ENV))
    why = "compile_mode=default with framework=tensorflow: the compile mode is torch.compile's"
    with pytest.raises(jbprofile.PointRefused, match=re.escape(why)):
        jbprofile.build_settings("resnet50", [], {"framework": "tensorflow", "compile_mode": "default"}, "r",
                                 CLEAN_ENV)


def test_a_server_point_takes_no_admit_divisor_and_says_so(tmp_path) -> None:
    """The prefill/decode interleave (--admit-divisor) is the in-process engine's: a server's point leaves it out, its
    coordinate `-` and a note, where the engine's point passes it (a sweep over both engines must not fail there)."""
    env = {**CLEAN_ENV, "JOULEBENCH_INFERENCE_CHECKPOINT": str(tmp_path)}
    engine = jbprofile.build_settings("inference", [], {"rate": "2", "admit_divisor": "8"}, "r", env)
    assert _args(engine)[_args(engine).index("--admit-divisor") + 1] == "8" and engine["JB_COORD_ADMIT_DIVISOR"] == "8"
    server = jbprofile.build_settings("inference", [], {"rate": "2", "admit_divisor": "8", "engine": "vllm"}, "r", env)
    assert "--admit-divisor" not in _args(server) and "--server-command" in _args(server)
    assert server["JB_COORD_ADMIT_DIVISOR"] == "-"
    assert "admit_divisor=8 ignored: the in-process engine's option, and vllm is a server" in server["JB_NOTE"]
