# The device kit's env.sh (scripts/device_kit.sh copies this file into the kit).
# scripts/device_checks.sh and scripts/device_perf.sh source it on the GPU machine; to run a kit
# program by hand there, `source /tmp/pmoe-kit/env.sh` once device_checks.sh has unpacked the kit.
# It puts the kit's programs, libraries and Open MPI runtime on the paths, and finds the CUDA
# libraries the kit does not carry (scripts/device_image.txt: the machine has them, and cuBLAS
# alone is 570 MB, far over the 64 MiB the kit, wheels and checkout must fit in) in the machine's
# own folders. Returns 1, after naming each library it did not find and where it looked, when one
# is missing; the kit's programs would not start without it. PMOE_CUDA_LIBS=DIR:DIR names folders
# to search first (docs/gpu.md, "Running the checks on a GPU machine").
KIT=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export OPAL_PREFIX="$KIT/usr"
# The machine's own PATH, for builds that must not see the kit's mpicxx (the Python module's).
export PMOE_MACHINE_PATH=${PMOE_MACHINE_PATH-$PATH}
export PATH="$KIT/usr/bin:$KIT/bin:$PATH"
export LIBRARY_PATH="$KIT/dev/lib${LIBRARY_PATH:+:$LIBRARY_PATH}"  # -l and #include when
export CPATH="$KIT/dev/include${CPATH:+:$CPATH}"                  # building there
# The machine's own search path, for programs that are not the kit's (python3 with torch), which
# should not load the kit's libstdc++ or OpenBLAS.
export PMOE_MACHINE_LD_LIBRARY_PATH=${PMOE_MACHINE_LD_LIBRARY_PATH-${LD_LIBRARY_PATH:-}}
export LD_LIBRARY_PATH="$KIT/lib:$KIT/usr/lib/x86_64-linux-gnu/openmpi/lib:$KIT/usr/lib/x86_64-linux-gnu/pmix2/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# The settings the MPI tests use here (tests/CMakeLists.txt, PMOE_MPI_ENV): root, more ranks
# than cores allowed, no single-copy mechanism (CMA needs ptrace rights a VM may not give).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
export PMOE_TIMEOUT_S=${PMOE_TIMEOUT_S:-60}
export PMOE_CUDA_EMULATE=0  # the GPU, never the emulated device

# Where the machine keeps CUDA's libraries, in the order tried: $PMOE_CUDA_LIBS (folders, colon
# separated) first, then the toolkit's, then the pip wheels' beside python3 (nvidia/cu13/lib for
# the CUDA 13 wheels, nvidia/cublas/lib, nvidia/nccl/lib, nvidia/cuda_runtime/lib and the like),
# then ldconfig's cache. Probed once, each probe bounded: 15 s at most in all.
pmoe_dirs=$(
  for pmoe_dir in ${PMOE_CUDA_LIBS:+${PMOE_CUDA_LIBS//:/ }} /usr/local/cuda/lib64 \
      /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda/lib; do
    echo "$pmoe_dir"
  done
  timeout 10 python3 -c '
import glob, os, site
for root in site.getsitepackages() + [site.getusersitepackages()]:
    for lib in sorted(glob.glob(os.path.join(root, "nvidia", "*", "lib"))):
        print(lib)' 2>/dev/null
)
pmoe_cache=$(timeout 5 "$(command -v ldconfig || echo /sbin/ldconfig)" -p 2>/dev/null)

# The folder holding $1 (a soname), first in the order above; "-" for one the loader finds on its
# own (ldconfig's cache); else nothing, and status 1.
pmoe_find_cuda_lib() {
  local dir
  while read -r dir; do
    [ -n "$dir" ] && [ -e "$dir/$1" ] && { echo "$dir"; return 0; }
  done <<< "$pmoe_dirs"
  grep -q "^[[:space:]]*$1 (" <<< "$pmoe_cache" && { echo "-"; return 0; }
  return 1
}

pmoe_missing=()
# Linked by every pmoe program (libpmoe links cudart and cuBLAS; libcublas loads libcublasLt).
for pmoe_lib in libcudart.so.13 libcublas.so.13 libcublasLt.so.13; do
  if pmoe_dir=$(pmoe_find_cuda_lib "$pmoe_lib"); then
    if [ "$pmoe_dir" != "-" ] && [[ ":$LD_LIBRARY_PATH:" != *":$pmoe_dir:"* ]]; then
      export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$pmoe_dir"
    fi
  else
    pmoe_missing+=("$pmoe_lib")
  fi
done
# NCCL is loaded at run time by the GIN path and pmoe-bench's NCCL row (PMOE_NCCL_LIBRARY), and
# only they need it: a missing one is named, not fatal.
if [ -z "${PMOE_NCCL_LIBRARY:-}" ]; then
  if pmoe_dir=$(pmoe_find_cuda_lib libnccl.so.2); then
    [ "$pmoe_dir" = "-" ] || export PMOE_NCCL_LIBRARY="$pmoe_dir/libnccl.so.2"
  else
    echo "env.sh: no libnccl.so.2 on this machine: pmoe-bench's NCCL row and the gin part will" \
         "say so (set PMOE_NCCL_LIBRARY to NCCL 2.28's libnccl.so.2)" >&2
  fi
fi
if [ ${#pmoe_missing[@]} -gt 0 ]; then
  echo "env.sh: ${pmoe_missing[*]} not found; every program of the kit needs them." >&2
  echo "env.sh: looked in: $(tr '\n' ' ' <<< "$pmoe_dirs")and ldconfig's cache." >&2
  echo "env.sh: install the nvidia-cublas / nvidia-cuda-runtime wheels, or set PMOE_CUDA_LIBS" \
       "to the folders that hold them, then source env.sh again." >&2
  unset pmoe_lib pmoe_dir pmoe_dirs pmoe_cache
  return 1
fi
unset pmoe_lib pmoe_dir pmoe_dirs pmoe_cache pmoe_missing
