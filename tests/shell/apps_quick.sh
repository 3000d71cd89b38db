#!/usr/bin/env bash
# scripts/bench-apps --quick: redis limited to half its peak memory swaps through a RAM file and
# a hydra 8+2 file in `hydramem mount` (loop devices), and its data set's DEBUG DIGEST after
# swapping out and in is the unlimited run's; swap was used. No timing is checked. Nothing is
# left behind: no swap, loop device, mount, cgroup or process. With two CPUs or more, the
# memory nodes run on the last it may use (--node-cpus) and the rest on the others, as taskset
# reads them back; a CPU list naming a CPU that does not exist is refused before anything
# starts.
set -euo pipefail
. "$(dirname "$0")/lib/nbd.sh"
[ "$(id -u)" -eq 0 ] || skip "needs root for swapon, losetup and cgroups"
[ -e /dev/fuse ] || skip "no /dev/fuse"
[ -w /sys/fs/cgroup/memory ] || skip "no memory cgroup v1 hierarchy"
[ -e /dev/loop-control ] || skip "no loop devices (/dev/loop-control)"
[ -x "$BIN" ] || { echo "FAIL: $BIN is missing (cargo build --release -p hydramem)"; exit 1; }

# The harness's scratch directory is under $dir/tmp (TMPDIR): all it sets up is named by it.
leftovers() {
  local bad=""
  [ -z "$(ls -d /sys/fs/cgroup/memory/hydramem-apps-* 2>/dev/null)" ] || bad="$bad cgroup"
  ! grep -q "$dir/tmp" /proc/swaps || bad="$bad swap"
  ! losetup -a | grep -q "$dir/tmp" || bad="$bad loop-device"
  ! grep -q "$dir/tmp" /proc/mounts || bad="$bad mount"
  ! pgrep -f "$dir/tmp" >/dev/null || bad="$bad process"
  [ -z "$(ls -A "$dir/tmp")" ] || bad="$bad files"
  echo "$bad"
}
# The harness waits while another swap device is active; a test should not.
[ "$(awk 'NR > 1' /proc/swaps | wc -l)" -eq 0 ] || skip "another swap device is active: $(awk 'NR > 1 {print $1}' /proc/swaps)"

status=0
mkdir "$dir/tmp"
# The highest CPU this test may run on: the memory nodes' with --node-cpus, if one is left.
read -r last allowed < <(python3 -c 'import os; a = os.sched_getaffinity(0); print(max(a), len(a))')
if [ "$allowed" -ge 2 ]; then pin=(--node-cpus "$last"); else pin=(); fi
HYDRAMEM_BIN="$BIN" TMPDIR="$dir/tmp" scripts/bench-apps --quick "${pin[@]}" --out "$dir/out" 2>&1 | tee "$dir/run.log" || status=$?
[ "$status" -eq 0 ] || { echo "FAIL: bench-apps --quick exited with $status"; exit 1; }
if [ "$allowed" -ge 2 ]; then
  # What the processes got, as taskset read it back, not only what was asked: the nodes the
  # last CPU alone, the script (and all it started) every other CPU and not that one.
  nodes=$(sed -n "s/^memory nodes: pid [0-9]*'s current affinity list: //p" "$dir/out/cpus.txt")
  script=$(sed -n "s/^this script: pid [0-9]*'s current affinity list: //p" "$dir/out/cpus.txt")
  want=$(python3 -c 'import os, sys; print(",".join(str(c) for c in sorted(os.sched_getaffinity(0) - {int(sys.argv[1])})))' "$last")
  if [ "$nodes" != "$last" ] || [ "$(python3 scripts/lib/apps/cpus.py split "$script" 2>/dev/null | head -1)" != "$want" ]; then
    echo "FAIL: --node-cpus $last: the nodes got CPUs '$nodes' (want $last), the rest '$script' (want $want)"
    exit 1
  fi
fi
status=0
HYDRAMEM_BIN="$BIN" TMPDIR="$dir/tmp" scripts/bench-apps --quick --node-cpus 4096 --out "$dir/out2" >"$dir/bad.log" 2>&1 || status=$?
if [ "$status" -ne 2 ] || ! grep -q "CPU 4096 ('4096') is past the highest this run may use" "$dir/bad.log" || [ -e "$dir/out2" ]; then
  echo "FAIL: --node-cpus 4096 (no such CPU) gave status $status, not a refusal before anything ran: $(tail -3 "$dir/bad.log")"
  exit 1
fi
for b in local ram-mount hydra-mount; do
  grep -Eq "redis +$b .*data ok: digest" "$dir/run.log" || { echo "FAIL: no intact data set for $b"; exit 1; }
done
for b in ram-mount hydra-mount; do
  grep -Eq "redis +$b .*up to [1-9][0-9]* MiB swapped" "$dir/run.log" || { echo "FAIL: $b never used its swap device"; exit 1; }
done
for f in results.csv summary.txt; do
  [ -s "$dir/out/$f" ] || { echo "FAIL: no $f in --out"; exit 1; }
done
[ -z "$(leftovers)" ] || { echo "FAIL: left behind:$(leftovers)"; exit 1; }
echo "PASS apps_quick"
