#!/usr/bin/env bash
# An ext4 file system on the export, through nbdfuse and a loop device (the path for hosts
# without the nbd kernel module): a tree of files is written while r = 2 memory nodes are
# SIGKILLed; after unmounting, a fresh nbdfuse and loop device see a file system that fsck
# finds clean, with every file intact.
set -euo pipefail
. "$(dirname "$0")/lib/nbd.sh"
[ "$(id -u)" -eq 0 ] || skip "needs root for losetup and mount"
[ -e /dev/fuse ] || skip "no /dev/fuse"
[ -e /dev/loop-control ] || skip "no loop devices"
need nbdfuse libnbd-bin
need mkfs.ext4 e2fsprogs
need python3 python3
fuse="$dir/fuse"
mnt="$dir/mnt"
mkdir -p "$fuse" "$mnt"
loop=""
fuse_pid=""

attach() {
  nbdfuse -P "$dir/nbdfuse.pid" "$fuse/disk" "$URI" &
  fuse_pid=$!
  for _ in $(seq 100); do [ -s "$dir/nbdfuse.pid" ] && break; sleep 0.1; done
  [ -e "$fuse/disk" ] || { echo "FAIL: nbdfuse did not mount"; exit 1; }
  loop=$(losetup --find --show "$fuse/disk")
}
detach() {
  if mountpoint -q "$mnt"; then umount "$mnt"; fi
  if [ -n "$loop" ]; then losetup -d "$loop"; loop=""; fi
  if mountpoint -q "$fuse"; then umount "$fuse"; fi
  rm -f "$dir/nbdfuse.pid"
  if [ -n "$fuse_pid" ]; then wait "$fuse_pid" 2>/dev/null || true; fuse_pid=""; fi
}
cleanup_fs() {
  detach || true
  nbd_cleanup
}
trap 'trap - ERR; cleanup_fs' EXIT

NODES=12 start_export 256MiB
attach
mkfs.ext4 -q -F "$loop"
mount "$loop" "$mnt"
echo "ext4 on $loop over nbdfuse; writing files while killing 2 memory nodes"
python3 - "$mnt" "${NODE_PIDS[3]}" "${NODE_PIDS[7]}" <<'PY'
import hashlib, os, random, signal, sys, time
mnt, victims = sys.argv[1], [int(p) for p in sys.argv[2:]]
rng = random.Random(7)
sums = []
for i in range(240):
    d = os.path.join(mnt, f"dir{i % 12}", f"sub{i % 5}")
    os.makedirs(d, exist_ok=True)
    data = rng.randbytes(rng.choice([100, 4096, 5000, 65536, 300_000, 1_000_000]))
    path = os.path.join(d, f"file{i}")
    with open(path, "wb") as f:
        f.write(data)
    sums.append((path, hashlib.sha256(data).hexdigest()))
    if i in (60, 120):
        os.sync()  # push data through NBD before and between the kills
    if i in (80, 140):
        os.kill(victims.pop(0), signal.SIGKILL)
        print(f"  SIGKILLed a memory node after {i + 1} files", flush=True)
with open(os.path.join(os.path.dirname(mnt), "sums"), "w") as f:
    for p, s in sums:
        f.write(f"{s}  {p}\n")
print(f"  wrote {len(sums)} files, {sum(os.path.getsize(p) for p, _ in sums) >> 20} MiB")
PY
sync
detach
echo "unmounted; attaching a fresh nbdfuse and loop device (no cache left on this side)"
attach
fsck.ext4 -f -n "$loop" || { echo "FAIL: fsck found errors"; exit 1; }
mount -o ro "$loop" "$mnt"
sha256sum --quiet -c "$dir/sums" || { echo "FAIL: files differ after the node kills"; exit 1; }
echo "every file intact after 2 memory nodes were killed"
detach
stop_export
echo "PASS nbd_ext4_node_kills"
