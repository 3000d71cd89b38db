#!/usr/bin/env bash
# An identity kept with --client-id is never reconnected smaller than its data (that would
# strand the slabs beyond the new end on the nodes for good), and `hydramem free` releases
# all of it, after which the identity starts afresh at any size.
set -euo pipefail
. "$(dirname "$0")/lib/nbd.sh"
need_nbdsh
id=00112233445566778899aabbccddeeff
# 8+2 over 4 MiB slabs: address ranges of 32 MiB, so 96 MiB is three of them.
start_export 96MiB --client-id "$id"
"${NBDSH[@]}" -u "$URI" -c 'h.pwrite(b"last", (96 << 20) - 4); h.pwrite(b"first", 0)'
kill -TERM "$nbd_pid"
wait "$nbd_pid" || { echo "FAIL: exit status on SIGTERM"; exit 1; }
nbd_pid=""
slabs() {
  "$BIN" status --cluster "$dir/cluster.toml" --json |
    python3 -c 'import json, sys; print(sum(len(n["slabs"]) for n in json.load(sys.stdin)))'
}
[ "$(slabs)" = 20 ] || { echo "FAIL: expected 20 slabs kept (ranges 0 and 2), found $(slabs)"; exit 1; }

# Smaller than the data: refused with the way out, and nothing is released.
if "$BIN" nbd --cluster "$dir/cluster.toml" --size 32MiB --socket "$SOCK" --client-id "$id" \
  --log warn >"$dir/small.out" 2>"$dir/small.err"; then
  echo "FAIL: served 32 MiB of an identity that holds 96 MiB"
  exit 1
fi
cat "$dir/small.err"
grep -q 'address range 2, which starts at 64.0 MiB (byte 67108864)' "$dir/small.err" || { echo "FAIL: error does not name the range"; exit 1; }
grep -q 'hydramem free' "$dir/small.err" || { echo "FAIL: error does not say how to release"; exit 1; }
[ "$(slabs)" = 20 ] || { echo "FAIL: the refused start changed the slabs"; exit 1; }

"$BIN" free --cluster "$dir/cluster.toml" --client-id "$id" | tee "$dir/free.out"
grep -q '^released 20 slabs (80.0 MiB) of identity .* on 10 of 10 nodes$' "$dir/free.out" || { echo "FAIL: free report"; exit 1; }
[ "$(slabs)" = 0 ] || { echo "FAIL: $(slabs) slabs left after free"; exit 1; }

serve_again 32MiB --client-id "$id"
"${NBDSH[@]}" -u "$URI" -c 'assert h.pread(5, 0) == bytes(5), "data survived the release"'
echo "PASS nbd_client_id_free"
