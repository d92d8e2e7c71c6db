"""Memory before work (issue 32 item 6).

On the CPU, validate compares the drivers' memory estimates with MemAvailable and refuses (exit 64) what the
kernel's out-of-memory killer would end mid-run; the meminfo file is the OS boundary, replaced here by a fake one
through JOULEBENCH_MEMINFO. A process killed by SIGKILL cannot say why it ended; its parent names the signal:
`jpwr -- CMD` (a real child killed by SIGKILL here) and the JUBE job (tests/jube/test_record_fields.py).
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from joulebench.host_memory import MEMINFO_ENV, available_gib

TINY_MEMINFO = "MemTotal:       16384 kB\nMemFree:         8192 kB\nMemAvailable:    4096 kB\n"  # 4 MiB available
PLENTY_MEMINFO = "MemTotal:   1073741824 kB\nMemAvailable:   1073741824 kB\n"  # 1 TiB


@pytest.fixture
def meminfo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    def use(text: str | bytes) -> Path:
        path = tmp_path / "meminfo"
        path.write_bytes(text if isinstance(text, bytes) else text.encode())
        monkeypatch.setenv(MEMINFO_ENV, str(path))
        return path

    return use


@pytest.mark.parametrize(("command", "argv", "said"), [
    ("llm_training", ["validate", "--model", "tiny", "--device", "cpu"], "--micro-batch-size"),
    ("llm_training", ["validate", "--model", "tiny", "--device", "cpu", "--nodes", "1", "--devices-per-node", "2",
                      "--global-batch-size", "8"], "(2 ranks × "),
    ("llm_inference", ["validate", "--preset", "tiny", "--device", "cpu"], "smaller model"),
    ("llm_inference", ["validate-load", "--preset", "tiny", "--device", "cpu", "--rate", "1"], "smaller model"),
])
def test_validate_on_the_cpu_refuses_an_estimate_above_mem_available(command: str, argv: list[str], said: str,
                                                                     meminfo, capsys) -> None:
    from llm_inference.cli import main as inference
    from llm_training.cli import main as training

    main = {"llm_training": training, "llm_inference": inference}[command]
    meminfo(TINY_MEMINFO)
    assert main(argv) == 64
    err = capsys.readouterr().err
    assert "GiB" in err and "this host (MemAvailable) has 0.0 GiB" in err and "Fix:" in err and said in err, err
    meminfo(PLENTY_MEMINFO)
    assert main(argv) == 0, capsys.readouterr().err
    capsys.readouterr()


def test_an_accelerator_configuration_is_not_held_to_the_host(meminfo, capsys) -> None:
    from llm_training.cli import main as training

    meminfo(TINY_MEMINFO)
    assert training(["validate", "--model", "tiny", "--device", "cuda", "--precision", "bf16"]) == 0
    capsys.readouterr()


@pytest.mark.parametrize("content", [b"", b"MemTotal: 1 kB\n", b"MemAvailable: lots\n", b"\xff\xfe\x00garbage",
                                     b"MemAvailable: 12 MB\n"])
def test_an_unreadable_meminfo_means_no_check_not_a_guess(content: bytes, meminfo) -> None:
    meminfo(content)
    assert available_gib() is None


def test_meminfo_is_read_in_gib(meminfo, monkeypatch: pytest.MonkeyPatch) -> None:
    meminfo("MemTotal: 4194304 kB\nMemAvailable:    2097152 kB\n")
    assert available_gib() == 2.0
    monkeypatch.setenv(MEMINFO_ENV, "/nonexistent/meminfo")
    assert available_gib() is None


def test_a_command_killed_by_sigkill_under_jpwr_is_named_as_probably_out_of_memory(fake_env, tmp_path) -> None:
    result = subprocess.run([sys.executable, "-m", "jpwr", "--out", str(tmp_path / "o"), "--", "sh", "-c",
                             "kill -9 $$"], env=fake_env(), cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert result.returncode == 128 + 9, result.stderr
    assert "jpwr: sh was killed by signal 9 (out of memory?)" in result.stderr
    ended = subprocess.run([sys.executable, "-m", "jpwr", "--out", str(tmp_path / "t"), "--", "sh", "-c",
                            "kill -TERM $$"], env=fake_env(), cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert ended.returncode == 128 + 15 and "killed by signal 15 (SIGTERM)" in ended.stderr
    assert "out of memory" not in ended.stderr


# ---- issue 61: validate is the run's own check, through JUBE's --device auto too --------------------------------
@pytest.fixture
def no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """A host without a visible GPU (the driver's boundary: torch sees no CUDA device)."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    import torch

    if torch.cuda.is_available():
        pytest.skip("torch sees a GPU here despite CUDA_VISIBLE_DEVICES=''")


@pytest.mark.parametrize(("command", "argv"), [
    ("llm_training", ["validate", "--model", "tiny", "--world-size", "64", "--nodes", "1", "--devices-per-node",
                      "64", "--global-batch-size", "128"]),
    ("llm_inference", ["validate", "--preset", "tiny"]),
    ("llm_inference", ["validate-load", "--preset", "tiny", "--rate", "1"]),
])
def test_validate_device_auto_on_a_host_without_gpu_is_held_to_its_memory_as_the_run_is(command, argv, meminfo,
                                                                                        no_gpu, capsys) -> None:
    """JUBE's validate passes --device auto (its default): on a 2-core host without a GPU, 64 ranks passed it, since
    only --device cpu checked the host's memory, and the run then ran on the CPU. `auto` is resolved as the run
    resolves it."""
    from llm_inference.cli import main as inference
    from llm_training.cli import main as training

    main = {"llm_training": training, "llm_inference": inference}[command]
    meminfo(TINY_MEMINFO)
    assert main([*argv, "--device", "auto"]) == 64
    err = capsys.readouterr().err
    assert "this host (MemAvailable) has 0.0 GiB" in err and "Traceback" not in err, err
    assert main([*argv, "--device", "cpu"]) == 64 and capsys.readouterr().err == err  # the same check, word for word


def test_the_run_refuses_what_validate_refuses_before_its_framework_loads(meminfo, no_gpu, tmp_path, capsys) -> None:
    from llm_training.cli import main as training

    meminfo(TINY_MEMINFO)
    assert training(["validate", "--model", "tiny"]) == 64
    refused = capsys.readouterr().err
    assert training(["train", "--model", "tiny", "--out-dir", str(tmp_path / "run")]) == 64
    assert capsys.readouterr().err == refused
    assert not (tmp_path / "run" / "run_record.json").exists()


def test_jube_validates_a_slurm_point_of_device_auto_for_its_nodes_not_the_login_node(tmp_path) -> None:
    from tests.jube.test_profile import _fake_tool, jbprofile

    env = _fake_tool(tmp_path, "sbatch", "")
    slurm = shlex.split(jbprofile.build_settings("llm", ["H100", "800M"], {}, "run", env)["JB_VALIDATE_ARGS"])
    assert slurm[slurm.index("--device") + 1] == "cuda"  # the nodes' GPUs: validate runs on the login node
    train = shlex.split(jbprofile.build_settings("llm", ["H100", "800M"], {}, "run", env)["JB_TRAIN_ARGS"])
    assert train[train.index("--device") + 1] == "cuda"  # a GPU profile's run on CPU nodes fails, never reads OK


@pytest.mark.parametrize(("argv", "said"), [
    (["--rate", "max", "--requests", "1", "--max-concurrency", "8"],
     "--requests 1 at --rate max never keeps the 8 rows busy at once after the warm-up: the window would never open"),
    (["--trace", "{trace}", "--warmup-requests", "2"],
     "has 2 requests and --warmup-requests 2 takes them all: no counted request opens the window"),
])
def test_a_load_too_short_to_open_its_window_is_refused_by_validate_and_the_run(argv, said, tmp_path, capsys) -> None:
    from llm_inference.cli import main as inference

    trace = tmp_path / "t.jsonl"
    trace.write_text('{"arrival_s": 0, "input_tokens": 4, "output_tokens": 2}\n' * 2)
    argv = [a.replace("{trace}", str(trace)) for a in argv]
    for command in ("validate-load", "load"):
        assert inference([command, "--preset", "tiny", "--task", "tiny", "--device", "cpu", *argv,
                          "--out-dir", str(tmp_path / "run")]) == 64
        assert said in capsys.readouterr().err
    assert not (tmp_path / "run" / "run_record.json").exists()
