#!/usr/bin/env bash
# Run on the build machine (it needs pip and network access; the GPU machine needs neither).
# Downloads into .whl/ (ignored by git) the Python wheels the GPU machine lacks for the python
# parts of scripts/device_checks.sh: transformers >= 5.23 (the GPU machine's image has 5.17.0,
# which has no expert-parallel registry), at the version pinned in python/constraints.txt. Its
# other needs (huggingface_hub, tokenizers, safetensors, ...) are in the image at versions it
# accepts. About 13 MB, plus the build requirements below; chosen for the GPU machine's Python,
# 3.12 on x86_64. Copy .whl/ beside .devkit/ into the checkout on the GPU machine, then run there:
#   bash scripts/device_checks.sh python
# (docs/gpu.md, "Running the checks on a GPU machine").
set -euo pipefail
cd "$(dirname "$0")/.."
# The version the tests ran on here (python/constraints.txt).
version=$(awk -F'==' '$1 == "transformers" {print $2}' python/constraints.txt)
[ -n "$version" ] || { echo "device_wheels.sh: no transformers pin in python/constraints.txt" >&2; exit 2; }
rm -rf .whl && mkdir -p .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp -d .whl "transformers==$version"
# `pip install .`'s build requirements that the image lacks (device_checks.sh's python_build
# installs them from here, the machine reaching no index): scikit-build-core and the
# scipy-openblas32 wheel the CPU GEMMs link, the image having no BLAS. About 25 MB.
for name in scikit-build-core scipy-openblas32; do
  pin=$(awk -F'==' -v n="$name" '$1 == n {print $2}' python/constraints.txt)
  [ -n "$pin" ] || { echo "device_wheels.sh: no $name pin in python/constraints.txt" >&2; exit 2; }
  python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux2014_x86_64 -d .whl "$name==$pin"
done
ls -la .whl
