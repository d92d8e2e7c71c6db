"""Memory before work (issue 32 item 6).

On the CPU, validate compares the drivers' memory estimates with MemAvailable and refuses (exit 64) what the
kernel's out-of-memory killer would end mid-run; the meminfo file is the OS boundary, replaced here by a fake one
through JOULEBENCH_MEMINFO. A process killed by SIGKILL cannot say why it ended; its parent names the signal:
`jpwr -- CMD` (a real child killed by SIGKILL here) and the JUBE job (tests/jube/test_record_fields.py).
"""

from __future__ import annotations

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
