#!/usr/bin/env bash
# Run on the build machine (x86_64 Debian or Ubuntu with the CUDA toolkit and what
# scripts/setup.sh installs, Open MPI 4.1 and OpenBLAS among it), not on the GPU machine. Packs
# what the GPU machine lacks into one archive, .devkit/kit.tar.gz (ignored by git), to copy into
# the checkout there: every GPU program the build makes (the *_gpu tests and pmoe-bench, listed by
# CMake in build/default/devkit_programs.txt; nvcc here is the GPU machine's 13.0, so no GPU time
# goes to compiling), the shared libraries they need that the GPU machine has no copy of
# (OpenBLAS, Boost.Context, Open MPI's), and a relocatable Open MPI 4.1 runtime (mpirun, its
# plugins and help files), because that machine has no package manager, no BLAS and no MPI. Takes
# a build of the default preset, then a few seconds to 40 s to pack.
#
# It carries no CUDA library: the GPU machine has cudart, cuBLAS and NCCL
# (scripts/device_image.txt), and the kit's env.sh (scripts/device_kit_env.sh) finds them there.
# cuBLAS alone would be 570 MB; the kit, the wheels and the checkout (~3.4 MB) travel together
# within 64 MiB, the most the GPU machines this was sized for accept. The kit packs to about
# 31 MiB; ctest's devkit.size fails above 48 MiB, and the target is 40 MiB, which leaves room for
# a wheel or two (docs/gpu.md).
#
#   scripts/device_kit.sh              # configure and build (default preset), stage, pack
#   scripts/device_kit.sh --list       # the programs it would pack, one name a line
#   scripts/device_kit.sh --no-build --build DIR --stage DIR --out FILE
#                                      # pack what DIR already holds (ctest's devkit.size)
#
# Then, on the build machine, `scripts/device_checks.sh --dry-run` checks the kit, and on the GPU
# machine `bash scripts/device_checks.sh` unpacks it to /tmp/pmoe-kit, sources its env.sh and
# runs the checks (docs/gpu.md, "Running the checks on a GPU machine").
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=build/default
KIT=build/devkit           # staging; only the archive travels
ARCHIVE=.devkit/kit.tar.gz
IMAGE=scripts/device_image.txt
MULTIARCH=x86_64-linux-gnu
build=1 list=0
while [ $# -gt 0 ]; do
  case "$1" in
    --list) list=1 ;;
    --no-build) build=0 ;;
    --build) BUILD=$2; shift ;;
    --stage) KIT=$2; shift ;;
    --out) ARCHIVE=$2; shift ;;
    *) echo "device_kit.sh: unknown argument '$1' (--list, --no-build, --build DIR, --stage DIR," \
            "--out FILE; docs/gpu.md)" >&2; exit 2 ;;
  esac
  shift
done

if [ "$build" = 1 ] && [ "$BUILD" = build/default ]; then
  cmake --preset default >/dev/null
fi
MANIFEST=$BUILD/devkit_programs.txt  # "name file" a line, written by tests/CMakeLists.txt
if [ ! -e "$MANIFEST" ]; then
  echo "device_kit.sh: no $MANIFEST: $BUILD was configured without the CUDA toolkit (nvcc), so" \
       "it makes no GPU programs" >&2
  exit 2
fi
if [ "$list" = 1 ]; then
  awk '{print $1}' "$MANIFEST"
  exit 0
fi
if [ "$build" = 1 ]; then
  cmake --build "$BUILD" --target $(awk '{print $1}' "$MANIFEST")
fi

rm -rf "$KIT"
mkdir -p "$KIT/bin" "$KIT/lib" "$KIT/usr/bin" "$KIT/usr/lib/$MULTIARCH" "$KIT/usr/share"
while read -r name file; do
  [ -x "$file" ] || { echo "device_kit.sh: $name is not built ($file); run without --no-build" >&2; exit 2; }
  cp "$file" "$KIT/bin/$name"
done < "$MANIFEST"

# Open MPI as Debian lays it out under /usr; OPAL_PREFIX moves that prefix to $KIT/usr.
cp -a "/usr/lib/$MULTIARCH/openmpi" "/usr/lib/$MULTIARCH/pmix2" "$KIT/usr/lib/$MULTIARCH/"
cp -a /usr/share/openmpi "$KIT/usr/share/"
cp -L /usr/bin/orterun /usr/bin/orted /usr/bin/opal_wrapper "$KIT/usr/bin/"
ln -s orterun "$KIT/usr/bin/mpirun"
ln -s opal_wrapper "$KIT/usr/bin/mpicxx"  # the wrapper reads its mode from its name

# Every library an ELF file in the kit loads, except those the GPU machine has (the C library,
# the GPU driver, CUDA's runtime, cuBLAS, NCCL: the `lib` lines of device_image.txt).
mapfile -t provided < <(awk '$1 == "lib" {print $2}' "$IMAGE")
is_provided() {
  local name known
  name=$(basename "$1")
  for known in "${provided[@]}"; do [ "$known" = "$name" ] && return 0; done
  return 1
}
copy_deps() {
  ldd "$1" 2>/dev/null | awk '/=> \// {print $3}' | while read -r lib; do
    is_provided "$lib" && continue
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

# For building the Python module with the GPU machine's Python: OpenBLAS's headers and
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

cp scripts/device_kit_env.sh "$KIT/env.sh"
{
  echo "commit: $(git rev-parse --short=12 HEAD)$(git diff --quiet HEAD || echo ' (with uncommitted changes)')"
  echo "built: $(date -u +%Y-%m-%dT%H:%MZ) on $(uname -n)"
} > "$KIT/BUILT"
mkdir -p "$(dirname "$ARCHIVE")"
tar -czf "$ARCHIVE" -C "$KIT" .
echo "$ARCHIVE: $(stat -c %s "$ARCHIVE") bytes, $(awk 'END {print NR}' "$MANIFEST") programs"
