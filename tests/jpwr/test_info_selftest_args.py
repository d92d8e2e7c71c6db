"""`jpwr info` and `jpwr selftest` on inputs that once gave wrong or no answers: no read cost for reads never made,
and burst periods checked before the GPU check (a 0 or negative period looped for ever, an empty one was an
internal error), as are the aliasing modes' options."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from jpwr import cli
from jpwr.errors import ExitCode


def _info(args: list[str], env: dict[str, str], cwd) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "jpwr", "info", "--methods", "nvml", *args], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=120)


def _sensor_lines(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if "read cost" in line]


def test_info_without_probing_says_n_a_for_the_read_cost(fake_env, h100_trace_dir, tmp_path):
    result = _info(["--probe-seconds", "0"], fake_env(JPWR_FAKE_NVML_TRACE=str(h100_trace_dir)), tmp_path)
    assert result.returncode == 0, result.stderr
    lines = _sensor_lines(result.stdout)
    assert lines, result.stdout  # the fake H100's sensors are listed
    for line in lines:
        assert re.search(r"read cost +n/a ", line) and "not probed: --probe-seconds 0" in line, line
        assert " us " not in line, line  # no cost printed for reads never made


def test_info_with_probing_states_a_measured_read_cost(fake_env, h100_trace_dir, tmp_path):
    result = _info(["--probe-seconds", "0.05"], fake_env(JPWR_FAKE_NVML_TRACE=str(h100_trace_dir)), tmp_path)
    assert result.returncode == 0, result.stderr
    costs = [re.search(r"read cost +([0-9.]+) us", line) for line in _sensor_lines(result.stdout)]
    assert costs and all(c is not None and float(c.group(1)) > 0 for c in costs), result.stdout


@pytest.mark.parametrize(("periods", "named"), [
    ("0", "item 1: 0 is out of range"),
    ("37,-5,250", "item 2: -5 is out of range"),
    ("37,,250", "item 2 is empty"),
    ("", "item 1 is empty"),
    ("37,soon", "item 2: 'soon' is not a number"),
    ("37,5000", "item 2: 5000 is out of range"),  # longer than the 4 s window
    ("100,100", "item 2: 100 is given twice"),
])
def test_selftest_refuses_bad_burst_periods_before_the_gpu_check(periods, named, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # reaching the GPU check would answer 69 (no PyTorch)
    code = cli.main(["selftest", f"--periods-ms={periods}"])
    err = capsys.readouterr().err
    assert code == ExitCode.USAGE, err
    assert named in err and f"--periods-ms {periods!r}" in err and "Fix:" in err and "--periods-ms 37,100,250" in err


@pytest.mark.parametrize(("option", "named", "fix"), [
    ("--modes=random,sideways", "--modes 'random,sideways', item 2: 'sideways' is not a mode", "--modes random,locked"),
    ("--modes=locked,locked", "item 2: locked is given twice", "--modes random,locked"),
    ("--detune-pct=-3,0", "--detune-pct '-3,0', item 2: 0 is the locked mode", "--detune-pct=-3,-1,1,3"),
    ("--detune-pct=1,,3", "item 2 is empty", "--detune-pct=-3,-1,1,3"),
    ("--detune-pct=80", "item 1: 80 is out of range", "--detune-pct=-3,-1,1,3"),
    ("--multiples=1", "--multiples '1', item 1: 1 is out of range", "--multiples 2"),
    ("--multiples=2,2", "item 2: 2 is given twice", "--multiples 2"),
])
def test_selftest_refuses_bad_mode_options_before_the_gpu_check(option, named, fix, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)
    code = cli.main(["selftest", option])
    err = capsys.readouterr().err
    assert code == ExitCode.USAGE, err
    assert named in err and "Fix:" in err and fix in err


def test_selftest_passes_good_periods_on_to_the_gpu_check(tmp_path):
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # no GPU: the check after parsing answers, nothing runs
    result = subprocess.run([sys.executable, "-m", "jpwr", "selftest", "--periods-ms", " 37, 100 ,250",
                             "--modes", "random, locked", "--detune-pct=-1, 2", "--multiples", "2,3",
                             "--out", str(tmp_path / "s")], env=env, cwd=tmp_path, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == ExitCode.UNAVAILABLE, result.stderr
    assert "no CUDA/ROCm GPU visible" in result.stdout or "needs PyTorch" in result.stdout
