#!/usr/bin/env bash
# A memory node started with --metrics serves Prometheus text whose counters follow the traffic
# a real client sends it, and it stops cleanly on SIGTERM.
set -euo pipefail
BIN=${HYDRAMEM_BIN:-target/release/hydramem}
dir=$(mktemp -d)
node_pid=""
cleanup() { [ -n "$node_pid" ] && kill "$node_pid" 2>/dev/null; rm -rf "$dir"; }
trap cleanup EXIT

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$BIN" node --listen 127.0.0.1:0 --capacity 64MiB --slab-size 1MiB --metrics "127.0.0.1:$port" \
  --announce --log warn >"$dir/node.out" &
node_pid=$!
for _ in $(seq 100); do grep -q listening "$dir/node.out" 2>/dev/null && break; sleep 0.05; done
addr=$(sed -n 's/^listening //p' "$dir/node.out")
[ -n "$addr" ] || { echo "FAIL: node did not announce its address"; exit 1; }
printf 'slab_size = 1048576\n\n[[node]]\nid = 0\naddr = "%s"\n' "$addr" >"$dir/cluster.toml"

# 32 KiB requests: the throughput phases read and write 8 consecutive pages per call, which
# reach the node as runs of 8 splits.
"$BIN" bench --cluster "$dir/cluster.toml" --schemes single --pages 64 --latency-ops 20 \
  --seconds 0.2 --rounds 1 --depth 2 --request-size 32KiB --json "$dir/b.json" --log warn >/dev/null

python3 - "$port" <<'PY'
import sys, urllib.request
text = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics", timeout=5).read().decode()
def value(name):
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise SystemExit(f"FAIL: metric {name} missing:\n{text}")
writes = value("hydramem_node_write_entries_total")
reads = value("hydramem_node_read_entries_total")
assert writes >= 64 + 20, writes   # populate + QD1 writes
assert reads >= 20, reads
assert value("hydramem_node_slabs_allocated_total") >= 1
read_runs = value("hydramem_node_read_runs_total")
write_runs = value("hydramem_node_write_runs_total")
# QD1 latency requests are runs of one split; the batched throughput phase's are runs of 8.
assert reads >= 2 * read_runs, (reads, read_runs)
assert 0 < write_runs < writes, (writes, write_runs)
print(f"metrics ok: {writes:.0f} write entries in {write_runs:.0f} runs, "
      f"{reads:.0f} read entries in {read_runs:.0f} runs")
PY

kill -TERM "$node_pid"
wait "$node_pid" || { echo "FAIL: node exited with an error on SIGTERM"; exit 1; }
node_pid=""
echo "PASS node_metrics"
