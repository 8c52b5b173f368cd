#!/usr/bin/env bash
# What a PyTorch user's `pip install .` gives, built and run the way that user runs it:
#
#   tests/pip/pip_install.sh SOURCE_DIR WORK_DIR [PYTHON]
#
# 1. a fresh virtual environment (WORK_DIR/venv) holding only python/constraints.txt's torch and
#    numpy, the build requirements (pyproject.toml) and pytest (python/tests' helpers import it);
# 2. `pip install .` in it, the build in WORK_DIR/build (kept: the next run rebuilds what
#    changed), with the system's BLAS invisible to CMake (CMAKE_DISABLE_FIND_PACKAGE_BLAS), so
#    that the scipy-openblas32 wheel's is the one found, and one CUDA architecture
#    (TORCH_CUDA_ARCH_LIST, 9.0a unless set) to keep the build short;
# 3. the checks: the build log says CUDA backend ON and BLAS from the wheel; the installed module
#    links the venv's OpenBLAS and the CUDA runtime of torch's nvidia wheel, no system BLAS, and
#    no copy of libstdc++ (scripts/module_report.sh); `import pmoe`; the README's Python example;
#    pmoe.torch on CUDA under torchrun (python/tests/torchrun_cuda.py): on this machine, without
#    a GPU, torch has no CUDA tensors, so it runs pmoe's own CUDA-device path from pmoe.torch's
#    communicator (dispatch/combine on pmoe's device arrays, the device errors) on the emulated
#    device, PMOE_CUDA_EMULATE=1.
#
# The wheels come from a wheelhouse (PMOE_PIP_WHEELHOUSE, default ~/.cache/pmoe/wheelhouse),
# filled from PyPI on the first run and read offline after it: this machine's pip keeps no HTTP
# cache of torch's wheels, and torch with its nvidia wheels is about 3 GB. The venv (about 5 GB)
# is removed when every check passes.
set -euo pipefail
src=$(cd "${1:?usage: pip_install.sh SOURCE_DIR WORK_DIR [PYTHON]}" && pwd)
work=${2:?usage: pip_install.sh SOURCE_DIR WORK_DIR [PYTHON]}
python=${3:-python3}
mkdir -p "$work"
work=$(cd "$work" && pwd)
constraints=$src/python/constraints.txt
wheels=${PMOE_PIP_WHEELHOUSE:-$HOME/.cache/pmoe/wheelhouse}
packages=(torch numpy pytest scikit-build-core nanobind scipy-openblas32)
start=$SECONDS
step() { echo "pip test [$((SECONDS - start)) s]: $*"; }
fail() { echo "FAIL: $*"; exit 1; }

step "wheelhouse $wheels: ${packages[*]} at python/constraints.txt's pins"
mkdir -p "$wheels"
if ! "$python" -m pip download -q --no-index --find-links "$wheels" -d "$wheels" -c "$constraints" \
     "${packages[@]}" >/dev/null 2>&1; then
  "$python" -m pip download -q -d "$wheels" -c "$constraints" "${packages[@]}"
fi

step "fresh venv $work/venv"
rm -rf "$work/venv"
"$python" -m venv "$work/venv"
venv=$work/venv/bin
"$venv/python" -m pip install -q --no-index --find-links "$wheels" -c "$constraints" "${packages[@]}"
"$venv/python" -m pip list --format=freeze | sed 's/^/  /'

# The user's shell: the venv first on PATH (CMake's own look-ups for python3 land in it).
export PATH=$venv:$PATH
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0a}
log=$work/pip_install.log
step "pip install . (TORCH_CUDA_ARCH_LIST=$TORCH_CUDA_ARCH_LIST, system BLAS hidden; log: $log)"
# --no-build-isolation: the build requirements are the venv's, at stable paths, so that a rerun
# rebuilds only what changed (an isolated build env has a new path each time, and every object
# whose include path names it would be rebuilt).
if ! (cd "$src" && "$venv/python" -m pip install -v --no-build-isolation --no-index \
        --find-links "$wheels" -c "$constraints" . \
        --config-settings=build-dir="$work/build" \
        --config-settings=cmake.define.CMAKE_DISABLE_FIND_PACKAGE_BLAS=ON) > "$log" 2>&1; then
  tail -60 "$log"
  fail "pip install . failed"
fi
grep -E -- "-- pmoe: " "$log" | sed 's/^ */  /'
grep -q "pmoe: CUDA backend for GPUs ON" "$log" || fail "the build has no CUDA backend"
grep -q "pmoe: BLAS from python, scipy-openblas32" "$log" || fail "BLAS did not come from the wheel"
grep -q "pmoe: CUDA architectures 90a-real" "$log" ||
  [ "$TORCH_CUDA_ARCH_LIST" != 9.0a ] || fail "TORCH_CUDA_ARCH_LIST=9.0a did not give sm_90a"

cd "$work"  # not the source tree: `import pmoe` must find the installed package
module=$("$venv/python" -c "import importlib.util as u; print(u.find_spec('pmoe._pmoe').origin)")
step "the installed module: $module"
links=$(ldd "$module")
sed 's/^\s*/  /' <<< "$links"
site=$(dirname "$(dirname "$module")")
# loaded NAME: the file ldd resolves NAME to, its path made canonical ($ORIGIN/../ in it).
loaded() { awk -v name="$1" '$1 == name && $2 == "=>" {print $3}' <<< "$links" | xargs -r readlink -f; }
[ "$(loaded libscipy_openblas.so)" = "$(readlink -f "$site/scipy_openblas32/lib/libscipy_openblas.so")" ] ||
  fail "the module does not load the venv's scipy-openblas32"
! grep -qE "libopenblas|libblas\.so" <<< "$links" || fail "the module links a system BLAS"
[ "$(loaded libcudart.so.13)" = "$(readlink -f "$site/nvidia/cu13/lib/libcudart.so.13")" ] ||
  fail "the module does not load the CUDA runtime of torch's nvidia wheel"
! grep -q "not found" <<< "$links" || fail "a library the module needs is not found"
bash "$src/scripts/module_report.sh" "$work/build" > "$work/module_report.txt" ||
  { cat "$work/module_report.txt"; fail "scripts/module_report.sh"; }
tail -1 "$work/module_report.txt"

step "import pmoe"
"$venv/python" -c "
import pmoe
print('  pmoe', pmoe.__version__, 'from', pmoe.__file__)
print('  cuda_available', pmoe.cuda_available(), 'cuda_emulated', pmoe.cuda_emulated())
assert pmoe.cuda_available(), 'no CUDA device, not even the emulated one'
"
step "the README's Python example (python/examples/all_to_all.py)"
out=$("$venv/python" "$src/python/examples/all_to_all.py")
[ "$out" = ok ] || fail "the README example printed: $out"

step "pmoe.torch on cuda:0, 2 ranks under torchrun, emulated device (python/tests/torchrun_cuda.py)"
PMOE_CUDA_EMULATE=1 PMOE_TIMEOUT_S=${PMOE_TIMEOUT_S:-60} OMP_NUM_THREADS=1 \
  "$venv/python" -m torch.distributed.run --standalone --nproc-per-node 2 \
  "$src/python/tests/torchrun_cuda.py" || fail "torchrun_cuda.py"

rm -rf "$work/venv"
step "ok: pip install . built the CUDA module with the wheel's BLAS, and it ran"
