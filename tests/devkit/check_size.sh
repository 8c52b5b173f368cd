#!/usr/bin/env bash
# devkit.size: packs the device kit from this build's programs (scripts/device_kit.sh --no-build)
# and fails above 48 MiB. The kit, the checkout (~3.4 MB) and any wheels must fit in 64 MiB on
# their way to the GPU machine (docs/gpu.md). Packing it whole takes a few seconds, so there is
# no estimate to trust instead. The archive is left for devkit.dry_run.
#   check_size.sh BUILD_DIR STAGE_DIR ARCHIVE
set -euo pipefail
build=$1 stage=$2 archive=$3
root=$(cd "$(dirname "$0")/../.." && pwd)
limit=$((48 << 20))
"$root/scripts/device_kit.sh" --no-build --build "$build" --stage "$stage" --out "$archive"
size=$(stat -c %s "$archive")
echo "devkit.size: $size bytes ($((size >> 20)) MiB), limit $limit (48 MiB); staged $(du -sm "$stage" | cut -f1) MB"
[ "$size" -le "$limit" ] || { echo "FAIL: the kit is $size bytes, over 48 MiB: see what" \
  "'du -a $stage | sort -n | tail' shows, and leave out what scripts/device_image.txt says the" \
  "GPU machine has"; exit 1; }
