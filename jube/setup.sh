#!/bin/sh
# One-time set-up on a fresh Debian/Ubuntu machine (quick start, step 1 of 2):
#   - JUBE from the distribution (apt-get install jube; Debian 12 ships 2.5.1) unless a `jube` is on PATH,
#   - <repo>/.venv with joulebench and its training extras (a venv: Debian's system Python is
#     "externally managed", PEP 668, so pip must not install there),
#   - .venv/bin/jube, so that `.venv/bin/jube run ...` works; the workflows find .venv/bin/python
#     themselves (python = auto in jube/systems.ini).
# Environment: JOULEBENCH_EXTRAS (default llm,resnet-pytorch, plus nvidia where nvidia-smi exists;
#              add resnet-tensorflow for TF),
#              PIP_INDEX_URL / PIP_EXTRA_INDEX_URL as usual (e.g. PyTorch's CPU wheel index).
set -eu
repo=$(cd "$(dirname "$0")/.." && pwd)
default_extras=llm,resnet-pytorch
command -v nvidia-smi >/dev/null && default_extras=$default_extras,nvidia  # pynvml for jpwr's sampler
extras=${JOULEBENCH_EXTRAS-$default_extras}

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"
    elif command -v sudo >/dev/null; then sudo "$@"
    else echo "setup: need root or sudo for: $*" >&2; exit 1
    fi
}

missing=""
command -v jube >/dev/null || missing="$missing jube"
python3 -c 'import ensurepip, venv' 2>/dev/null || missing="$missing python3-venv"
if [ -n "$missing" ]; then
    echo "setup: installing$missing with apt-get" >&2
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update
    # shellcheck disable=SC2086
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $missing
fi

[ -x "$repo/.venv/bin/python" ] || python3 -m venv "$repo/.venv"
"$repo/.venv/bin/python" -m pip install --quiet --upgrade pip
if [ -n "$extras" ]; then
    "$repo/.venv/bin/python" -m pip install --quiet -e "$repo[$extras]"
else
    "$repo/.venv/bin/python" -m pip install --quiet -e "$repo"
fi
ln -sf "$(command -v jube)" "$repo/.venv/bin/jube"
echo "setup: done. $("$repo/.venv/bin/jube" --version 2>&1); joulebench in $repo/.venv" >&2
echo "next: .venv/bin/jube run jube/llm_benchmark.xml -e -a -r" >&2
