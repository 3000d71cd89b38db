# Sourced by the tests/shell/mount_*.sh scripts: `hydramem mount` on memory nodes started one
# by one (lib/nbd.sh's start_nodes, so a script holds each node's pid), with everything a
# script sets up on the mount — loop devices, swap, the mount process — torn down on exit,
# whatever state the script stopped in. The scripts run from the repository root.
# shellcheck source=lib/nbd.sh
. "$(dirname "${BASH_SOURCE[0]}")/nbd.sh"
. scripts/lib/swap.sh # wait_until

MNT="$dir/mnt"
mount_pid=""
LOOPS=()

# fail MESSAGE: the test failed; say why, with the end of the mount's log.
fail() {
  echo "FAIL $(basename "$0" .sh): $1"
  [ -f "$dir/mount.err" ] && tail -n 20 "$dir/mount.err"
  exit 1
}


# need_mount: what every mount test needs (root, FUSE, the built binary), or a skip.
need_mount() {
  [ "$(id -u)" -eq 0 ] || skip "needs root to mount FUSE file systems"
  [ -e /dev/fuse ] || skip "no /dev/fuse"
  [ -x "$BIN" ] || fail "$BIN is missing (cargo build --release -p hydramem)"
}

# mount_fs [hydramem mount options...]: mounts the file system on $MNT (on the nodes of
# start_nodes unless the options say otherwise) and waits until it is mounted; its output is
# in $dir/mount.out and $dir/mount.err.
mount_fs() {
  mkdir -p "$MNT"
  "$BIN" mount "$MNT" --cluster "$dir/cluster.toml" "$@" >"$dir/mount.out" 2>"$dir/mount.err" &
  mount_pid=$!
  wait_until 30 mount_ready || fail "hydramem mount $* did not mount $MNT"
  head -n 1 "$dir/mount.out"
}
mount_ready() {
  mountpoint -q "$MNT" && return 0
  kill -0 "$mount_pid" 2>/dev/null || fail "hydramem mount exited before mounting"
  return 1
}

# attach_loop FILE [losetup options...]: sets LOOP to a new loop device on FILE, detached on
# exit (call it in the script's shell, not in $(...), so that the exit trap knows it).
attach_loop() {
  local file=$1
  shift
  LOOP=$(losetup "$@" --find --show "$file") || fail "losetup on $file failed"
  LOOPS+=("$LOOP")
}

# detach_loops: swap off and detach every loop device of attach_loop.
detach_loops() {
  local l
  for l in "${LOOPS[@]}"; do
    grep -q "^$l " /proc/swaps && swapoff "$l"
    losetup -d "$l" 2>/dev/null
  done
  LOOPS=()
}

# stop_mount HOW: stops the mount by `umount` or by `SIGTERM` and checks that the command
# exits 0, unmounted, and released its remote memory.
stop_mount() {
  local status=0
  if [ "$1" = umount ]; then umount "$MNT"; else kill -TERM "$mount_pid"; fi
  wait "$mount_pid" || status=$?
  mount_pid=""
  [ "$status" -eq 0 ] || fail "hydramem mount exited with $status after $1"
  ! mountpoint -q "$MNT" || fail "$MNT is still mounted after $1"
  grep -q 'remote memory released' "$dir/mount.out" || fail "no 'remote memory released' after $1"
}

# slabs_held: slabs the nodes of the cluster hold (hydramem status).
slabs_held() {
  "$BIN" status --cluster "$dir/cluster.toml" --json |
    python3 -c 'import json, sys; print(sum(len(n.get("slabs", [])) for n in json.load(sys.stdin)))'
}

mount_cleanup() {
  set +e
  trap '' INT TERM
  detach_loops
  if [ -n "$mount_pid" ]; then
    # umount first (the command then exits by itself); SIGTERM for the rest; lazily if busy.
    mountpoint -q "$MNT" && umount "$MNT" 2>/dev/null
    kill -TERM "$mount_pid" 2>/dev/null
    wait_until 30 eval '! kill -0 "$mount_pid" 2>/dev/null' || {
      umount -l "$MNT" 2>/dev/null
      kill -KILL "$mount_pid" 2>/dev/null
    }
    wait "$mount_pid" 2>/dev/null
  fi
  # Also a mount whose server died, which mountpoint(1) cannot stat.
  awk -v m="$MNT" '$2 == m {found = 1} END {exit !found}' /proc/mounts && umount -l "$MNT"
  nbd_cleanup
}
trap 'trap - ERR; mount_cleanup' EXIT
