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
)
# The Python module, its tests, --plot; torch for pmoe.torch and its torchrun tests (PyPI's wheel);
# transformers (5.23 brought the expert-parallel registry pmoe.transformers extends) and
# accelerate (transformers' distributed loading needs it) for the integration's tests.
# nvidia-nccl-cu13: the NCCL torch loads (2.30 on), whose device API headers the GPU remote path
# is built with where found, and which `make test` compiles besides the toolkit's 2.28 (docs/gpu.md,
# "NCCL flavours").
python_packages=(numpy pytest nanobind matplotlib torch "transformers>=5.23.0" "accelerate>=1.0"
                 "nvidia-nccl-cu13>=2.30.0")
# cuobjdump and the nvdisasm it runs for -sass: the static checks of what nvcc compiled
# (tests/static) read the kernels' cubins with them, and the CUDA toolkit installed here has
# neither.
python_packages+=(nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm)

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

if ((${#python_packages[@]})); then
  missing=()
  for pkg in "${python_packages[@]}"; do
    python3 - "$pkg" <<'PY' || missing+=("$pkg")
import re, sys
from importlib.metadata import PackageNotFoundError, version
name, _, minimum = sys.argv[1].partition(">=")
numbers = lambda text: tuple(int(n) for n in re.findall(r"\d+", text)[:3])
try:
    sys.exit(0 if numbers(version(name)) >= numbers(minimum) else 1)
except PackageNotFoundError:
    sys.exit(1)
PY
  done
  if ((${#missing[@]})); then
    echo "setup: installing Python packages: ${missing[*]}"
    python3 -m pip install -q "${missing[@]}"
  fi
fi
