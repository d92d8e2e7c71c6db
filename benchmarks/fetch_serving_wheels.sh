#!/bin/sh
# Download the wheels of a requirements file (default benchmarks/serving-gpu-requirements.txt:
# transformers serve; benchmarks/log-to-gpu-requirements.txt: --log-to's extras) for the GPU
# machine's Python 3.12, which installs them with --no-index --no-deps, into .whl/ of the repo root.
#     sh benchmarks/fetch_serving_wheels.sh [REQUIREMENTS]
# Idempotent: pip skips a wheel already there. Fails naming a requirement that has no wheel for cp312 /
# manylinux x86-64 (or py3-none-any).
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
req=${1:-"$root/benchmarks/serving-gpu-requirements.txt"}
dest="$root/.whl"
py=${PYTHON:-python3}
mkdir -p "$dest"
grep -v -e '^[[:space:]]*#' -e '^[[:space:]]*$' "$req" | while read -r spec; do
    if ! "$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        --platform manylinux1_x86_64 -d "$dest" "$spec"; then
        echo "fetch_serving_wheels: no wheel for $spec" >&2
        exit 1
    fi
done
echo "wheels in $dest: $(ls "$dest"/*.whl | wc -l), total $(du -ch "$dest"/*.whl | tail -1 | cut -f1)"
