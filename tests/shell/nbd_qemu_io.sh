#!/usr/bin/env bash
# qemu-io (QEMU's NBD client) writes patterns to the export, aligned and unaligned, across
# pages and up to the last byte, and verifies every one when reading back; write zeroes
# and discard read back as zeros.
set -euo pipefail
. "$(dirname "$0")/lib/nbd.sh"
need qemu-io qemu-utils
start_export 64MiB
size=$((64 << 20))
cmds=(
  -c "write -P 0x11 0 1M"
  -c "write -P 0x22 4095 3"
  -c "write -P 0x33 123457 200k"
  -c "write -P 0x44 $((size - 4096 - 10)) 4106"
  -c "write -z 8M 1M"
  -c "write -P 0x55 16M 64k"
  -c "discard 16M 64k"
  -c "read -P 0x11 0 4095"
  -c "read -P 0x22 4095 3"
  -c "read -P 0x11 4098 119359"
  -c "read -P 0x33 123457 200k"
  -c "read -P 0x44 $((size - 4096 - 10)) 4106"
  -c "read -P 0 8M 1M"
  -c "read -P 0 16M 64k"
  -c "flush"
)
qemu_io_check 7 "${cmds[@]}"
stop_export
echo "PASS nbd_qemu_io"
