#!/usr/bin/env bash
# The test command (README, .ci/run): installs what the tests need, then lint and the whole suite.
#
#     bash tests/run.sh [pytest options...]          e.g. bash tests/run.sh tests/jpwr -x
#
# - <repo>/.venv made ready by tests/venv.sh: created if missing, the pinned CPU-capable torch only where it has none
#   (CI), a torch and torchvision that import together never changed, a pair that does not named with its fix
#   (exit 69, nothing installed); then joulebench with every extra the tests use. No GPU is needed: vendor libraries
#   are replaced by the fakes in tests/fakes.
# - System packages are not installed here: the JUBE/Slurm workflow tests need JUBE, Slurm, munge and
#   xmllint (`sh jube/ci-setup.sh` as root, what CI does) and are skipped with that reason without them.
# - Then ruff, mypy (pyproject.toml [tool.mypy]: the meter, the core, the drivers, jube/, benchmarks/) and pytest.
# Idempotent: a second run reuses the venv and its packages.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tests/venv.sh .venv
missing=""
for tool in jube slurmctld munged xmllint; do command -v "$tool" >/dev/null || missing="$missing $tool"; done
[ -z "$missing" ] || echo "tests/run.sh: not installed:$missing; the JUBE/Slurm workflow tests will be skipped" \
    "(install them with: sudo sh jube/ci-setup.sh)" >&2
.venv/bin/ruff check .
.venv/bin/python -m mypy  # files, flags and third-party policy: pyproject.toml
# Three workers on CI's 2 cores (pytest-xdist; many tests wait on subprocesses; four were 13 % faster once on a 2-core
# machine, 2026-12-01, but their load failed two timing tests in the next run); tests/conftest.py keeps the tests that
# share a module fixture, and those of the local Slurm clusters, on one worker and prints each file's time and CPU
# time at the end.
# `-n 0`: one process.
.venv/bin/python -m pytest -q -ra -n 3 "$@"
