#!/usr/bin/env bash
# Out of space on rep2 over 3 memory nodes of 64 MiB: mounted without --size (as large as the
# nodes can hold) and with a --size larger than they can hold (the cluster runs out first), a
# writer ends with "No space left on device" within a bounded time, never hangs, and so does
# one after it (once the nodes' heartbeats said they are full); the files
# written before still read back exactly, and deleting a file lets writes succeed again.
set -euo pipefail
. "$(dirname "$0")/lib/mount.sh"
need_mount

NODES=3 NODE_CAPACITY=64MiB start_nodes
src="$dir/src"
head -c 20MiB /dev/urandom >"$src"

fill_and_free() {
  cp "$src" "$MNT/before"
  local status=0
  timeout 120 dd if=/dev/zero of="$MNT/fill" bs=1M status=none 2>"$dir/dd.err" || status=$?
  [ "$status" -ne 124 ] || fail "$1: dd was still writing after 120 s (a hang, not ENOSPC)"
  [ "$status" -ne 0 ] && grep -q 'No space left on device' "$dir/dd.err" ||
    fail "$1: dd ended with status $status and not with ENOSPC: $(cat "$dir/dd.err")"
  local filled
  filled=$(stat -c %s "$MNT/fill")
  sync
  echo 3 >/proc/sys/vm/drop_caches
  cmp -s "$MNT/before" "$src" || fail "$1: a file written before the file system filled up reads back wrong"
  # Another writer, now that the nodes have told the mount in their heartbeats that they are
  # full: ENOSPC again, not EIO.
  status=0
  timeout 120 dd if=/dev/zero of="$MNT/more" bs=1M count=4 status=none 2>"$dir/dd.err" || status=$?
  [ "$status" -ne 0 ] && grep -q 'No space left on device' "$dir/dd.err" ||
    fail "$1: a second writer ended with status $status and not with ENOSPC: $(cat "$dir/dd.err")"
  rm "$MNT/more"
  rm "$MNT/fill"
  timeout 120 cp "$src" "$MNT/after" || fail "$1: writing after a delete failed"
  sync
  echo 3 >/proc/sys/vm/drop_caches
  cmp -s "$MNT/after" "$src" && cmp -s "$MNT/before" "$src" || fail "$1: files differ after the delete"
  echo "$1: dd stopped with ENOSPC after $((filled >> 20)) MiB; the earlier file reads back; after rm, 20 MiB written and read back"
  rm "$MNT/before" "$MNT/after"
}

mount_fs --scheme rep2
fill_and_free "without --size (96 MiB: 3 × 64 MiB as rep2)"
stop_mount umount
mount_fs --scheme rep2 --size 1GiB
fill_and_free "--size 1GiB (more than the nodes hold: the cluster runs out first)"
stop_mount umount
echo "PASS mount_enospc"
