#!/usr/bin/env bash
# `hydramem bench --corrupt-ppm` measures every mode clean and under injected reply corruption
# in one run (paper Fig. 11): the corrupted rounds have latencies of their own, checksums and
# correction mode return no wrong page, and EC-only (which checks nothing) does.
set -euo pipefail
BIN=${HYDRAMEM_BIN:-target/release/hydramem}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
"$BIN" bench --nodes 12 --pages 1024 --latency-ops 2000 --rounds 2 --seconds 0.2 \
  --corrupt-ppm 20000 --schemes hydra-8+2-d1+crc,hydra-8+3-d1-cor,hydra-8+2-d1-ec \
  --json "$dir/c.json" --log error | tee "$dir/out.txt"
grep -q "under corruption (20000 per million" "$dir/out.txt"
python3 - "$dir/c.json" <<'PY'
import json, sys
rows = {r["scheme"]: r for r in json.load(open(sys.argv[1]))["results"]}
crc, cor, ec = rows["hydra 8+2 Δ=1 +crc"], rows["hydra 8+3 Δ=1 correction"], rows["hydra 8+2 Δ=1 ec-only"]
for r in rows.values():
    c = r["corrupted"]
    assert c["read_latency"]["samples"] > 0 and c["write_latency"]["samples"] > 0, r
for r in (crc, cor):
    assert r["verify_errors"] == 0, r
    assert r["corrupt_splits"] > 0, r
assert cor["corrected"] > 0, cor
assert ec["verify_errors"] > 0, ec
print("wrong pages: checksums 0, correction 0, ec-only", ec["verify_errors"])
PY
echo "PASS bench_corruption"
