#!/usr/bin/env bash
# The consumer test: installs this build into a fresh prefix, then configures, builds and runs,
# against that prefix only, two separate projects that say find_package(pmoe): tests/consumer (the
# plain project a new user writes: no C++ standard of its own) and examples/mpi (under mpirun -n 2). Arguments: <pmoe build dir> <pmoe source dir> <scratch dir> <mpiexec>.
set -euo pipefail
build=$1 source=$2 scratch=$3 mpiexec=$4
rm -rf "$scratch"
cmake --install "$build" --prefix "$scratch/prefix" >/dev/null
test -f "$scratch/prefix/lib/cmake/pmoe/pmoeConfig.cmake"
test -x "$scratch/prefix/bin/pmoe-bench"
# The installed tree must not point back into the source or build tree (relocatable).
if grep -rl -e "$source" -e "$build" "$scratch/prefix/lib/cmake/pmoe"; then
  echo "the installed package config refers to the source or build tree" >&2
  exit 1
fi
mv "$scratch/prefix" "$scratch/moved-prefix"  # relocatable: it works from wherever it lands
cmake -S "$source/tests/consumer" -B "$scratch/consumer" -G Ninja \
      -DCMAKE_PREFIX_PATH="$scratch/moved-prefix" -DCMAKE_BUILD_TYPE=Release
cmake --build "$scratch/consumer"
"$scratch/consumer/consumer"
cmake -S "$source/examples/mpi" -B "$scratch/build" -G Ninja \
      -DCMAKE_PREFIX_PATH="$scratch/moved-prefix" -DCMAKE_BUILD_TYPE=Release
cmake --build "$scratch/build"
"$mpiexec" -n 2 --oversubscribe "$scratch/build/mpi_all_to_all"
