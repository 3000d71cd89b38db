#!/usr/bin/env bash
# With --client-id the data outlives the server: writes acknowledged before the server is
# SIGKILLed are served again by a new server with the same identity, which also replaces
# the stale socket file the killed one left.
set -euo pipefail
. "$(dirname "$0")/lib/nbd.sh"
need_nbdsh
id=0123456789abcdef0123456789abcdef
start_export 32MiB --client-id "$id"
"${NBDSH[@]}" -u "$URI" -c '
import random
rng = random.Random(11)
with open("'"$dir"'/expect", "wb") as f:
    for o in [0, 4095, 1 << 20, (32 << 20) - 7]:
        d = rng.randbytes(7)
        h.pwrite(d, o)
        f.write(o.to_bytes(8, "big") + d)
'
kill -KILL "$nbd_pid"
wait "$nbd_pid" 2>/dev/null || true
nbd_pid=""
[ -S "$SOCK" ] || { echo "FAIL: expected the killed server to leave its socket file"; exit 1; }
serve_again 32MiB --client-id "$id"
"${NBDSH[@]}" -u "$URI" -c '
b = open("'"$dir"'/expect", "rb").read()
for i in range(0, len(b), 15):
    o, d = int.from_bytes(b[i:i + 8], "big"), b[i + 8:i + 15]
    assert h.pread(7, o) == d, "write at %d lost across the restart" % o
print("every write acknowledged before the SIGKILL is served by the restarted server")
'
kill -TERM "$nbd_pid"
wait "$nbd_pid" || { echo "FAIL: exit status on SIGTERM"; exit 1; }
nbd_pid=""
grep -q 'data stays on the memory nodes' "$dir/nbd2.out" || { echo "FAIL: the data was released"; exit 1; }
echo "PASS nbd_client_id_restart"
