#!/usr/bin/env bash
# An identity kept with --client-id is never reconnected smaller than its data (that would
# strand the slabs beyond the new end on the nodes for good), and `hydramem free` releases
# all of it, after which the identity starts afresh at any size. While an export runs, its
# identity is its own: `free` and a second export with it are refused.
set -euo pipefail
. "$(dirname "$0")/lib/nbd.sh"
need_nbdsh
id=00112233445566778899aabbccddeeff
# 8+2 over 4 MiB slabs: address ranges of 32 MiB, so 96 MiB is three of them.
start_export 96MiB --client-id "$id"
"${NBDSH[@]}" -u "$URI" -c 'h.pwrite(b"last", (96 << 20) - 4); h.pwrite(b"first", 0)'

# While the export runs, the identity is its own: `free` and a second export with the same
# --client-id are refused, and nothing of the first changes.
if "$BIN" free --cluster "$dir/cluster.toml" --client-id "$id" >"$dir/busy.out" 2>"$dir/busy.err"; then
  echo "FAIL: free released the identity of a running export"
  exit 1
fi
cat "$dir/busy.err"
grep -q 'is in use by a running process' "$dir/busy.err" || { echo "FAIL: free does not say the identity is in use"; exit 1; }
if "$BIN" nbd --cluster "$dir/cluster.toml" --size 96MiB --socket "$dir/second.sock" --client-id "$id" \
  --log warn >"$dir/second.out" 2>"$dir/second.err"; then
  echo "FAIL: a second export served an identity in use"
  exit 1
fi
cat "$dir/second.err"
grep -q 'another process holds this client identity' "$dir/second.err" || { echo "FAIL: the second export does not say why"; exit 1; }
"${NBDSH[@]}" -u "$URI" -c 'assert h.pread(5, 0) == b"first"; assert h.pread(4, (96 << 20) - 4) == b"last"'
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
