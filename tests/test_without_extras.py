"""Every command line's --help, and the message for a missing extra, in a venv holding only numpy and h5py.

The honest check for "works without the optional extras": a fresh venv (no pip, no system site-packages)
whose only third-party packages are the two base dependencies, linked from this interpreter's install.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import venv
from pathlib import Path

import h5py
import numpy
import pytest

REPO = Path(__file__).resolve().parents[1]
CLI = {"jpwr": "jpwr.cli", "joulebench": "joulebench.analysis.cli", "llm_training": "llm_training.cli",
       "resnet50": "resnet50.cli", "llm_inference": "llm_inference.cli"}
HELP = [
    ["jpwr", "--help"], *(["jpwr", verb, "--help"] for verb in ("serve", "combine", "info", "selftest", "qualify")),
    ["joulebench", "--help"], *(["joulebench", verb, "--help"] for verb in ("plot", "report")),
    *(["llm_training", verb, "--help"] for verb in ("train", "validate", "preprocess")),
    *(["resnet50", verb, "--help"] for verb in ("train", "validate", "make-data")),
    *(["llm_inference", verb, "--help"] for verb in ("run", "validate")),
]
# A command that needs an extra, and the extra its message must name (None: it needs none).
NEEDS = [
    (["llm_training", "train", "--model", "tiny", "--device", "cpu", "--iterations", "2"], "joulebench[llm]"),
    (["llm_training", "preprocess", "--input", "x.jsonl", "--output-prefix", "y"], "joulebench[llm]"),
    (["llm_inference", "run", "--preset", "tiny", "--device", "cpu"], "joulebench[inference]"),
    (["resnet50", "train", "--framework", "pytorch", "--device", "cpu"], "joulebench[resnet-pytorch]"),
    (["jpwr", "--out", "o", "--", "true"], None),  # meters nothing here, but writes a trace to plot
    (["joulebench", "plot", "o", "-o", "trace.png"], "joulebench[reports]"),
    (["jpwr", "--methods", "nvml", "--", "true"], "joulebench[nvidia]"),
]
SCRIPT = """
import contextlib, importlib, io, json, sys
results = []
for argv in json.loads(sys.argv[1]):
    main = importlib.import_module(CLI[argv[0]]).main
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv[1:])
        except SystemExit as exc:
            code = exc.code
    results.append([code, out.getvalue(), err.getvalue()])
print(json.dumps(results))
"""


def _env() -> dict[str, str]:
    return {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory) -> Path:
    env_dir = tmp_path_factory.mktemp("bare") / "venv"
    venv.EnvBuilder(with_pip=False, system_site_packages=False, symlinks=True).create(env_dir)
    python = env_dir / "bin" / "python"
    site = Path(subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    for module in (numpy, h5py):
        package = Path(module.__file__).parent
        for item in [package, *package.parent.glob(f"{package.name}.libs")]:
            (site / item.name).symlink_to(item)
    return python


def _run(python: Path, commands: list[list[str]], cwd: Path) -> list[tuple[int, str, str]]:
    import json

    script = f"CLI = {CLI!r}\n{SCRIPT}"
    result = subprocess.run([python, "-c", script, json.dumps(commands)], cwd=cwd, capture_output=True, text=True,
                            env=_env(), timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    return [tuple(r) for r in json.loads(result.stdout.splitlines()[-1])]


def test_the_bare_venv_really_lacks_the_extras(bare_python):
    probe = "import importlib.util as u; print([m for m in ('torch', 'matplotlib', 'pandas', 'transformers', " \
            "'megatron', 'pynvml', 'tensorflow') if u.find_spec(m)])"
    assert subprocess.run([bare_python, "-c", probe], capture_output=True, text=True).stdout.strip() == "[]"


def test_every_help_works_without_optional_extras(bare_python, tmp_path):
    for argv, (code, out, err) in zip(HELP, _run(bare_python, HELP, tmp_path), strict=True):
        assert code == 0 and "usage:" in out, (argv, err[-2000:])


def test_jpwr_plot_and_report_help_forward_without_extras(bare_python, tmp_path):
    for verb in ("plot", "report"):  # `jpwr VERB` forwards to `joulebench VERB` in a new process
        result = subprocess.run([bare_python, "-m", "jpwr", verb, "--help"], cwd=tmp_path, capture_output=True,
                                text=True, env=_env(), timeout=120)
        assert result.returncode == 0 and "usage:" in result.stdout, result.stderr[-2000:]


def test_a_missing_extra_names_what_to_install(bare_python, tmp_path):
    for (argv, extra), (code, _, err) in zip(NEEDS, _run(bare_python, [a for a, _ in NEEDS], tmp_path), strict=True):
        if extra is None:
            assert code == 0, (argv, err[-2000:])
            continue
        assert code in (64, 69), (argv, err[-2000:])
        assert f"pip install '{extra}'" in err and "Traceback" not in err, (argv, err[-2000:])


def test_log_to_without_its_extra_names_the_pip_install_before_any_work(bare_python, tmp_path):
    commands = [["llm_training", "validate", "--model", "tiny", "--log-to", "tensorboard,mlflow"],
                ["resnet50", "train", "--framework", "pytorch", "--device", "cpu", "--log-to", "mlflow"],
                ["llm_inference", "run", "--preset", "tiny", "--device", "cpu", "--log-to", "wandb"]]
    for argv, (code, _, err) in zip(commands, _run(bare_python, commands, tmp_path), strict=True):
        extra = argv[-1].split(",")[0]
        assert code == 2 and f"--log-to {extra} needs the {extra} package: pip install 'joulebench[{extra}]'" in err, (
            argv, err[-2000:])
        assert "Traceback" not in err and not (tmp_path / "runs").exists()


def test_log_to_mlflow_without_the_sqlite_stores_packages_names_the_pip_install(tmp_path):
    """mlflow-skinny alone (found, not imported) on an isolated path without sqlalchemy and alembic."""
    spec = importlib.util.find_spec("mlflow")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("mlflow is not installed")
    (tmp_path / "mlflow").symlink_to(spec.submodule_search_locations[0])
    probe = (f"import os, sys; sys.path[:0] = [{str(REPO)!r}, {str(tmp_path)!r}]\n"
             "from joulebench.exports.targets import missing_extra\n"
             "print(missing_extra('mlflow')); os.environ['MLFLOW_TRACKING_URI'] = 'http://tracking:5000'\n"
             "print(missing_extra('mlflow'))")
    out = subprocess.run([sys.executable, "-I", "-S", "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == ["--log-to mlflow without MLFLOW_TRACKING_URI (a local SQLite store) needs the "
                                "sqlalchemy and alembic package(s): pip install 'joulebench[mlflow]'", "None"]
