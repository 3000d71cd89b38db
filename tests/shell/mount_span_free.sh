#!/usr/bin/env bash
# Files deleted or cut short on a span-coded mount stop costing remote memory: a 32 MiB file
# is written and deleted, a second one written and truncated to 8 MiB. The mount tells the
# span store that the freed pages will not be read before they are written again, so at
# unmount its summary shows them forgotten and the rows holding only the 8 MiB left, where
# before the deleted pages stayed live (and compaction moved them) until a file wrote their
# slots again. The file left reads back exact. With --client-id, the remount forgets the
# copies its reattach found again for pages no file holds.
set -euo pipefail
. "$(dirname "$0")/lib/mount.sh"
need_mount

NODES=12 start_nodes
mount_fs --scheme span-8+2 --size 256MiB
head -c 32M /dev/urandom >"$dir/src"
cp "$dir/src" "$MNT/a"
cmp "$dir/src" "$MNT/a" || fail "the first file did not read back exact"
rm "$MNT/a"
cp "$dir/src" "$MNT/b"
truncate -s 8M "$MNT/b"
cmp -n 8M "$dir/src" "$MNT/b" || fail "the truncated file did not read back exact"
[ "$(stat -c %s "$MNT/b")" -eq $((8 << 20)) ] || fail "the truncated file is not 8 MiB"
stop_mount umount
span_rows "$dir/mount.out"
# 32 MiB deleted and 24 MiB cut off: 14336 pages; 8 MiB left: 2048 pages.
[ "$forgotten" -ge 14336 ] || fail "only $forgotten pages forgotten after 56 MiB of file pages were freed: $line"
[ "$live" -eq 2048 ] || fail "$live pages live in the span rows, not the 2048 of the 8 MiB left: $line"
echo "deleted 32 MiB and truncated 24 MiB (span-8+2): $forgotten pages forgotten, $live left in the span rows"
echo "  $line"

# Kept (--client-id): the reattach at the next mount finds every copy the nodes still hold —
# the deleted file's, the snapshot's — and the remount forgets those no file holds, so only
# the kept file (2048 pages) and the superblock are live when it unmounts again.
opts=(--scheme span-8+2 --size 64MiB --client-id 00112233445566778899aabbccddeeff)
mount_fs "${opts[@]}"
head -c 8M "$dir/src" >"$MNT/keep"
cp "$dir/src" "$MNT/gone"
rm "$MNT/gone"
umount "$MNT"
wait "$mount_pid" || fail "the first kept mount did not exit 0"
mount_pid=""
mount_fs "${opts[@]}"
cmp -n 8M "$dir/src" "$MNT/keep" || fail "the kept file did not read back exact after the remount"
umount "$MNT"
wait "$mount_pid" || fail "the second kept mount did not exit 0"
mount_pid=""
span_rows "$dir/mount.out"
[ "$live" = 2049 ] || fail "$live pages live after the remount, not the kept file's 2048 and the superblock: $line"
echo "remounted --client-id (span-8+2): $live pages live, the kept file's and the superblock"
echo "PASS mount_span_free"
