"""A program with a large numpy array, for `hydramem run` tests: fills N MiB with seeded
random words, prints a SHA-256 of the whole array, then updates random elements in place
(seeded) and prints the SHA-256 again. With GO_FILE set, it waits for that file to exist
between the fill and the updates (a test can kill memory nodes there). With FORK_CHECK set,
it then forks: the child prints the array's SHA-256 as it sees it ("child ...") and exits,
and the parent waits for it before going on. With FORK_LINGER set to a path, it forks there
instead a child that outlives it: the child waits for that path to exist (two minutes at
most), and the parent goes on without waiting."""
import hashlib
import os
import sys
import time

import numpy as np

mib = int(sys.argv[1])
rng = np.random.default_rng(int(sys.argv[2]) if len(sys.argv) > 2 else 1)
a = rng.integers(0, 2**63, size=mib * (1 << 20) // 8, dtype=np.uint64)
print("filled", hashlib.sha256(a.tobytes()).hexdigest(), flush=True)
go = os.environ.get("GO_FILE")
if go:
    print("waiting", flush=True)
    while not os.path.exists(go):
        time.sleep(0.01)
if os.environ.get("FORK_CHECK"):
    pid = os.fork()
    if pid == 0:
        print("child", hashlib.sha256(a.tobytes()).hexdigest(), flush=True)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    if status != 0:
        sys.exit("the child exited with status %d" % status)
linger = os.environ.get("FORK_LINGER")
if linger and os.fork() == 0:
    # At most two minutes, should the test end without saying so.
    end = time.monotonic() + 120
    while not os.path.exists(linger) and time.monotonic() < end:
        time.sleep(0.01)
    os._exit(0)
idx = rng.integers(0, a.size, size=200_000)
a[idx] += np.uint64(1)
a[::4096] ^= np.uint64(0xFFFF)
print("updated", hashlib.sha256(a.tobytes()).hexdigest(), flush=True)
