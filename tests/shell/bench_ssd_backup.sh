#!/usr/bin/env bash
# The ssd-backup scheme (one remote copy plus a local backup file) as a user selects it:
# `hydramem bench --schemes single,ssd-backup` measures both side by side with no wrong
# bytes and one remote byte per data byte; `hydramem nbd --scheme ssd-backup` creates its
# backup file in --backup-dir and removes it when stopped; a --backup-dir it cannot use, and
# --client-id (which the local copy cannot outlive), are refused saying what to do.
set -euo pipefail
BIN=${HYDRAMEM_BIN:-target/release/hydramem}
dir=$(mktemp -d)
cluster="$dir/cluster.toml"
up_pid=""
nbd_pid=""
cleanup() {
  [ -n "$nbd_pid" ] && kill "$nbd_pid" 2>/dev/null
  [ -n "$up_pid" ] && kill "$up_pid" 2>/dev/null
  rm -rf "$dir"
}
trap cleanup EXIT
fail() { echo "FAIL bench_ssd_backup: $1"; exit 1; }

"$BIN" up --nodes 3 --slab-size 4MiB --capacity 64MiB --cluster "$cluster" --log warn >"$dir/up.log" &
up_pid=$!
for _ in $(seq 100); do [ -f "$cluster" ] && break; sleep 0.1; done
[ -f "$cluster" ] || { cat "$dir/up.log"; fail "up wrote no cluster file"; }

mkdir "$dir/backup"
"$BIN" bench --cluster "$cluster" --schemes single,ssd-backup --pages 512 --latency-ops 200 \
  --seconds 0.3 --rounds 2 --depth 4 --backup-dir "$dir/backup" --json "$dir/bench.json" --log warn
python3 - "$dir/bench.json" <<'PY'
import json, sys
r = {x["scheme"]: x for x in json.load(open(sys.argv[1]))["results"]}
assert set(r) == {"single copy", "single copy + SSD backup"}, r.keys()
for x in r.values():
    assert x["verify_errors"] == 0, x
    assert x["write_latency"]["samples"] == 200 and x["read_latency"]["samples"] == 200, x
    assert x["read_throughput"]["pages_per_s"] > 0 and x["write_throughput"]["pages_per_s"] > 0, x
    assert abs(x["remote_bytes_per_data_byte"] - 1.0) < 1e-9, x
print("bench JSON checks passed")
PY
[ -z "$(ls "$dir/backup")" ] || fail "bench left $(ls "$dir/backup") in --backup-dir"

"$BIN" nbd --cluster "$cluster" --scheme ssd-backup --size 16MiB --socket "$dir/nbd.sock" \
  --backup-dir "$dir/backup" --log warn >"$dir/nbd.log" 2>&1 &
nbd_pid=$!
for _ in $(seq 100); do [ -S "$dir/nbd.sock" ] && break; sleep 0.1; done
[ -S "$dir/nbd.sock" ] || { cat "$dir/nbd.log"; fail "nbd did not start"; }
ls "$dir/backup" | grep -q "^hydramem-backup-$nbd_pid-" || fail "no backup file of nbd ($nbd_pid) in --backup-dir"
kill -TERM "$nbd_pid"
wait "$nbd_pid" || { cat "$dir/nbd.log"; fail "nbd did not stop cleanly"; }
nbd_pid=""
[ -z "$(ls "$dir/backup")" ] || fail "nbd left $(ls "$dir/backup") in --backup-dir"

if "$BIN" nbd --cluster "$cluster" --scheme ssd-backup --size 16MiB --socket "$dir/x.sock" \
  --backup-dir "$dir/missing" >"$dir/err" 2>&1; then
  fail "nbd started with a --backup-dir that does not exist"
fi
grep -q "pass --backup-dir on a local disk with room" "$dir/err" || { cat "$dir/err"; fail "no advice on --backup-dir"; }
if "$BIN" nbd --cluster "$cluster" --scheme ssd-backup --size 16MiB --socket "$dir/x.sock" \
  --client-id 0123456789abcdef0123456789abcdef >"$dir/err" 2>&1; then
  fail "nbd took --client-id with ssd-backup"
fi
grep -q "use another scheme with --client-id" "$dir/err" || { cat "$dir/err"; fail "no advice on --client-id"; }
if "$BIN" nbd --cluster "$cluster" --scheme ssd --size 16MiB --socket "$dir/x.sock" >"$dir/err" 2>&1; then
  fail "nbd took an unknown scheme"
fi
grep -q "ssd-backup" "$dir/err" || { cat "$dir/err"; fail "the scheme error does not list ssd-backup"; }

kill -TERM "$up_pid"; wait "$up_pid"; up_pid=""
echo "PASS bench_ssd_backup"
