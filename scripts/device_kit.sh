#!/usr/bin/env bash
# Packs what the lent GPU machine lacks into one archive, .devkit/kit.tar.gz (ignored by git; about
# 23 MB, under the device tool's 64 MiB carry limit), which the device tool carries: the CUDA tests and pmoe-bench built here (nvcc here is the device's 13.0, so
# no device time goes to compiling), every shared library they need that is not part of the C
# library, and a relocatable Open MPI 4.1 runtime (mpirun, its plugins and help files), because
# that machine has no apt, no BLAS and no MPI. The kit's env.sh sets the paths there.
#
#   scripts/device_kit.sh              # build (default preset) and pack
#
# On the device (see README "GPU checks on a lent machine"):
#   run(command="bash scripts/device_checks.sh", carry=[".devkit"])
# which unpacks it to /tmp/pmoe-kit and sources its env.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
KIT=build/devkit          # staging; only the archive travels
BUILD=build/default
MULTIARCH=x86_64-linux-gnu

cmake --preset default >/dev/null
cmake --build "$BUILD" --target test_cuda_all_to_all_gpu test_cuda_ipc_gpu test_cuda_grid_gpu \
  test_cuda_overlap_gpu test_cuda_graph_gpu pmoe-bench

rm -rf "$KIT"
mkdir -p "$KIT/bin" "$KIT/lib" "$KIT/usr/bin" "$KIT/usr/lib/$MULTIARCH" "$KIT/usr/share"
cp "$BUILD/tests/test_cuda_all_to_all_gpu" "$BUILD/tests/test_cuda_ipc_gpu" \
   "$BUILD/tests/test_cuda_grid_gpu" "$BUILD/tools/pmoe-bench/pmoe-bench" "$KIT/bin/"
cp "$BUILD/tests/test_cuda_overlap_gpu" "$BUILD/tests/test_cuda_graph_gpu" "$KIT/bin/"
# The GIN ring check, where CMake found NCCL's device API (device_checks.sh part gin; libnccl
# itself is not packed: it is loaded at run time, from the device's own NCCL).
if cmake --build "$BUILD" --target gin_ring_gpu >/dev/null 2>&1; then
  cp "$BUILD/tests/gin_ring_gpu" "$KIT/bin/"
fi

# Open MPI as Debian lays it out under /usr; OPAL_PREFIX moves that prefix to $KIT/usr.
cp -a "/usr/lib/$MULTIARCH/openmpi" "/usr/lib/$MULTIARCH/pmix2" "$KIT/usr/lib/$MULTIARCH/"
cp -a /usr/share/openmpi "$KIT/usr/share/"
cp -L /usr/bin/orterun /usr/bin/orted /usr/bin/opal_wrapper "$KIT/usr/bin/"
ln -s orterun "$KIT/usr/bin/mpirun"
ln -s opal_wrapper "$KIT/usr/bin/mpicxx"  # the wrapper reads its mode from its name


# Every library an ELF file in the kit loads, except the C library's own and the GPU driver's
# (the device brings its driver; a carried libcuda would not match its kernel module).
is_system_lib() {
  case "$(basename "$1")" in
    libc.so.*|libm.so.*|libdl.so.*|libpthread.so.*|librt.so.*|ld-linux*|libcuda.so.*) return 0 ;;
    *) return 1 ;;
  esac
}
copy_deps() {
  ldd "$1" 2>/dev/null | awk '/=> \// {print $3}' | while read -r lib; do
    is_system_lib "$lib" && continue
    [ -e "$KIT/lib/$(basename "$lib")" ] || cp -L "$lib" "$KIT/lib/"
  done
}
while read -r file; do
  if file -b "$file" | grep -q '^ELF'; then copy_deps "$file"; fi
done < <(find "$KIT/bin" "$KIT/usr" -type f)
# Libraries copied in the last step may need others (plugins of UCX, libfabric's providers).
for _ in 1 2; do
  for lib in "$KIT"/lib/*; do copy_deps "$lib"; done
done
find "$KIT" -name '*.a' -delete  # static archives: nothing here links against them

# Debian's openmpi/lib/libmpi.so and friends point at ../../libmpi.so.40 (/usr/lib/$MULTIARCH);
# in the kit that folder holds links to the copies in lib/.
for link in "$KIT/usr/lib/$MULTIARCH"/{openmpi,pmix2}/lib/*.so; do
  [ -L "$link" ] || continue
  target=$(basename "$(readlink "$link")")
  [ -e "$KIT/lib/$target" ] || cp -L "/usr/lib/$MULTIARCH/$target" "$KIT/lib/"
  ln -sf "../../../lib/$target" "$KIT/usr/lib/$MULTIARCH/$target"
done

# For building the Python module there (it needs the device's Python): OpenBLAS's headers and
# unversioned names of the libraries that FindBLAS and `mpicxx -showme:link` ask for, in one
# prefix for CMAKE_PREFIX_PATH and LIBRARY_PATH. Only those: an unversioned libgcc_s.so here
# would hide the toolchain's linker script of that name (which also pulls in libgcc.a).
mkdir -p "$KIT/dev/include" "$KIT/dev/lib"
cp /usr/include/$MULTIARCH/openblas-pthread/{cblas.h,openblas_config.h} "$KIT/dev/include/"
for name in openblas mpi mpi_cxx open-rte open-pal hwloc event_core event_pthreads z; do
  for lib in "$KIT/lib/lib$name.so."* "$KIT/lib/lib$name"-*.so.*; do
    [ -e "$lib" ] && ln -s "../../lib/$(basename "$lib")" "$KIT/dev/lib/lib$name.so" && break
  done
done

cat > "$KIT/env.sh" <<'EOF'
# Source this on the device machine: the kit's programs, libraries and Open MPI runtime.
KIT=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export OPAL_PREFIX="$KIT/usr"
export PATH="$KIT/usr/bin:$KIT/bin:$PATH"
export LIBRARY_PATH="$KIT/dev/lib${LIBRARY_PATH:+:$LIBRARY_PATH}"  # -l and #include when
export CPATH="$KIT/dev/include${CPATH:+:$CPATH}"                  # building there
export LD_LIBRARY_PATH="$KIT/lib:$KIT/usr/lib/x86_64-linux-gnu/openmpi/lib:$KIT/usr/lib/x86_64-linux-gnu/pmix2/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# The settings the MPI tests use here (tests/CMakeLists.txt, PMOE_MPI_ENV): root, more ranks
# than cores allowed, no single-copy mechanism (CMA needs ptrace rights a VM may not give).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
export PMOE_TIMEOUT_S=${PMOE_TIMEOUT_S:-60}
export PMOE_CUDA_EMULATE=0  # the GPU, never the emulated device
EOF
{
  echo "commit: $(git rev-parse --short=12 HEAD)$(git diff --quiet HEAD || echo ' (with uncommitted changes)')"
  echo "built: $(date -u +%Y-%m-%dT%H:%MZ) on $(uname -n)"
} > "$KIT/BUILT"
mkdir -p .devkit
tar -czf .devkit/kit.tar.gz -C "$KIT" .
ls -la .devkit/kit.tar.gz
