#!/usr/bin/env bash
# `hydramem up` + `hydramem status` + `hydramem bench` as a user runs them: the bench runs every
# scheme against the same 12 nodes, writes JSON, finds no wrong bytes, and measures 1.25 remote
# bytes per data byte for 8+2 from the nodes' own counters; `up` cleans up on SIGTERM.
set -euo pipefail
BIN=${HYDRAMEM_BIN:-target/release/hydramem}
dir=$(mktemp -d)
cluster="$dir/cluster.toml"
up_pid=""
cleanup() { [ -n "$up_pid" ] && kill "$up_pid" 2>/dev/null; rm -rf "$dir"; }
trap cleanup EXIT

"$BIN" up --nodes 12 --slab-size 4MiB --capacity 256MiB --cluster "$cluster" --log warn >"$dir/up.log" &
up_pid=$!
for _ in $(seq 100); do [ -f "$cluster" ] && break; sleep 0.1; done
[ -f "$cluster" ] || { echo "FAIL: up wrote no cluster file"; cat "$dir/up.log"; exit 1; }

"$BIN" status --cluster "$cluster" | tee "$dir/status.txt"
grep -q "12 nodes (12 up)" "$dir/status.txt" || { echo "FAIL: status does not show 12 nodes up"; exit 1; }

"$BIN" bench --cluster "$cluster" --pages 1024 --latency-ops 300 --seconds 0.5 --json "$dir/bench.json" --log warn
python3 - "$dir/bench.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
r = {x["scheme"]: x for x in d["results"]}
assert set(r) == {"hydra 8+2 Δ=1", "hydra 8+2 Δ=0", "replication ×2", "replication ×3", "single copy"}, r.keys()
for x in r.values():
    assert x["verify_errors"] == 0, x
    assert x["write_latency"]["samples"] == 300 and x["read_latency"]["samples"] == 300, x
assert abs(r["hydra 8+2 Δ=1"]["remote_bytes_per_data_byte"] - 1.25) < 1e-9, r["hydra 8+2 Δ=1"]
assert abs(r["replication ×3"]["remote_bytes_per_data_byte"] - 3.0) < 1e-9
assert abs(r["single copy"]["remote_bytes_per_data_byte"] - 1.0) < 1e-9
# A node's resident memory stays within 64 MiB of the slab memory it holds data in.
for x in r.values():
    assert x["node_overhead_max"] < 64 << 20, x
print("bench JSON checks passed")
PY

# The bench freed its slabs: the nodes hold nothing for it any more.
"$BIN" status --cluster "$cluster" --json | python3 -c '
import json, sys
nodes = json.load(sys.stdin)
assert all(n["health"] == "up" and not n["slabs"] for n in nodes), nodes
print("bench released every slab")'

kill -TERM "$up_pid"; wait "$up_pid"; up_pid=""
[ ! -f "$cluster" ] || { echo "FAIL: up left its cluster file"; exit 1; }
echo "PASS bench_against_up"
