#!/usr/bin/env bash
# scripts/swap, swap through `hydramem mount`: `run` pages an unmodified program in a memory
# cgroup limited to half its working set through the swap file and computes the right result;
# `on` on memory nodes of a cluster file, `status` and `off` (twice: idempotent); `run`
# interrupted (Ctrl-C) while the program runs tears everything down with exit status 130.
# Nothing is left behind: no swap, loop device, mount, cgroup, process or state.
set -euo pipefail
. "$(dirname "$0")/lib/mount.sh"
need_mount
[ -w /sys/fs/cgroup/memory ] || skip "no memory cgroup v1 hierarchy"
need python3 python3
export HYDRAMEM_BIN="$BIN" HYDRAMEM_SWAP_STATE="$dir/state"
swap_cleanup() {
  [ -e "$dir/state" ] && scripts/swap off >/dev/null 2>&1
  mount_cleanup
}
trap 'trap - ERR; swap_cleanup' EXIT

leftovers() {
  local bad=""
  [ -z "$(ls -d /sys/fs/cgroup/memory/hydramem-swap-* 2>/dev/null)" ] || bad="$bad cgroup"
  ! grep -q "$dir/state" /proc/swaps || bad="$bad swap"
  [ -z "$(losetup -n -O NAME -j "$dir/state/mnt/swap" 2>/dev/null)" ] || bad="$bad loop-device"
  ! grep -q " $dir/state/mnt " /proc/mounts || bad="$bad mount"
  ! pgrep -f "$dir/state" >/dev/null || bad="$bad process"
  [ ! -e "$dir/state" ] || bad="$bad state"
  echo "$bad"
}
# Swap devices on loop devices must be ours: a swap file of an earlier run would be used too.
! grep -q '/dev/loop' /proc/swaps || skip "a loop device is already swap here: $(grep /dev/loop /proc/swaps)"
[ -z "$(ls -d /sys/fs/cgroup/memory/hydramem-swap-* 2>/dev/null)" ] || skip "a cgroup of an earlier run is still there"

# run: the default program, nodes of its own.
scripts/swap run --working-set 128MiB --swap 512MiB | tee "$dir/run.log"
grep -q 'sum and 20000 samples correct' "$dir/run.log" || fail "wrong program result"
grep -Eq 'up to ([1-9][0-9]*) MiB were on the swap device' "$dir/run.log" || fail "the program never used the swap device"
grep -q 'remote memory released' "$dir/run.log" || fail "run did not release the remote memory"
[ -z "$(leftovers)" ] || fail "left behind by run:$(leftovers)"

# on / status / off on the nodes of a cluster file.
NODES=10 start_nodes
scripts/swap on --cluster "$dir/cluster.toml" --scheme rep2 --size 256MiB --priority 7 | tee "$dir/on.log"
loop=$(sed -n 's/^swap: on \(\/dev\/loop[0-9]*\):.*/\1/p' "$dir/on.log")
[ -n "$loop" ] && [ "$(awk -v d="$loop" '$1 == d {print $3, $5}' /proc/swaps)" = "262140 7" ] ||
  fail "on: $loop is not swap of 256 MiB at priority 7: $(cat /proc/swaps)"
! grep -q 'memory nodes on this machine' "$dir/on.log" || fail "on started nodes of its own with --cluster"
scripts/swap status | tee "$dir/status.log"
grep -q "^swap: on $loop: 255 MiB, [0-9]* MiB used, priority 7; rep2" "$dir/status.log" || fail "status does not show the swap"
! scripts/swap on --size 64MiB >/dev/null 2>&1 || fail "a second on succeeded"
grep -q "^$loop " /proc/swaps || fail "a refused second on removed the first"
scripts/swap off | tee "$dir/off.log"
for said in "swap off $loop" "loop device $loop detached" "remote memory released" "removed $dir/state"; do
  grep -q "$said" "$dir/off.log" || fail "off did not say '$said'"
done
[ -z "$(leftovers)" ] || fail "left behind by off:$(leftovers)"
[ "$(slabs_held)" -eq 0 ] || fail "the nodes still hold $(slabs_held) slabs after off"
scripts/swap off | grep -q 'nothing to remove' || fail "a second off did not say there is nothing to remove"
status=0
scripts/swap status >/dev/null || status=$?
[ "$status" -eq 1 ] || fail "status after off exited with $status, not 1"
echo "on, status, off (twice): swap of 256 MiB as rep2 at priority 7 on the nodes of a cluster file, then nothing left"

# run interrupted while the program runs. Job control, so that the background script receives
# SIGINT as it would from a terminal's Ctrl-C.
set -m
scripts/swap run --working-set 512MiB --swap 1GiB >"$dir/int.log" 2>&1 &
pid=$!
wait_until 120 grep -q 'running in a memory cgroup' "$dir/int.log" || { cat "$dir/int.log"; fail "the program never started"; }
# Until the program has pages on the swap device.
swapped() { [ "$(awk '$1 ~ /^\/dev\/loop/ && $4 > 0' /proc/swaps)" ]; }
wait_until 60 swapped || fail "nothing was swapped out"
interrupt "$pid" # SIGINT, as Ctrl-C would send (SIGTERM where SIGINT is ignored)
status=0
wait "$pid" || status=$?
set +m
cat "$dir/int.log"
[ "$status" -eq 130 ] || fail "the interrupted run exited with $status, not 130"
grep -q 'interrupted' "$dir/int.log" && grep -q "removed $dir/state" "$dir/int.log" || fail "no teardown after the interrupt"
[ -z "$(leftovers)" ] || fail "left behind after the interrupt:$(leftovers)"
echo "PASS mount_swap"
