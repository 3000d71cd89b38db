#!/usr/bin/env bash
# Span coding with --client-id: the page map lives in the server, and a new server with the same
# identity rebuilds it from the pieces' tags on the nodes. Pages written, overwritten (so their
# old rows are garbage with older versions) and written again after the server was SIGKILLed
# read back as last written — also after a second restart with one memory node killed, whose
# pieces' page names are decoded from the others.
set -euo pipefail
. "$(dirname "$0")/lib/nbd.sh"
need_nbdsh
id=0123456789abcdef0123456789abcdee
scheme=(--scheme span-8+2)
NODES=11 start_export 16MiB --client-id "$id" "${scheme[@]}"
# Writes random bytes at random offsets (single pages, multi-page spans, overwrites) and keeps
# the whole expected image in a file.
write_some() {
  "${NBDSH[@]}" -u "$URI" -c '
import os, random
path = "'"$dir"'/image"
size = 16 << 20
img = bytearray(open(path, "rb").read()) if os.path.exists(path) else bytearray(size)
rng = random.Random('"$1"')
for i in range(400):
    n = rng.choice([7, 4096, 3 * 4096 + 5, 64 << 10])
    o = rng.randrange(0, size - n)
    if i % 3 == 0:
        o = rng.randrange(0, 32) * 4096  # overwrites of a few hot pages
    d = rng.randbytes(n)
    h.pwrite(d, o)
    img[o:o + n] = d
h.flush()
open(path, "wb").write(img)
'
}
check_all() {
  "${NBDSH[@]}" -u "$URI" -c '
img = open("'"$dir"'/image", "rb").read()
step = 1 << 20
for o in range(0, len(img), step):
    assert h.pread(step, o) == img[o:o + step], "bytes at %d..%d differ after %s" % (o, o + step, "'"$1"'")
print("every byte reads back as last written after", "'"$1"'")
'
}
write_some 1
kill -KILL "$nbd_pid"
wait "$nbd_pid" 2>/dev/null || true
nbd_pid=""
serve_again 16MiB --client-id "$id" "${scheme[@]}"
check_all "a SIGKILL and a restart"
write_some 2
kill -KILL "$nbd_pid"
wait "$nbd_pid" 2>/dev/null || true
nbd_pid=""
kill -KILL "${NODE_PIDS[0]}"
serve_again 16MiB --client-id "$id" "${scheme[@]}"
check_all "a second restart with a memory node killed"
kill -TERM "$nbd_pid"
wait "$nbd_pid" || { echo "FAIL: exit status on SIGTERM"; exit 1; }
nbd_pid=""
echo "PASS nbd_span_client_id_restart"
