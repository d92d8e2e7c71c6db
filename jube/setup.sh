#!/bin/sh
# One-time set-up on a fresh Debian/Ubuntu machine (quick start, step 1 of 2):
#   - JUBE from the distribution (apt-get install jube; Debian 12 ships 2.5.1) unless a `jube` is on PATH,
#   - <repo>/.venv with torch and joulebench with its training extras (a venv: Debian's system Python is
#     "externally managed", PEP 668, so pip must not install there),
#   - .venv/bin/jube, so that `.venv/bin/jube run ...` works; the workflows find .venv/bin/python
#     themselves (python = auto in jube/systems.ini);
#   - last, `joulebench doctor` in the venv: each problem of the install with its fix (a torch/torchvision pair that
#     does not import, a missing extra, no sensor, no Slurm). Its findings are printed, not this script's exit code:
#     the install itself is done; the "next:" line says to fix what it marks FIX first.
#
#     sh jube/setup.sh [--dry-run]     # --dry-run: say which index torch would come from, and why; change nothing
#
# torch: without a GPU (no nvidia-smi, no rocm-smi) from PyTorch's CPU wheel index (a venv of about 1.1 GB instead
# of 5.6 GB with the CUDA build; README's Install says what was measured), unless that index cannot be reached:
# then from pip's default index, saying so. A site's PIP_INDEX_URL always wins; a torch that imports in the venv
# already stays.
# Environment: JOULEBENCH_EXTRAS (default llm,resnet-pytorch,reports (the README's quick start plots and reports),
#              plus nvidia where nvidia-smi exists; add resnet-tensorflow for TF),
#              JOULEBENCH_VENV (default <repo>/.venv),
#              JOULEBENCH_TORCH_PACKAGES (default "torch torchvision"; pin versions here),
#              JOULEBENCH_TORCH_CPU_INDEX (default https://download.pytorch.org/whl/cpu),
#              PIP_INDEX_URL / PIP_EXTRA_INDEX_URL as usual.
set -eu
repo=$(cd "$(dirname "$0")/.." && pwd)
venv=${JOULEBENCH_VENV-$repo/.venv}
default_extras=llm,resnet-pytorch,reports
command -v nvidia-smi >/dev/null && default_extras=$default_extras,nvidia  # pynvml for jpwr's sampler
extras=${JOULEBENCH_EXTRAS-$default_extras}
torch_packages=${JOULEBENCH_TORCH_PACKAGES-torch torchvision}
cpu_index=${JOULEBENCH_TORCH_CPU_INDEX-https://download.pytorch.org/whl/cpu}
dry_run=no
case "${1-}" in
    --dry-run) dry_run=yes ;;
    "") ;;
    *) echo "usage: sh jube/setup.sh [--dry-run]" >&2; exit 2 ;;
esac

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"
    elif command -v sudo >/dev/null; then sudo "$@"
    else echo "setup: need root or sudo for: $*" >&2; exit 1
    fi
}

# Prints the index URL torch comes from, empty for pip's own (PIP_INDEX_URL or PyPI); says why on stderr.
torch_index() {
    if [ -n "${PIP_INDEX_URL-}" ]; then
        echo "setup: torch from PIP_INDEX_URL ($PIP_INDEX_URL): the site's index wins" >&2
    elif command -v nvidia-smi >/dev/null || command -v rocm-smi >/dev/null; then
        echo "setup: torch from pip's default index: a GPU tool is on PATH (the default build has CUDA)" >&2
    elif python3 -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=10)' \
            "$cpu_index/torch/" 2>/dev/null; then
        echo "setup: torch from $cpu_index: no GPU found (nvidia-smi, rocm-smi), the CPU build is a quarter the size" >&2
        echo "$cpu_index"
    else
        echo "setup: torch from pip's default index: no GPU found, but $cpu_index cannot be reached" \
             "(its CUDA build is about 4 GB larger; set PIP_INDEX_URL to a mirror of the CPU index to avoid it)" >&2
    fi
}

if [ "$dry_run" = yes ]; then
    index=$(torch_index)
    echo "setup: would install: $torch_packages${index:+ --index-url $index}, then -e $repo${extras:+[$extras]}" \
         "into $venv" >&2
    exit 0
fi

missing=""
command -v jube >/dev/null || missing="$missing jube"
python3 -c 'import ensurepip, venv' 2>/dev/null || missing="$missing python3-venv"
if [ -n "$missing" ]; then
    echo "setup: installing$missing with apt-get" >&2
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update
    # shellcheck disable=SC2086
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $missing
fi

[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --upgrade pip
if ! "$venv/bin/python" -c 'import torch, torchvision' 2>/dev/null; then
    index=$(torch_index)
    # shellcheck disable=SC2086
    "$venv/bin/python" -m pip install --quiet ${index:+--index-url "$index"} $torch_packages
fi
"$venv/bin/python" -m pip install --quiet -e "$repo${extras:+[$extras]}"
ln -sf "$(command -v jube)" "$venv/bin/jube"
echo "setup: done. $("$venv/bin/jube" --version 2>&1); joulebench in $venv; its doctor:" >&2
if "$venv/bin/python" -m joulebench doctor >&2; then
    echo "next: $venv/bin/jube run jube/llm_benchmark.xml -e -a -r" >&2
else
    echo "next: fix what the doctor marks FIX above ($venv/bin/joulebench doctor checks again), then:" \
         "$venv/bin/jube run jube/llm_benchmark.xml -e -a -r" >&2
fi
