#!/usr/bin/env bash
# `hydramem bench --failures` runs paper Fig. 12's scenarios on a cluster of its own and writes
# them as JSON: healthy, one node slow, one node killed (split by regeneration), both schemes.
set -euo pipefail
BIN=${HYDRAMEM_BIN:-target/release/hydramem}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
"$BIN" bench --failures --pages 1024 --latency-ops 200 --rounds 2 --json "$dir/f.json" --log error
python3 - "$dir/f.json" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))["results"]
seen = {(r["scheme"], r["scenario"]) for r in rows}
for scheme in ("hydra 8+2 Δ=1", "replication ×2"):
    assert (scheme, "healthy") in seen, seen
    assert (scheme, "one node slow (+1 ms per reply)") in seen, seen
    assert any(s == scheme and sc.startswith("one node killed") for s, sc in seen), seen
for r in rows:
    assert r["read_latency"]["samples"] > 0 and r["write_latency"]["samples"] > 0, r
print(f"{len(rows)} scenario rows")
PY
echo "PASS bench_failures"
