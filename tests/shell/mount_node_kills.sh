#!/usr/bin/env bash
# hydra-8+2-d1 on 12 memory nodes started one by one: files of random data fill the mount;
# after two nodes are SIGKILLed every file reads back exactly (from the cluster, page cache
# dropped). Then more splits of one range are lost than the scheme tolerates: a node holding
# a split of a range already down two splits is SIGKILLed (the nodes donate just what the files
# need, so most lost splits have nowhere to be regenerated; if one range was regenerated anyway,
# as many of its holders as it takes). Every file then either reads back exactly or its read
# fails with an I/O error — never other bytes — at least one read fails, and the rest of the
# file system keeps working.
set -euo pipefail
. "$(dirname "$0")/lib/mount.sh"
need_mount
need python3 python3

# ranges: "RANGE NODE NODE ..." for every range of the mount: the up nodes holding its splits
# (from the slab tags hydramem status shows: range << 8 | split under the scheme's magic).
ranges() {
  "$BIN" status --cluster "$dir/cluster.toml" --json | python3 -c '
import json, sys
held = {}
for n in json.load(sys.stdin):
    for s in n.get("slabs", []):
        held.setdefault((int(s["tag"]) >> 8) & 0xFFFFFFFF, set()).add(n["id"])
for r in sorted(held):
    print(r, *sorted(held[r]))
'
}
regenerating() {
  "$BIN" status --cluster "$dir/cluster.toml" | grep -q '[1-9][0-9]* slab regenerations in progress'
}
# settled: no regeneration in progress and the same placement as 1.5 s ago (longer than the
# client's retry period for splits that have no node to move to).
settled() {
  regenerating && return 1
  local before
  before=$(ranges)
  sleep 1.5
  ! regenerating && [ "$(ranges)" = "$before" ]
}

# check_files: every file reads back from the cluster; prints "OK FAILED" counts and fails
# the test on different bytes or on any error but EIO.
check_files() {
  local i ok=0 failed=0 out
  sync
  echo 3 >/proc/sys/vm/drop_caches
  for i in "${!SUMS[@]}"; do
    if out=$(timeout 120 sha256sum "$MNT/f$i" 2>&1); then
      [ "${out%% *}" = "${SUMS[$i]}" ] || fail "f$i read back other bytes: $out, expected ${SUMS[$i]}"
      ok=$((ok + 1))
    else
      grep -q 'Input/output error' <<<"$out" || fail "reading f$i failed with something else than EIO: $out"
      failed=$((failed + 1))
    fi
  done
  echo "$ok $failed"
}

NODES=12 NODE_CAPACITY=40MiB start_nodes
# Without --size: as large as the 12 × 40 MiB can hold as hydra 8+2 (384 MiB); 11 files of
# 32 MiB fill 11 of its 12 ranges.
mount_fs --scheme hydra-8+2-d1
SUMS=()
for i in $(seq 0 10); do
  SUMS[i]=$(head -c 32MiB /dev/urandom | tee "$MNT/f$i" | sha256sum | cut -d' ' -f1)
done
echo "wrote 11 files of 32 MiB over $(ranges | wc -l) ranges on 12 nodes"

kill_node 3
kill_node 7
read -r ok failed <<<"$(check_files)"
[ "$failed" -eq 0 ] && [ "$ok" -eq 11 ] || fail "$failed of 11 files failed to read after 2 nodes were killed"
echo "SIGKILLed nodes 3 and 7: all 11 files read back exactly"

wait_until 60 settled || fail "the placement did not settle after the kills"
# The range with the fewest splits left, and as many of its holders as leave it fewer than k.
read -r range holders <<<"$(ranges | awk '{print NF - 1, $0}' | sort -n | head -n 1 | cut -d' ' -f2-)"
read -ra holders <<<"$holders"
victims=("${holders[@]:0:$((${#holders[@]} - 7))}")
for v in "${victims[@]}"; do kill_node "$v"; done
echo "range $range had ${#holders[@]} of its 10 splits left; SIGKILLed node(s) ${victims[*]} holding them"

read -r ok failed <<<"$(check_files)"
[ "$failed" -ge 1 ] || fail "no read failed with range $range down to 7 splits"
echo "beyond the tolerance: $ok files read back exactly, $failed failed with EIO, none read other bytes"

kill -0 "$mount_pid" || fail "the mount process died"
mountpoint -q "$MNT" || fail "no longer mounted"
ls -la "$MNT" >/dev/null && stat "$MNT/f0" >/dev/null || fail "ls or stat failed"
mkdir "$MNT/after" && touch "$MNT/after/empty" && mv "$MNT/after/empty" "$MNT/after/moved" || fail "mkdir, touch or mv failed"
rm "$MNT"/f* && rm -r "$MNT/after" || fail "rm failed"
[ -z "$(ls -A "$MNT")" ] || fail "left behind: $(ls -A "$MNT")"
df "$MNT" >/dev/null || fail "df failed"
echo "the file system keeps working: ls, stat, mkdir, touch, mv, rm, df; the mount process is alive"
stop_mount SIGTERM
echo "SIGTERM: exit 0, unmounted, remote memory released on the nodes still up"
echo "PASS mount_node_kills"
