#!/usr/bin/env bash
# nbdsh (libnbd's Python shell) writes and reads byte-exact at many offsets of an export
# whose size is not a whole number of pages: unaligned, across pages, the last byte; a
# request past the end fails with EINVAL and the connection goes on.
set -euo pipefail
. "$(dirname "$0")/lib/nbd.sh"
need_nbdsh
start_export $((5 * 1048576 + 1234))
"${NBDSH[@]}" -u "$URI" -c '
import errno, random
size = h.get_size()
assert size == 5 * 1048576 + 1234, size
rng = random.Random(5)
model = bytearray(size)
offsets = [0, 1, 511, 4095, 4096, 4097, 65535, 1048575, 2 * 1048576 + 3, size - 4097, size - 2, size - 1]
offsets += [rng.randrange(size) for _ in range(40)]
for o in offsets:
    n = min(rng.choice([1, 3, 512, 4096, 5000, 70000]), size - o)
    data = rng.randbytes(n)
    h.pwrite(data, o)
    model[o:o + n] = data
for o in offsets:
    start = max(0, o - 300)
    n = min(9000, size - start)
    assert h.pread(n, start) == model[start:start + n], "bytes differ at %d" % start
assert h.pread(1, size - 1) == model[size - 1:]
assert h.pread(size, 0) == model, "whole device differs"
h.flush()
# libnbd refuses out-of-range requests itself unless strict mode is off: turn it off so that
# the server is the one asked.
h.set_strict_mode(0)
try:
    h.pread(2, size - 1)
    raise SystemExit("FAIL: a read past the end succeeded")
except nbd.Error as e:
    assert e.errnum == errno.EINVAL, e
try:
    h.pwrite(b"xy", size - 1)
    raise SystemExit("FAIL: a write past the end succeeded")
except nbd.Error as e:
    assert e.errnum == errno.EINVAL, e
assert h.pread(1, size - 1) == model[size - 1:], "the connection goes on after EINVAL"
print("nbdsh: %d writes read back byte-exact, EINVAL past the end" % len(offsets))
'
stop_export
echo "PASS nbd_nbdsh"
