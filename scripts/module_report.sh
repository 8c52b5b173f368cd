#!/usr/bin/env bash
# What a built pmoe Python module is made of, printed in seconds, and whether it carries its own
# copy of the C++ runtime's compiled code (exit 1 if it does):
#
#   scripts/module_report.sh BUILD_DIR      # the module under BUILD_DIR/python/pmoe
#   scripts/module_report.sh --toolchain    # before a build: the compiler, nvcc, the environment
#
# Prints the compiler CMake used and its version, nvcc's, the environment that steers a link
# (CXXFLAGS, LDFLAGS, LIBRARY_PATH, ...), where that compiler finds libstdc++.so and libstdc++.a,
# the module's link line, the std:: symbols the module defines (count, and the runtime's own ones
# by name), its NEEDED and RUNPATH entries, and ldd.
#
# Why (docs/gpu.md, "The module that crashed on the H200"): the module built on the GPU machine
# defined libstdc++'s stream and locale code itself (std::ostream::_M_insert<long>,
# std::codecvt<char16_t, ...>::do_unshift, ...), which only linking libstdc++.a puts there; in a
# process that has already loaded the machine's libstdc++.so.6 (torch has), the two copies share
# locale state they each lay out their own way, and the first number formatted crashed. Header
# templates (std::string, std::vector) are the module's own by design; the runtime's compiled code
# (streams, locales, facets, ios_base, exceptions' support) must come from libstdc++.so.6.
set -uo pipefail
toolchain_only=0
[ "${1:-}" = --toolchain ] && toolchain_only=1
build=${1:?usage: module_report.sh BUILD_DIR | --toolchain}
cxx=c++ cuda=$(command -v nvcc) cache=/dev/null
if [ "$toolchain_only" = 0 ]; then
  module=$(ls "$build"/python/pmoe/_pmoe*.so 2>/dev/null | head -1)
  [ -n "$module" ] || { echo "module_report: no _pmoe*.so under $build/python/pmoe"; exit 2; }
  cache=$build/CMakeCache.txt
  cxx=$(sed -n 's/^CMAKE_CXX_COMPILER:[A-Z]*=//p' "$cache" 2>/dev/null)
  cxx=${cxx:-c++}
  cuda=$(sed -n 's/^CMAKE_CUDA_COMPILER:[A-Z]*=//p' "$cache" 2>/dev/null)
  echo "--- module: $module"
fi
echo "compiler: $cxx: $("$cxx" --version 2>&1 | head -1)"
[ -n "$cuda" ] && echo "nvcc: $cuda: $("$cuda" --version 2>&1 | tail -1)"
echo "cmake: $(cmake --version | head -1); build type $(sed -n 's/^CMAKE_BUILD_TYPE:[A-Z]*=//p' "$cache")"
for var in CXX CC CUDAHOSTCXX CXXFLAGS CPPFLAGS LDFLAGS LIBRARY_PATH CPATH AUDITWHEEL_PLAT; do
  [ -n "${!var:-}" ] && echo "environment: $var=${!var}"
done
for flags in CMAKE_CXX_FLAGS CMAKE_SHARED_LINKER_FLAGS CMAKE_MODULE_LINKER_FLAGS; do
  value=$(sed -n "s/^$flags:[A-Z]*=//p" "$cache")
  [ -n "$value" ] && echo "cmake: $flags=$value"
done
echo "libstdc++ as $cxx links it: $("$cxx" -print-file-name=libstdc++.so)" \
     "(archive: $("$cxx" -print-file-name=libstdc++.a))"
[ "$toolchain_only" = 1 ] && exit 0
if command -v ninja >/dev/null && [ -e "$build/build.ninja" ]; then
  echo "link line:"
  ninja -C "$build" -t commands "${module#"$build"/}" 2>/dev/null | tail -1 | fold -w 160
fi
defined=$(nm -DC --defined-only "$module" 2>/dev/null | cut -d' ' -f3-)
echo "defined dynamic symbols: $(wc -l <<< "$defined"), named std::...: $(grep -c '^std::' <<< "$defined")"
# The runtime's compiled code, by the function's own name (its arguments set aside): what only
# libstdc++ defines, never a header's inline or template code. A module built right defines none.
runtime=$(sed 's/(.*//' <<< "$defined" | grep -E \
  '^(std::locale|std::ios_base|std::__throw_|__cxxabiv1::|std::.*::_M_(insert|extract)<|std::(__)?codecvt|std::num_(put|get)<|std::basic_ios<.*>::init$)' |
  sort -u)
# How many of the module's symbols the C++ runtime it links also defines (header templates make a
# few: about 15 here; a copy of the runtime makes thousands).
runtime_so=$(readlink -f "$("$cxx" -print-file-name=libstdc++.so)")
if [ -e "$runtime_so" ]; then
  echo "symbols shared with $runtime_so: $(comm -12 \
    <(nm -D --defined-only "$runtime_so" | awk '{print $3}' | sed 's/@.*//' | sort -u) \
    <(nm -D --defined-only "$module" | awk '{print $3}' | sort -u) | wc -l)"
fi
echo "NEEDED: $(readelf -d "$module" 2>/dev/null | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | tr '\n' ' ')"
echo "RUNPATH: $(readelf -d "$module" 2>/dev/null | sed -n 's/.*(R.*PATH).*\[\(.*\)\]/\1/p')"
echo "ldd:"
ldd "$module" 2>&1 | sed 's/^\s*/  /'
if [ -n "$runtime" ]; then
  echo "FAIL: the module defines $(wc -l <<< "$runtime") symbols of the C++ runtime's own code" \
       "(libstdc++.a was linked in), among them:"
  { grep -E '_M_insert|codecvt|locale::' <<< "$runtime"; grep -vE '_M_insert|codecvt|locale::' <<< "$runtime"; } |
    head -8 | sed 's/^/  /'
  exit 1
fi
echo "ok: the module defines none of the C++ runtime's own code (it comes from libstdc++.so.6)"
