#!/usr/bin/env bash
# The test command (README, .ci/run): installs what the tests need, then lint and the whole suite.
#
#     bash tests/run.sh [pytest options...]          e.g. bash tests/run.sh tests/jpwr -x
#
# - <repo>/.venv, created if missing (a venv: Debian's system Python refuses pip, PEP 668), with torch and
#   torchvision unless they import already (the CPU-capable pinned build CI uses; a site's own torch stays),
#   then joulebench with every extra the tests use (test, nvidia, llm, resnet-pytorch, resnet-tensorflow-cpu,
#   inference, serving, reports, tensorboard, mlflow, wandb). No GPU is needed: vendor libraries are replaced by the fakes in tests/fakes.
# - System packages are not installed here: the JUBE/Slurm workflow tests need JUBE, Slurm, munge and
#   xmllint (`sh jube/ci-setup.sh` as root, what CI does) and are skipped with that reason without them.
# - Then ruff, mypy (pyproject.toml [tool.mypy]: jpwr, joulebench, the three drivers) and pytest.
# Idempotent: a second run reuses the venv and its packages.
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1
[ -x .venv/bin/python ] || python3 -m venv .venv
if ! .venv/bin/python -c 'import torch, torchvision' 2>/dev/null; then
    .venv/bin/python -m pip install -q torch==2.14.1 torchvision==0.29.1
fi
.venv/bin/python -m pip install -q -e ".[test,nvidia,llm,resnet-pytorch,resnet-tensorflow-cpu,inference,serving,reports,tensorboard,mlflow,wandb]"
missing=""
for tool in jube slurmctld munged xmllint; do command -v "$tool" >/dev/null || missing="$missing $tool"; done
[ -z "$missing" ] || echo "tests/run.sh: not installed:$missing; the JUBE/Slurm workflow tests will be skipped" \
    "(install them with: sudo sh jube/ci-setup.sh)" >&2
.venv/bin/ruff check .
.venv/bin/python -m mypy  # the meter, the core and the drivers; files, flags and third-party policy: pyproject.toml
# Three workers on CI's 2 cores (pytest-xdist; many tests wait on subprocesses; four were 13 % faster once on a 2-core
# machine, 2026-12-01, but their load failed two timing tests in the next run); tests/conftest.py keeps the tests that
# share a module fixture, and those of the local Slurm clusters, on one worker and prints each file's time and CPU
# time at the end.
# `-n 0`: one process.
.venv/bin/python -m pytest -q -ra -n 3 "$@"
