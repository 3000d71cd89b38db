#!/usr/bin/env bash
# TRIM on a span-coded export (no --client-id) forgets the pages instead of storing zeros:
# qemu-io writes 32 MiB, discards 24 MiB of it and zeroes nothing else; the discarded range
# reads back as zeros, the rest as written, and the server's summary at exit shows only the
# 8 MiB left live in the span rows (written zeros would have left 32 MiB live, 24 of them
# zero pages).
set -euo pipefail
. "$(dirname "$0")/lib/nbd.sh"
need qemu-io qemu-utils
NODES=12 start_export 64MiB --scheme span-8+2
cmds=(
  -c "write -P 0x5a 0 32M"
  -c "discard 4M 24M"
  -c "read -P 0x5a 0 4M"
  -c "read -P 0 4M 24M"
  -c "read -P 0x5a 28M 4M"
)
qemu_io_check 3 "${cmds[@]}"
stop_export
span_rows "$dir/nbd.out"
[ "$forgotten" -eq 6144 ] || { echo "FAIL: $forgotten pages forgotten, not the 6144 of the 24 MiB discarded: $line"; exit 1; }
[ "$live" -eq 2048 ] || { echo "FAIL: $live pages live in the span rows, not the 2048 of the 8 MiB left: $line"; exit 1; }
echo "discarded 24 MiB of 32 (span-8+2): $forgotten pages forgotten, $live left in the span rows"
echo "  $line"
echo "PASS nbd_span_trim"
