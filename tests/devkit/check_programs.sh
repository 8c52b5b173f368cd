#!/usr/bin/env bash
# devkit.programs: fails when the build makes a *_gpu program that the device kit would not carry
# (scripts/device_kit.sh --list), or when the kit carries a program that no part of
# scripts/device_checks.sh runs. The build's programs come from the build tool itself (what it
# links), not from the CMake list that the kit reads, so a *_gpu program added anywhere is caught.
#   check_programs.sh BUILD_DIR GENERATOR MAKE_PROGRAM
set -euo pipefail
build=$1 generator=$2 make_program=$3
root=$(cd "$(dirname "$0")/../.." && pwd)

case "$generator" in
  Ninja*) built=$("$make_program" -C "$build" -t targets all |
                  awk '$2 ~ /_EXECUTABLE_LINKER__/ {sub(":", "", $1); n = split($1, p, "/");
                                                     if (p[n] ~ /_gpu$/) print p[n]}' | sort -u) ;;
  *) built=$(cmake --build "$build" --target help | awk '{print $2}' | grep '_gpu$' | sort -u) ;;
esac
kit=$("$root/scripts/device_kit.sh" --list --no-build --build "$build" | sort -u)
[ -n "$built" ] || { echo "FAIL: the build at $build makes no *_gpu program (no nvcc?)"; exit 1; }

status=0
for program in $built; do
  grep -qx "$program" <<<"$kit" ||
    { echo "FAIL: the build makes $program, but the device kit's list lacks it"; status=1; }
done
# A part runs a program where device_checks.sh names it as a word of a command.
for program in $kit; do
  grep -Eq "(^|[[:space:]])$program([[:space:]]|$)" "$root/scripts/device_checks.sh" ||
    { echo "FAIL: the kit carries $program, but no part of scripts/device_checks.sh runs it"; status=1; }
done
[ "$status" = 0 ] && echo "devkit.programs: the build's $(wc -w <<<"$built") *_gpu programs are" \
  "all in the kit's $(wc -w <<<"$kit"), and device_checks.sh runs each"
exit "$status"
