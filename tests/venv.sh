#!/usr/bin/env bash
# The test command's venv (tests/run.sh runs it first): VENV made ready for the tests, its torch never changed.
#
#     bash tests/venv.sh VENV
#
# - VENV is created if missing (a venv: Debian's system Python refuses pip, PEP 668).
# - A VENV without torch gets the CPU-capable pinned build CI uses (torch 2.14.1, torchvision 0.29.1).
# - A VENV whose torch and torchvision import together keeps them: the extras are installed under a constraint of
#   exactly those versions, so pip stops with its conflict instead of replacing them.
# - A VENV whose torch does not import, or whose torchvision does not import beside it (a CUDA torchvision from PyPI
#   beside a CPU torch: `operator torchvision::nms does not exist`), is left as it is: this says so, names the fix
#   (`joulebench doctor`'s) and exits 69. Installing the pinned build there replaced a 1.1 GB CPU venv's torch with
#   PyPI's CUDA build (7.6 GB).
# - Then joulebench with every extra the tests use (test, nvidia, llm, resnet-pytorch, resnet-tensorflow-cpu,
#   inference, serving, reports, tensorboard, mlflow, wandb).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
venv=$1
python=$venv/bin/python
export PIP_DISABLE_PIP_VERSION_CHECK=1
[ -x "$python" ] || python3 -m venv "$venv"
if ! "$python" -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("torch") is None)'; then
    echo "tests/venv.sh: no torch in $venv: installing the pinned CPU-capable build (torch 2.14.1, torchvision 0.29.1)" >&2
    "$python" -m pip install -q torch==2.14.1 torchvision==0.29.1
elif ! error=$("$python" -c 'import torch, torchvision' 2>&1); then
    fix=$(PYTHONPATH=$repo "$python" -c 'from joulebench.analysis.doctor import pair_fix, version
print(pair_fix(version("torch")))' 2>/dev/null) || fix="reinstall torch and torchvision from one index (README's Install)"
    echo "tests/venv.sh: error: torch and torchvision of $venv do not import together (${error##*$'\n'});" \
         "the test command leaves a venv's torch as it is. Fix: $fix; then run the test command again" \
         "($venv/bin/joulebench doctor checks the whole install)" |
        if [ -t 2 ]; then fold -s -w 160; else cat; fi >&2  # one line in a log, 160 columns on a terminal
    exit 69
fi
constraints=$(mktemp)
trap 'rm -f "$constraints"' EXIT
"$python" - >"$constraints" <<'EOF'
import importlib.metadata
for name in ("torch", "torchvision"):
    try:
        print(f"{name}=={importlib.metadata.version(name)}")
    except importlib.metadata.PackageNotFoundError:
        pass
EOF
"$python" -m pip install -q -c "$constraints" \
    -e "$repo[test,nvidia,llm,resnet-pytorch,resnet-tensorflow-cpu,inference,serving,reports,tensorboard,mlflow,wandb]"
