#!/usr/bin/env bash
# nbdcopy copies a large random file into the export and back out over several connections
# at once (the server offers multi-conn); the copy out has the same SHA-256 as the file.
set -euo pipefail
. "$(dirname "$0")/lib/nbd.sh"
need nbdcopy libnbd-bin
size=$((96 << 20))
start_export "$size"
head -c "$size" /dev/urandom >"$dir/in.bin"
nbdcopy --connections=4 --requests=16 "$dir/in.bin" "$URI"
nbdcopy --connections=4 --requests=16 "$URI" "$dir/out.bin"
in_sum=$(sha256sum <"$dir/in.bin" | cut -d' ' -f1)
out_sum=$(sha256sum <"$dir/out.bin" | cut -d' ' -f1)
echo "in  $in_sum"
echo "out $out_sum"
[ "$in_sum" = "$out_sum" ] || { echo "FAIL: the copy out differs from the file copied in"; exit 1; }
stop_export
echo "PASS nbd_nbdcopy"
