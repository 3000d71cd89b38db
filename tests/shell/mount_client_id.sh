#!/usr/bin/env bash
# `hydramem mount --client-id` keeps the files across a clean unmount: mounted again with the
# same identity (here with r = 2 of its nodes killed in between), every file, directory, link,
# hole and mode is back, byte for byte, and can be changed and kept again; a mount that does
# not stop cleanly (SIGKILL) loses its files, as memory does, and says so at the next mount;
# a different --size is refused, naming both sizes; `hydramem free` releases the identity.
set -euo pipefail
. "$(dirname "$0")/lib/mount.sh"
need_mount
need python3 python3
id=0123456789abcdef0123456789abcdef
opts=(--scheme hydra-8+2-d1 --size 64MiB --client-id "$id")
src="$dir/src"
mkdir -p "$src"
head -c $((5 << 20)) /dev/urandom >"$src/big"
head -c 4097 /dev/urandom >"$src/small"

# Twelve nodes: with two of them lost, ten are left for the ten splits of a page.
NODES=12 start_nodes
mount_fs "${opts[@]}"
mkdir -p "$MNT/d/e"
cp "$src/big" "$MNT/d/big"
cp "$src/small" "$MNT/d/e/small"
chmod 640 "$MNT/d/e/small"
truncate -s $((3 << 20)) "$MNT/sparse"
printf 'tail' | dd of="$MNT/sparse" bs=1 seek=$((3 << 20)) conv=notrunc status=none
ln -s d/e/small "$MNT/link"
touch -d '2020-02-02 02:02:02' "$MNT/d/big"
listing() { (cd "$MNT" && find . -printf '%p %y %m %s %l\n' | sort); }
before=$(listing)
umount "$MNT"
wait "$mount_pid" || fail "the first mount did not exit 0"
mount_pid=""
grep -q 'files and directories stay on the memory nodes for this --client-id' "$dir/mount.out" ||
  fail "unmount did not say the files stay: $(cat "$dir/mount.out")"
[ "$(slabs_held)" -gt 0 ] || fail "no slabs held after a kept unmount"

# r = 2 nodes lost while nothing is mounted: the files still come back whole (the client
# regenerates the lost splits onto the two spare nodes).
kill_node 0
kill_node 5
mount_fs "${opts[@]}"
grep -q 'kept for this --client-id' "$dir/mount.out" || fail "the remount did not find the kept files"
[ "$(listing)" = "$before" ] || fail "the tree differs after remount: $(diff <(echo "$before") <(listing))"
echo 3 >/proc/sys/vm/drop_caches
cmp -s "$MNT/d/big" "$src/big" || fail "d/big differs after remount"
cmp -s "$MNT/link" "$src/small" || fail "link → d/e/small differs after remount"
[ "$(stat -c %Y "$MNT/d/big")" = "$(date -d '2020-02-02 02:02:02' +%s)" ] || fail "mtime not kept"
python3 - "$MNT/sparse" <<'PY' || fail "sparse file's hole or tail wrong after remount"
import sys
b = open(sys.argv[1], "rb").read()
assert len(b) == (3 << 20) + 4 and b[-4:] == b"tail" and b[:3 << 20] == bytes(3 << 20)
PY
echo "  remount with nodes 0 and 5 killed: $(echo "$before" | wc -l) entries and every byte back"

# Changed, kept again.
printf 'more' >>"$MNT/d/e/small"
rm "$MNT/sparse"
umount "$MNT"
wait "$mount_pid" || fail "the second mount did not exit 0"
mount_pid=""
mount_fs "${opts[@]}"
[ ! -e "$MNT/sparse" ] || fail "a removed file came back"
cmp -s "$MNT/d/e/small" <(cat "$src/small"; printf more) || fail "an append was not kept"

# A mount that dies is not saved: the next one starts empty, and says why.
kill -KILL "$mount_pid"
wait "$mount_pid" 2>/dev/null || true
mount_pid=""
umount -l "$MNT"
mount_fs "${opts[@]}" --log warn
[ -z "$(ls -A "$MNT")" ] || fail "files came back after a mount that did not stop cleanly"
grep -q 'did not stop cleanly' "$dir/mount.err" || fail "no warning that the previous mount did not stop cleanly"
umount "$MNT"
wait "$mount_pid" || fail "the fourth mount did not exit 0"
mount_pid=""

# Another size: refused with both sizes, nothing changed.
mkdir -p "$MNT"
if "$BIN" mount "$MNT" --cluster "$dir/cluster.toml" --scheme hydra-8+2-d1 --size 32MiB \
  --client-id "$id" >"$dir/other.out" 2>"$dir/other.err"; then
  fail "mounted a kept 64 MiB file system as 32 MiB"
fi
grep -q '32' "$dir/other.err" && grep -q '64' "$dir/other.err" ||
  fail "the size refusal does not name both sizes: $(cat "$dir/other.err")"

# free releases what the ten live nodes hold, and fails saying the two dead ones were not asked.
if "$BIN" free --cluster "$dir/cluster.toml" --client-id "$id" >"$dir/free.out" 2>"$dir/free.err"; then
  fail "free succeeded though nodes 0 and 5 could not be asked"
fi
grep -q '^released ' "$dir/free.out" || fail "free did not release: $(cat "$dir/free.out" "$dir/free.err")"
grep -q 'node(s) 0, 5 could not be asked' "$dir/free.err" || fail "free did not name the nodes it missed: $(cat "$dir/free.err")"
[ "$(slabs_held)" -eq 0 ] || fail "$(slabs_held) slabs left after free"
echo "PASS mount_client_id"
