"""The compile caches (joulebench.compile_cache): a second process reuses the first one's compile, `none` leaves
nothing behind, and a directory that cannot hold the caches is refused by the drivers before any work.

The reuse test compiles a small model's training step (forward and backward) on the CPU in two processes
(inductor's C++ backend: no Triton kernels on a CPU, so only DIR/inductor fills) and reads inductor's own hit and miss
counters from each, and torch's compile timers around that first step (FirstStepCompile): where the seconds went.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from joulebench.compile_cache import ENV, NONE, check, default_dir
from jpwr import ValidationError
from jpwr.errors import ExitCode

REPO = Path(__file__).resolve().parent.parent
# One process: the caches of DIR, a small model's training step compiled and run once, then again; its cache lookups,
# the first step's seconds and torch's split of them.
COMPILE_ONCE = """
import json, sys, time
from joulebench.compile_cache import FirstStepCompile, check
cache = check(sys.argv[1])
cache.activate()
import torch
model = torch.compile(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)))
first = FirstStepCompile(triton=False)
step = first.wrap(lambda: model(torch.randn(4, 16)).sum().backward())
start = time.perf_counter()
step()
first_step_s = time.perf_counter() - start
step()  # not the first step: outside the split
print(json.dumps({**cache.figures(), "first_call_s": first_step_s, "phases": first.phases(first_step_s),
                  "autotune": first.autotune()}))
"""


def _compile_once(directory: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run([sys.executable, "-c", COMPILE_ONCE, str(directory)], capture_output=True, text=True,
                            env=env, cwd=REPO, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_a_second_process_loads_what_the_first_compiled(tmp_path: Path) -> None:
    cold = _compile_once(tmp_path / "cache")
    warm = _compile_once(tmp_path / "cache")
    timing = f"first call {cold['first_call_s']:.1f} s cold, {warm['first_call_s']:.1f} s warm"
    assert cold["dir"] == warm["dir"] == str(tmp_path / "cache")
    assert cold["fx_graph_misses"] >= 1 and cold["fx_graph_hits"] == 0, (cold, timing)
    assert warm["fx_graph_hits"] == cold["fx_graph_misses"] and warm["fx_graph_misses"] == 0, (warm, timing)
    assert warm["autograd_hits"] >= 1 and warm["autograd_misses"] == 0, (warm, timing)
    assert any((tmp_path / "cache" / "inductor").iterdir())  # what the first process left for the second
    for figures in (cold, warm):  # the split: torch's disjoint phases and the rest, the first step's seconds in all
        phases = figures["phases"]
        assert phases["triton_autotune"] is None and figures["autotune"] is None, figures  # no Triton on a CPU
        timed = [phases[name] for name in ("dynamo", "aot_autograd", "inductor", "cache_load")]
        assert min(timed) >= 0 and phases["rest"] >= 0, (phases, timing)
        assert sum(timed) + phases["rest"] == pytest.approx(figures["first_call_s"], abs=5e-3), (phases, timing)
        assert phases["dynamo"] > 0 and phases["aot_autograd"] > 0, (phases, timing)  # traced in both processes
    # cold: inductor compiled both graphs (the forward's, the backward's at the first backward), nothing was loaded;
    # warm: inductor did not run, the graphs came from the cache, and most of the cold first step was inductor's
    assert cold["phases"]["inductor"] > cold["phases"]["aot_autograd"] and cold["phases"]["cache_load"] == 0, cold
    assert warm["phases"]["inductor"] == 0 and warm["phases"]["cache_load"] > 0, (warm, timing)
    assert warm["first_call_s"] < cold["first_call_s"] - cold["phases"]["inductor"] / 2, timing


def test_none_is_a_fresh_directory_gone_at_the_process_exit(tmp_path: Path) -> None:
    code = "from joulebench.compile_cache import check; cache = check('none'); print(cache.directory, cache.root)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    directory, root = result.stdout.split()
    assert result.returncode == 0 and directory == "None"
    assert root.startswith(os.path.realpath(os.environ.get("TMPDIR", "/tmp"))) or "joulebench-compile-" in root
    assert not Path(root).exists()


def test_the_default_is_the_environment_then_the_per_user_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                                ) -> None:
    monkeypatch.setenv(ENV, str(tmp_path / "node-local"))
    assert default_dir() == str(tmp_path / "node-local")
    assert check(None).directory == tmp_path / "node-local" and (tmp_path / "node-local").is_dir()
    monkeypatch.delenv(ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_dir() == str(tmp_path / "xdg" / "joulebench" / "compile")
    assert check(str(tmp_path / "given")).root == tmp_path / "given"  # the option wins over both
    monkeypatch.setenv(ENV, NONE)  # a cold run asked for by the environment (a JUBE profile)
    cold = check(None)
    assert cold.directory is None and cold.root.is_dir() and not any(cold.root.iterdir())
    shutil.rmtree(cold.root)  # at this process's exit otherwise: after the session's check for what tests left behind


@pytest.mark.parametrize("inside", [False, True])
def test_a_path_that_cannot_hold_the_caches_is_refused(tmp_path: Path, inside: bool) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(ValidationError) as refused:
        check(str(blocker / "cache" if inside else blocker))
    problem = "cannot be created" if inside else "is a file, not a directory"
    assert problem in str(refused.value) and "--compile-cache" in refused.value.fix and NONE in refused.value.fix


def _refused(capsys: pytest.CaptureFixture, code: int, *fragments: str) -> None:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "Fix:" in line]
    assert code == ExitCode.USAGE and len(lines) == 1, err
    for fragment in fragments:
        assert fragment in lines[0], err


def test_the_drivers_refuse_a_file_before_any_work(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from llm_training.cli import main as llm_main
    from resnet50.cli import main as resnet_main

    blocker = tmp_path / "a-file"
    blocker.write_text("")
    out = tmp_path / "out"
    code = resnet_main(["train", "--framework", "pytorch", "--device", "cpu", "--compile", "--compile-cache",
                        str(blocker), "--out-dir", str(out / "resnet")])
    _refused(capsys, code, f"--compile-cache {blocker} is a file")
    code = llm_main(["train", "--model", "tiny", "--device", "cpu", "--rope-fusion", "--compile-cache", str(blocker),
                     "--out-dir", str(out / "llm")])
    _refused(capsys, code, f"--compile-cache {blocker} is a file")
    assert not list(out.rglob("run_record.json"))


def test_a_cache_where_nothing_compiles_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from llm_inference.cli import main as inference_main
    from llm_training.cli import main as llm_main
    from resnet50.cli import main as resnet_main

    cache = str(tmp_path / "cache")
    _refused(capsys, resnet_main(["validate", "--framework", "pytorch", "--device", "cpu", "--compile-cache", cache]),
             "--compile-cache without compilation", "add --compile, or drop --compile-cache")
    _refused(capsys, llm_main(["validate", "--model", "tiny", "--device", "cpu", "--compile-cache", cache]),
             "nothing is compiled on the cpu", "drop --compile-cache")
    _refused(capsys, inference_main(["run", "--preset", "tiny", "--device", "cpu", "--compile-cache", cache,
                                     "--out-dir", str(tmp_path / "inference")]),
             "the decode is compiled on GPUs only")
