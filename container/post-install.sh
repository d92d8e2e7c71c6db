#!/bin/sh
# %post of every joulebench image: install the suite into the image's own Python (never ~/.local),
# then record what was installed as image labels (`apptainer inspect --labels IMAGE.sif`).
#
#   sh /opt/joulebench/src/container/post-install.sh IMAGE FRAMEWORK VENDOR
#
# Packages the base image already has stay as the vendor built and tested them (NGC pins its own in
# /etc/pip/constraint.txt); only missing ones are added, at exact versions. megatron-core is the one
# exception: the LLM driver is written against 0.16.1, so that version is installed whatever the base has.
set -eu
image=$1 framework=$2 vendor=$3
src=${JOULEBENCH_SRC:-/opt/joulebench/src}  # overridable only to try the script outside an image
labels=${APPTAINER_LABELS:-${SINGULARITY_LABELS:-/dev/null}}

# The base image's Docker ENV (its PATH decides which python3 is "the" Python of the image).
if [ -f /.singularity.d/env/10-docker2singularity.sh ]; then
    . /.singularity.d/env/10-docker2singularity.sh
fi
export PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore PIP_BREAK_SYSTEM_PACKAGES=1
py=$(command -v python3)
echo "joulebench post-install: $image ($framework, $vendor) into $py ($("$py" --version 2>&1))"

pip_install() { "$py" -m pip install "$@"; }
has_module() { "$py" -c "import $1" 2>/dev/null; }
major_below() { "$py" -c "import sys, $1 as m; sys.exit(int(m.__version__.split('.')[0]) >= $2)"; }

has_module h5py || pip_install h5py==3.14.0
has_module psutil || pip_install psutil==7.2.2
case $vendor in
    nvidia) has_module pynvml || pip_install nvidia-ml-py==13.615.71 ;;
    amd) has_module amdsmi || pip_install /opt/rocm/share/amdsmi ;;
esac
case $framework in
    pytorch)
        has_module tokenizers || pip_install tokenizers==0.23.3
        PIP_CONSTRAINT='' pip_install --no-deps megatron-core==0.16.1
        ;;
    tensorflow)
        # resnet50's TF backend is written for Keras 3 (TF >= 2.16 depends on it; check, do not assume).
        if ! has_module keras || major_below keras 3; then pip_install keras==3.8.0; fi
        ;;
esac
# Our package itself: a plain (non-editable) install of the copied sources, nothing else pulled in.
if major_below setuptools 68; then PIP_CONSTRAINT='' pip_install 'setuptools>=68,<81' wheel; fi
pip_install --no-deps --no-build-isolation "$src"

# Versions as installed, for the run records' provenance and `apptainer inspect --labels`.
"$py" - >> "$labels" <<'PY'
import importlib.metadata as metadata
import platform

def version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "n/a"

print("org.joulebench.arch", platform.machine())
print("org.joulebench.python", platform.python_version())
for dist in ("joulebench", "torch", "torchvision", "megatron-core", "tensorflow", "tensorflow-rocm", "keras",
             "numpy", "h5py", "nvidia-ml-py", "amdsmi"):
    print(f"org.joulebench.version.{dist}", version(dist))
PY
echo "joulebench post-install: done"
