#!/usr/bin/env bash
# scripts/nbd-swap: an unmodified program in a memory cgroup limited to half its working set
# pages through swap on hydramem (nbdfuse → loop → swapon) and computes the right result;
# interrupted with Ctrl-C (SIGINT) while the program runs, it tears everything down.
set -euo pipefail
. "$(dirname "$0")/lib/nbd.sh"
[ "$(id -u)" -eq 0 ] || skip "needs root for swapon, losetup and cgroups"
[ -e /dev/fuse ] || skip "no /dev/fuse"
[ -w /sys/fs/cgroup/memory ] || skip "no memory cgroup v1 hierarchy"
need nbdfuse libnbd-bin

leftovers() {
  local bad=""
  [ -z "$(ls -d /sys/fs/cgroup/memory/hydramem-swap-* 2>/dev/null)" ] || bad="$bad cgroup"
  ! grep -q '/loop' /proc/swaps || bad="$bad swap"
  ! grep -q 'nbdfuse' /proc/mounts || bad="$bad fuse-mount"
  echo "$bad"
}
[ -z "$(leftovers)" ] || skip "a swap device, nbdfuse mount or cgroup of an earlier run is still there: $(leftovers)"

HYDRAMEM_BIN="$BIN" scripts/nbd-swap --working-set 128MiB --swap 512MiB | tee "$dir/run.log"
grep -q 'sum and 20000 samples correct' "$dir/run.log" || { echo "FAIL: wrong program result"; exit 1; }
grep -Eq 'up to ([1-9][0-9]*) MiB were on the swap device' "$dir/run.log" ||
  { echo "FAIL: the program never used the swap device"; exit 1; }
[ -z "$(leftovers)" ] || { echo "FAIL: left behind:$(leftovers)"; exit 1; }

# Interrupted while the program runs. Job control, so that the background script receives
# SIGINT as it would from a terminal's Ctrl-C.
set -m
HYDRAMEM_BIN="$BIN" scripts/nbd-swap --working-set 512MiB --swap 1GiB >"$dir/int.log" 2>&1 &
pid=$!
for _ in $(seq 300); do grep -q '^3\. running' "$dir/int.log" && break; sleep 0.1; done
grep -q '^3\. running' "$dir/int.log" || { echo "FAIL: the program never started"; cat "$dir/int.log"; exit 1; }
sleep 2
interrupt "$pid" # SIGINT, as Ctrl-C would send (SIGTERM where SIGINT is ignored)
status=0
wait "$pid" || status=$?
set +m
cat "$dir/int.log"
[ "$status" -eq 130 ] || { echo "FAIL: interrupted script exited with $status, not 130"; exit 1; }
grep -q 'torn down' "$dir/int.log" || { echo "FAIL: no teardown after SIGINT"; exit 1; }
[ -z "$(leftovers)" ] || { echo "FAIL: left behind after SIGINT:$(leftovers)"; exit 1; }
echo "PASS nbd_swap"
