#!/usr/bin/env bash
# scripts/bench-nbd's selection options with tiny settings: --targets picks the exports,
# --workloads any <rw>-<bs>-qd<N> (MiB/s, block size and depth in results.csv, and the block
# size comparison in the summary), and --base-bin adds hydra-base, this very binary serving
# the same scheme a second time against the same nodes, compared cell by cell. A base binary
# that cannot serve against the nodes, and hydra-base without one, stop the run saying why.
set -euo pipefail
. "$(dirname "$0")/lib/nbd.sh"
need_bench_nbd
tiny=(--rounds 1 --runtime 1 --ramp 0 --size 64MiB --working-set 16MiB --no-loop)

HYDRAMEM_BIN="$BIN" scripts/bench-nbd "${tiny[@]}" --out "$dir/out" --base-bin "$BIN" \
  --targets hydra,hydra-base,nbdkit-memory --workloads randread-4k-qd1,randread-16k-qd1,write-1m-qd2 |
  tee "$dir/run.log"
grep -q 'this build against the base binary' "$dir/run.log" || { echo "FAIL: no comparison with the base binary"; exit 1; }
grep -q 'randread QD1 vs 4 KiB' "$dir/run.log" || { echo "FAIL: no block size comparison"; exit 1; }
python3 - "$dir/out" <<'PY'
import csv, sys
rows = {(r["target"], r["workload"]): r for r in csv.DictReader(open(f"{sys.argv[1]}/results.csv"))}
want = {"randread-4k-qd1": (4096, 1), "randread-16k-qd1": (16384, 1), "write-1m-qd2": (1 << 20, 2)}
targets = ["hydra-8+2", "hydra-8+2-base", "nbdkit-memory"]
assert sorted(rows) == sorted((t, w) for t in targets for w in want), f"cells: {sorted(rows)}"
for (t, w), r in rows.items():
    assert float(r["iops"]) > 0 and float(r["mib_s"]) > 0, f"{t} {w}: {r}"
    assert (int(r["block_size"]), int(r["iodepth"])) == want[w], f"{t} {w}: {r}"
    assert abs(float(r["mib_s"]) - float(r["iops"]) * want[w][0] / (1 << 20)) <= 0.02 * float(r["mib_s"]) + 0.1, r
print(f"{len(rows)} cells, every one with IOPS and MiB/s > 0 at its block size and depth")
PY

printf '#!/bin/sh\n[ "$1" = --version ] && { echo "hydramem 0"; exit 0; }\necho "protocol version 9 is not supported" >&2\nexit 1\n' >"$dir/old"
chmod +x "$dir/old"
if HYDRAMEM_BIN="$BIN" scripts/bench-nbd "${tiny[@]}" --out "$dir/out2" --base-bin "$dir/old" \
  --targets hydra,hydra-base --workloads randread-qd1 >"$dir/old.log" 2>&1; then
  echo "FAIL: a base binary that cannot serve did not stop the run"; exit 1
fi
grep -q 'could not serve against the memory nodes.*protocol version 9' "$dir/old.log" ||
  { echo "FAIL: the failing base binary was not reported:"; cat "$dir/old.log"; exit 1; }
if scripts/bench-nbd --targets hydra-base >"$dir/nobase.log" 2>&1; then
  echo "FAIL: hydra-base without --base-bin ran"; exit 1
fi
grep -q 'needs --base-bin' "$dir/nobase.log" || { echo "FAIL:"; cat "$dir/nobase.log"; exit 1; }
echo "PASS nbd_bench_options"
