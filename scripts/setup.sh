#!/usr/bin/env bash
# Installs what pmoe needs to build, test and benchmark, and nothing that is already there.
# Debian packages through apt-get (as root, or through sudo); Python packages through pip.
# Safe to run again: a machine that has everything returns in well under a second.
set -euo pipefail

debian_packages=(
  cmake ninja-build g++ pkg-config
  libopenmpi-dev openmpi-bin
  libopenblas-dev
  libgtest-dev
  libcli11-dev
  nlohmann-json3-dev
  libboost-context-dev  # fibers: the threads of a block on the emulated CUDA device
  clang libclang-rt-14-dev  # make fuzz: libFuzzer and the sanitizer runtimes for Clang
  valgrind  # make test: the node splits under memcheck (tests/CMakeLists.txt)
)
# The Python module, its tests, --plot; torch for pmoe.torch and its torchrun tests (PyPI's wheel);
# transformers (5.23 brought the expert-parallel registry pmoe.transformers extends) and
# accelerate (transformers' distributed loading needs it) for the integration's tests.
# nvidia-nccl-cu13: the NCCL torch loads (2.30 on), whose device API headers the GPU remote path
# is built with where found, and which `make test` compiles besides the toolkit's 2.28 (docs/gpu.md,
# "NCCL flavours").
# cuobjdump and the nvdisasm it runs for -sass: the static checks of what nvcc compiled
# (tests/static) read the kernels' cubins with them, and the CUDA toolkit installed here has
# neither.
# Each at the version python/constraints.txt pins, the one the tests last ran on: another version
# counts as missing, and pip installs the pinned one in its place.
python_packages=(numpy pytest nanobind matplotlib torch transformers accelerate nvidia-nccl-cu13
                 nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm)
# nvidia-cutlass: CUTLASS's C++ headers (inside the wheel, cutlass_library/source/include), which
# the GPU build's expert grouped GEMM is compiled with (docs/grouped_gemm_library.md). Only the
# headers are used, so it goes in without its Python dependencies (cuda-python, scipy, ...).
header_packages=(nvidia-cutlass)
constraints=$(cd "$(dirname "$0")/.." && pwd)/python/constraints.txt

missing=()
for pkg in "${debian_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
  echo "setup: installing Debian packages: ${missing[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# One interpreter for every package: those not installed at the pinned version, one a line. A local
# version label (torch's +cu132) is the same release.
not_at_pin() {
python3 - "$constraints" "$@" <<'PY'
import re, sys
from importlib.metadata import PackageNotFoundError, version
pins = {}
for line in open(sys.argv[1]):
    line = line.split("#")[0].strip()
    if line:
        name, _, pinned = line.partition("==")
        pins[re.sub(r"[-_.]+", "-", name.strip().lower())] = pinned.strip()
for name in sys.argv[2:]:
    pinned = pins.get(re.sub(r"[-_.]+", "-", name.lower()))
    if pinned is None:
        sys.exit(f"setup: {name} has no pin in {sys.argv[1]}")
    try:
        installed = version(name).split("+")[0]
    except PackageNotFoundError:
        installed = None
    if installed != pinned:
        print(name)
PY
}
pending=$(not_at_pin "${python_packages[@]}")
missing=()
[ -z "$pending" ] || mapfile -t missing <<< "$pending"
if ((${#missing[@]})); then
  echo "setup: installing Python packages at python/constraints.txt's versions: ${missing[*]}"
  python3 -m pip install -q -c "$constraints" "${missing[@]}"
fi
pending=$(not_at_pin "${header_packages[@]}")
missing=()
[ -z "$pending" ] || mapfile -t missing <<< "$pending"
if ((${#missing[@]})); then
  echo "setup: installing header wheels (no dependencies) at python/constraints.txt's versions: ${missing[*]}"
  python3 -m pip install -q --no-deps -c "$constraints" "${missing[@]}"
fi
