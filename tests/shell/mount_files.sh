#!/usr/bin/env bash
# `hydramem mount` with the ordinary tools, on hydra-8+2-d1 and on rep2 against real memory
# nodes: byte-exact round trips of sizes around page boundaries (read back past the page
# cache), directories, renames, links, truncation, preallocation and holes, O_DIRECT, mmap,
# df; both ways to stop it (umount, SIGTERM) release the remote memory; and SIGTERM while a
# loop device uses a file leaves it mounted, says why, and unmounts once the device is gone.
set -euo pipefail
. "$(dirname "$0")/lib/mount.sh"
need_mount
need python3 python3
need fallocate util-linux
need losetup mount
src="$dir/src"
mkdir -p "$src"

# same FILE EXPECTED: FILE in the mount reads back as EXPECTED, from the cluster (O_DIRECT
# skips the page cache) and through the page cache.
same() {
  dd if="$1" iflag=direct bs=1M status=none | cmp -s - "$2" || fail "$1 read with O_DIRECT differs from $2"
  cmp -s "$1" "$2" || fail "$1 differs from $2"
}

# blocks_used: df's Used of the mount, in KiB.
blocks_used() { df -k --output=used "$MNT" | tail -n 1 | tr -d ' '; }

sizes=(0 1 4095 4096 4097 $((1048576 + 3)) $((20 << 20)))
for s in "${sizes[@]}"; do head -c "$s" /dev/urandom >"$src/f$s"; done

exercise() {
  local scheme=$1 s
  # df shows the size asked for.
  [ "$(df -B1 --output=size "$MNT" | tail -n 1 | tr -d ' ')" -eq $((512 << 20)) ] || fail "df does not show 512 MiB"
  local used0
  used0=$(blocks_used)

  # Round trips: cp, dd with block sizes that are not pages, sha256sum.
  for s in "${sizes[@]}"; do
    cp "$src/f$s" "$MNT/cp$s"
    dd if="$src/f$s" of="$MNT/dd$s" bs=1000 status=none
    [ "$(stat -c %s "$MNT/cp$s")" -eq "$s" ] || fail "cp$s has the wrong size"
  done
  sync
  echo 3 >/proc/sys/vm/drop_caches
  for s in "${sizes[@]}"; do
    same "$MNT/cp$s" "$src/f$s"
    [ "$(dd if="$MNT/dd$s" bs=777 status=none | sha256sum)" = "$(sha256sum <"$src/f$s")" ] || fail "dd$s differs"
  done
  [ "$(blocks_used)" -ge $((used0 + 2 * 20480)) ] || fail "df's Used did not grow by the 40 MiB written"
  echo "  $scheme: round trips of ${sizes[*]} bytes exact (cp, dd, O_DIRECT reads)"

  # Directories, renames, links.
  mkdir -p "$MNT/a/b" "$MNT/c"
  cp "$src/f4097" "$MNT/a/b/x"
  mv "$MNT/a/b/x" "$MNT/c/y"
  [ ! -e "$MNT/a/b/x" ] && same "$MNT/c/y" "$src/f4097" || fail "mv across directories"
  cp "$src/f1" "$MNT/c/z"
  mv "$MNT/c/z" "$MNT/c/y"
  same "$MNT/c/y" "$src/f1"
  [ "$(ls "$MNT/c")" = y ] || fail "mv onto an existing file left $(ls "$MNT/c")"
  ln "$MNT/c/y" "$MNT/a/hard"
  [ "$(stat -c %h "$MNT/a/hard")" -eq 2 ] || fail "a hard link does not count 2 links"
  ln -s ../c/y "$MNT/a/soft"
  [ "$(readlink "$MNT/a/soft")" = ../c/y ] && same "$MNT/a/soft" "$src/f1" || fail "symlink"
  rm "$MNT/c/y"
  same "$MNT/a/hard" "$src/f1"
  [ "$(stat -c %h "$MNT/a/hard")" -eq 1 ] || fail "the link count did not drop after rm"
  [ ! -e "$MNT/a/soft" ] || fail "a dangling symlink still resolves"
  ! rmdir "$MNT/a" 2>/dev/null || fail "rmdir removed a directory that is not empty"
  ! mv "$MNT/a" "$MNT/a/b/inside" 2>/dev/null || fail "a directory moved into itself"
  mv "$MNT/a" "$MNT/c/a2"
  rm "$MNT/c/a2/hard" "$MNT/c/a2/soft"
  rmdir "$MNT/c/a2/b" "$MNT/c/a2" "$MNT/c"
  [ -z "$(ls -A "$MNT" | grep -v -E '^(cp|dd)[0-9]+$')" ] || fail "left behind: $(ls -A "$MNT")"
  echo "  $scheme: mkdir, mv (across directories, onto a file), ln, ln -s, rm, rmdir"

  # Truncation down (within a page) and up: zeros after the cut, also in its last page.
  cp "$src/f$((1048576 + 3))" "$MNT/t"
  truncate -s 5000 "$MNT/t"
  truncate -s 20000 "$MNT/t"
  { head -c 5000 "$src/f$((1048576 + 3))"; head -c 15000 /dev/zero; } >"$dir/t.expected"
  echo 3 >/proc/sys/vm/drop_caches
  same "$MNT/t" "$dir/t.expected"
  echo "  $scheme: truncate down and up reads zeros after the cut"

  # Preallocation, and holes punched whole and in parts of pages.
  fallocate -l 8MiB "$MNT/pre"
  [ "$(stat -c %s "$MNT/pre")" -eq $((8 << 20)) ] && [ "$(du -k "$MNT/pre" | cut -f1)" -eq 8192 ] ||
    fail "fallocate -l 8MiB: size $(stat -c %s "$MNT/pre"), du $(du -k "$MNT/pre")"
  head -c $((8 << 20)) /dev/zero >"$dir/zeros"
  same "$MNT/pre" "$dir/zeros"
  head -c $((4 << 20)) /dev/urandom >"$dir/p"
  cp "$dir/p" "$MNT/p"
  local du0
  du0=$(du -k "$MNT/p" | cut -f1)
  fallocate --punch-hole -o 1MiB -l 1MiB "$MNT/p"
  fallocate --punch-hole -o 5000 -l 10000 "$MNT/p"
  dd if=/dev/zero of="$dir/p" bs=1M seek=1 count=1 conv=notrunc status=none
  dd if=/dev/zero of="$dir/p" bs=1 seek=5000 count=10000 conv=notrunc status=none
  echo 3 >/proc/sys/vm/drop_caches
  same "$MNT/p" "$dir/p"
  [ "$(stat -c %s "$MNT/p")" -eq $((4 << 20)) ] || fail "punching holes changed the size"
  [ "$(du -k "$MNT/p" | cut -f1)" -le $((du0 - 1024)) ] || fail "du did not shrink after punching 1 MiB: $du0 → $(du -k "$MNT/p")"
  echo "  $scheme: fallocate -l (zeros, du 8 MiB), --punch-hole (zeros, du shrank by 1 MiB+)"

  # O_DIRECT writes, whole and page-sized requests.
  dd if="$src/f$((20 << 20))" of="$MNT/direct" bs=1M count=8 oflag=direct status=none
  dd if="$src/f$((20 << 20))" of="$MNT/direct" bs=4096 seek=2048 skip=2048 count=256 oflag=direct conv=notrunc status=none
  head -c $((9 << 20)) "$src/f$((20 << 20))" >"$dir/direct.expected"
  same "$MNT/direct" "$dir/direct.expected"
  echo "  $scheme: O_DIRECT dd (1 MiB and 4 KiB requests) exact"

  # mmap: write through a shared map, msync, read back with plain reads.
  python3 - "$MNT/mapped" "$dir/mapped.expected" <<'PY'
import mmap, os, random, sys
path, expected = sys.argv[1:]
size = 3 * 4096 + 100
rng = random.Random(5)
want = bytearray(size)
with open(path, "wb") as f:
    f.truncate(size)
with open(path, "r+b") as f:
    m = mmap.mmap(f.fileno(), size)
    for off, n in [(0, 10), (4090, 20), (8192, 4096), (size - 50, 50)]:
        b = rng.randbytes(n)
        m[off:off + n] = b
        want[off:off + n] = b
    m.flush()
    m.close()
with open(expected, "wb") as f:
    f.write(want)
with open(path, "rb") as f:
    assert f.read() == want, "a plain read differs from what was written through the map"
PY
  echo 3 >/proc/sys/vm/drop_caches
  same "$MNT/mapped" "$dir/mapped.expected"
  echo "  $scheme: mmap writes, msync, plain read back exact"

  # df's Used shrinks when the files go.
  local used1
  used1=$(blocks_used)
  rm -f "$MNT"/*
  [ "$(blocks_used)" -le $((used1 - 40000)) ] && [ "$(blocks_used)" -eq "$used0" ] ||
    fail "df's Used did not shrink back after rm: $used1 → $(blocks_used) (empty: $used0)"
  echo "  $scheme: df's Used grew to $((used1 >> 10)) MiB and shrank back to $((used0 >> 10)) MiB"
}

NODES=10 start_nodes

mount_fs --scheme hydra-8+2-d1 --size 512MiB
exercise hydra-8+2-d1
[ "$(slabs_held)" -gt 0 ] || fail "the nodes hold no slab while mounted"
stop_mount umount
[ "$(slabs_held)" -eq 0 ] || fail "the nodes still hold $(slabs_held) slabs after umount"
echo "stopped by umount: exit 0, remote memory released, no slab left on the nodes"

mount_fs --scheme rep2 --size 512MiB
exercise rep2
stop_mount SIGTERM
[ "$(slabs_held)" -eq 0 ] || fail "the nodes still hold $(slabs_held) slabs after SIGTERM"
echo "stopped by SIGTERM: exit 0, remote memory released, no slab left on the nodes"

# SIGTERM while a loop device is attached to one of the files: it keeps serving, says why,
# and unmounts by itself once the loop device is detached.
mount_fs --scheme hydra-8+2-d1 --size 512MiB
fallocate -l 64MiB "$MNT/disk"
attach_loop "$MNT/disk" --direct-io=on
loop=$LOOP
kill -TERM "$mount_pid"
wait_until 30 grep -q "cannot unmount $MNT.*still serving it" "$dir/mount.err" ||
  fail "no 'cannot unmount ... still serving it' after SIGTERM with $loop attached"
mountpoint -q "$MNT" && kill -0 "$mount_pid" || fail "the mount went away while $loop used it"
dd if=/dev/urandom of="$loop" bs=1M count=4 oflag=direct status=none || fail "$loop stopped working after SIGTERM"
echo "SIGTERM with $loop attached: still mounted and serving; the log says why"
detach_loops
status=0
timeout 30 tail --pid="$mount_pid" -f /dev/null || fail "still running 30 s after losetup -d"
wait "$mount_pid" || status=$?
mount_pid=""
[ "$status" -eq 0 ] || fail "exit status $status after the deferred unmount"
! mountpoint -q "$MNT" || fail "still mounted after losetup -d"
grep -q 'remote memory released' "$dir/mount.out" || fail "no release after the deferred unmount"
[ "$(slabs_held)" -eq 0 ] || fail "the nodes still hold $(slabs_held) slabs after the deferred unmount"
echo "after losetup -d: unmounted by itself, exit 0, remote memory released"
echo "PASS mount_files"
