#!/usr/bin/env bash
# Unmounting `hydramem mount --client-id` while writes are in flight loses nothing
# acknowledged. Two writers overwrite numbered records, one with O_DIRECT (a returned write is
# acknowledged) and one buffered with fsync (a returned fsync acknowledges what came before),
# each noting its acknowledgements in a local file, and the mount is stopped under them twice:
#   1. SIGTERM to the mount: it cannot unmount while the files are open, says so, keeps
#      serving (the writers keep being acknowledged), and unmounts by itself once they are
#      killed mid-write;
#   2. `umount -l` (detach now) under the writers: they keep writing through their open files
#      until they are killed, and the mount then stops and saves.
# After each, a remount with the same identity reads back every acknowledged record exactly
# (and, for the record or fsync interval in flight at the kill, the old or the new bytes);
# the writers overwrite 512 records in turn, and the second pair goes on where the first
# stopped, so kept records are overwritten after a remount too.
set -euo pipefail
. "$(dirname "$0")/lib/mount.sh"
need_mount
need python3 python3
id=00112233445566778899aabbccddeeff
opts=(--scheme hydra-8+2-d1 --size 64MiB --client-id "$id" --log warn)
writer=tests/shell/lib/acked_writer.py
WRITERS=()
kill_writers() {
  local p
  for p in "${WRITERS[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  for p in "${WRITERS[@]}"; do wait "$p" 2>/dev/null || true; done
  WRITERS=()
}
trap 'trap - ERR; kill_writers; mount_cleanup' EXIT
start_writers() {
  local mode
  for mode in direct fsync; do
    python3 "$writer" write "$MNT/$mode" "$dir/$mode.acks" "$mode" 2>"$dir/$mode.err" &
    WRITERS+=($!)
  done
}
acked() { tr -d ' \n' 2>/dev/null <"$dir/$1.acks" || true; }
# acked_past MODE N: MODE's writer has more than N acknowledged records.
acked_past() { [ "$(acked "$1")" -gt "$2" ] 2>/dev/null; }
both_acked_past() { acked_past direct "$1" && acked_past fsync "$1"; }
check_records() {
  local mode
  for mode in direct fsync; do
    python3 "$writer" check "$MNT/$mode" "$dir/$mode.acks" "$mode" ||
      fail "acknowledged $mode records did not read back after $1"
  done
}
# stopped_under_writers HOW: the mount was just stopped by HOW with the writers writing. They
# must go on being acknowledged; then they are killed mid-write, the mount must stop by itself
# and keep its files, and a remount must read every acknowledged record back.
stopped_under_writers() {
  local n m
  n=$(acked direct)
  m=$(acked fsync)
  wait_until 60 both_acked_past $((n > m ? n : m)) || fail "writes stopped being acknowledged after $1"
  kill_writers
  wait_until 60 mount_gone || fail "the mount did not stop after $1 with writes in flight"
  wait "$mount_pid" || fail "the mount did not exit 0 after $1 with writes in flight"
  mount_pid=""
  grep -q 'stay on the memory nodes for this --client-id' "$dir/mount.out" ||
    fail "the mount did not keep its files after $1: $(cat "$dir/mount.out")"
  mount_fs "${opts[@]}"
  check_records "$1 with writes in flight"
}
mount_gone() { ! kill -0 "$mount_pid" 2>/dev/null; }

NODES=10 start_nodes
mount_fs "${opts[@]}"

# 1. SIGTERM while the writers write: busy, so it keeps serving until they are gone.
start_writers
wait_until 60 both_acked_past 300 || fail "the writers did not get going: $(cat "$dir"/*.err)"
kill -TERM "$mount_pid"
wait_until 30 grep -q 'still serving it' "$dir/mount.err" ||
  fail "SIGTERM with files open: no word that it keeps serving"
stopped_under_writers SIGTERM

# 2. A lazy unmount under the writers: their open files keep working until they die.
n=$(acked direct)
start_writers
wait_until 60 both_acked_past $((n + 600)) || fail "the writers did not get going again"
umount -l "$MNT"
stopped_under_writers "umount -l"
umount "$MNT"
wait "$mount_pid" || fail "the last mount did not exit 0"
mount_pid=""
echo "PASS mount_unmount_in_flight"
