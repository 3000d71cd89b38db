#!/usr/bin/env bash
# scripts/bench-nbd with tiny settings (one round, 1 s runs, a 64 MiB export): every target
# (the three hydramem schemes and nbdkit memory, and the nbdfuse + loop targets when this
# machine can run them) has every workload in results.csv and results.json, each with IOPS
# above zero, and nothing is left mounted or attached.
set -euo pipefail
. "$(dirname "$0")/lib/nbd.sh"
need_bench_nbd

leftovers() {
  local bad=""
  ! grep -q nbdfuse /proc/mounts || bad="$bad fuse-mount"
  ! losetup -a 2>/dev/null | grep -q "$dir" || bad="$bad loop-device"
  echo "$bad"
}

HYDRAMEM_BIN="$BIN" scripts/bench-nbd --rounds 1 --runtime 1 --ramp 0 --size 64MiB \
  --working-set 16MiB --out "$dir/out" | tee "$dir/run.log"
expect=(hydra-8+2 rep2 single nbdkit-memory)
if grep -q 'SKIP the nbdfuse + loop targets' "$dir/run.log"; then
  echo "(the nbdfuse + loop targets were skipped, as the script said)"
else
  expect+=(hydra-8+2-loop nbdkit-memory-loop)
fi
python3 - "$dir/out" "${expect[@]}" <<'PY'
import csv, json, sys
out, targets = sys.argv[1], sys.argv[2:]
workloads = ["randread-qd1", "randread-qd16", "randwrite-qd1", "randwrite-qd16"]
rows = {(r["target"], r["workload"]): r for r in csv.DictReader(open(f"{out}/results.csv"))}
medians = {(m["target"], m["workload"]): m for m in json.load(open(f"{out}/results.json"))["medians"]}
for t in targets:
    for w in workloads:
        assert (t, w) in rows, f"no {t} {w} in results.csv"
        assert float(rows[(t, w)]["iops"]) > 0, f"{t} {w}: IOPS {rows[(t, w)]['iops']}"
        assert float(rows[(t, w)]["clat_p50_us"]) > 0, f"{t} {w}: no latency"
        assert medians[(t, w)]["iops"] > 0, f"{t} {w} in results.json"
assert len(rows) == len(targets) * len(workloads), f"unexpected cells: {sorted(rows)}"
print(f"{len(rows)} cells ({len(targets)} targets × {len(workloads)} workloads), every one with IOPS > 0")
PY
[ -z "$(leftovers)" ] || { echo "FAIL: left behind:$(leftovers)"; exit 1; }
echo "PASS nbd_bench_smoke"
