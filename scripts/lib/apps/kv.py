"""Key-value data for scripts/bench-apps, standard library only.

  kv.py redis-load KEYS BYTES
      writes SETs of KEYS keys (redis-benchmark's names, key:000000000042) to stdout in the
      redis protocol, for `redis-cli --pipe`; each value is BYTES of its own (pseudo-random,
      incompressible: zram must not be flattered).
  kv.py memcached --port P --keys N --mix etc|sys --popularity zipf|uniform --seconds S
      loads N keys into memcached, runs the mix for S seconds from 2 processes of 8
      connections each (one request in flight per connection), re-reads every key and compares
      it with what was last set; prints one JSON object: load_s, ops, ops_per_s, p50_ms,
      p99_ms, checked, wrong.

Values are a function of (key, version): "k<key> v<version> " then bytes of a fixed random
buffer at an offset of their own, so any value read back can be checked on its own.
"""
import bisect
import itertools
import json
import math
import multiprocessing
import random
import socket
import sys
import time

BUF = random.Random(1).randbytes(1 << 22)
# Facebook's ETC pool: 95% GET, small values; SYS: 75% GET, larger values (Atikoglu et al.,
# SIGMETRICS 2012).
MIXES = {"etc": (0.95, 64, 512), "sys": (0.75, 1024, 8192)}


def value(key, version, lo, hi):
    head = b"k%d v%d " % (key, version)
    size = lo + (key * 2654435761) % (hi - lo + 1)
    off = (key * 40503 + version * 9973) % (len(BUF) - size)
    return head + BUF[off:off + size - len(head)]


def redis_load(keys, size):
    out = sys.stdout.buffer
    chunk = []
    for k in range(keys):
        name = b"key:%012d" % k
        v = value(k, 0, size, size)
        chunk.append(b"*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n" % (len(name), name, len(v), v))
        if len(chunk) == 1000:
            out.write(b"".join(chunk))
            chunk = []
    out.write(b"".join(chunk))
    out.flush()


class Conn:
    def __init__(self, port):
        self.s = socket.create_connection(("127.0.0.1", port))
        self.s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.f = self.s.makefile("rb")

    def send(self, data):
        self.s.sendall(data)

    def line(self):
        return self.f.readline()

    def get_reply(self):
        """One GET's reply: the value, or None when the key is missing."""
        line = self.line()
        if line == b"END\r\n":
            return None
        n = int(line.split()[3])
        data = self.f.read(n + 2)[:-2]
        assert self.line() == b"END\r\n", "no END after a value"
        return data


def mc_key(k):
    return b"mc:%d" % k


def set_cmd(k, v):
    return b"set %s 0 0 %d\r\n%s\r\n" % (mc_key(k), len(v), v)


def check(k, data, lo, hi):
    """Whether data is a value this benchmark set for key k (any version)."""
    if data is None or not data.startswith(b"k%d v" % k):
        return False
    version = int(data.split(b" ", 2)[1][1:])
    return data == value(k, version, lo, hi)


def worker(port, wid, nproc, keys, mix, popularity, seconds, out):
    try:
        out.put(run_mix(port, wid, nproc, keys, mix, popularity, seconds))
    except Exception as e:  # the server gone (its cgroup's OOM killer), a wrong reply
        out.put(e)


def run_mix(port, wid, nproc, keys, mix, popularity, seconds):
    get_share, lo, hi = MIXES[mix]
    rng = random.Random(100 + wid)
    conns = [Conn(port) for _ in range(8)]
    if popularity == "zipf":
        cum = list(itertools.accumulate(1 / (r + 1) ** 0.99 for r in range(keys)))
        total = cum[-1]
        # Popular keys spread over the key space (and so over memcached's memory), not together.
        stride = 1000003  # a prime
        while math.gcd(stride, keys) != 1:
            stride += 2

        def pick():
            return (bisect.bisect_left(cum, rng.random() * total) * stride) % keys
    else:
        def pick():
            return rng.randrange(keys)
    versions = {}
    lat = []
    wrong = 0
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        batch = []
        for c in conns:
            k = pick()
            if rng.random() < get_share:
                c.send(b"get %s\r\n" % mc_key(k))
                batch.append((c, k, None, time.perf_counter()))
            else:
                # Each process sets only its own keys: the last version set is then known.
                k = k - k % nproc + wid
                if k >= keys:
                    k -= nproc
                v = versions.get(k, 0) + 1
                c.send(set_cmd(k, value(k, v, lo, hi)))
                batch.append((c, k, v, time.perf_counter()))
        for c, k, v, t in batch:
            if v is None:
                ok = check(k, c.get_reply(), lo, hi)
            else:
                ok = c.line() == b"STORED\r\n"
                versions[k] = v
            lat.append(time.perf_counter() - t)
            wrong += not ok
    return wid, versions, lat, wrong


def memcached(args):
    opts = dict(zip(args[::2], args[1::2]))
    port, keys = int(opts["--port"]), int(opts["--keys"])
    mix, popularity, seconds = opts["--mix"], opts["--popularity"], float(opts["--seconds"])
    _, lo, hi = MIXES[mix]
    c = Conn(port)
    t0 = time.perf_counter()
    for base in range(0, keys, 500):
        ks = range(base, min(base + 500, keys))
        c.send(b"".join(set_cmd(k, value(k, 0, lo, hi)) for k in ks))
        for _ in ks:
            assert c.line() == b"STORED\r\n", "a SET was not stored (memcached -m too small?)"
    load_s = time.perf_counter() - t0
    nproc = 2
    q = multiprocessing.Queue()
    procs = [multiprocessing.Process(target=worker, args=(port, w, nproc, keys, mix, popularity, seconds, q))
             for w in range(nproc)]
    t0 = time.perf_counter()
    for p in procs:
        p.start()
    results = [q.get() for _ in procs]
    for r in results:
        if isinstance(r, Exception):
            sys.exit(f"kv.py: a client failed: {r!r}")
    for p in procs:
        p.join()
    run_s = time.perf_counter() - t0
    versions = {}
    lat = []
    wrong = 0
    for _, v, la, w in results:
        versions.update(v)
        lat += la
        wrong += w
    lat.sort()
    # Every key re-read, 100 to a request, against the last version set.
    checked = 0
    for base in range(0, keys, 100):
        ks = range(base, min(base + 100, keys))
        c.send(b"get " + b" ".join(mc_key(k) for k in ks) + b"\r\n")
        got = {}
        while True:
            line = c.line()
            if line == b"END\r\n":
                break
            name, n = line.split()[1], int(line.split()[3])
            got[int(name[3:])] = c.f.read(n + 2)[:-2]
        for k in ks:
            checked += 1
            wrong += got.get(k) != value(k, versions.get(k, 0), lo, hi)
    print(json.dumps({
        "load_s": round(load_s, 3), "ops": len(lat), "ops_per_s": round(len(lat) / run_s, 1),
        "p50_ms": round(1000 * lat[len(lat) // 2], 3), "p99_ms": round(1000 * lat[len(lat) * 99 // 100], 3),
        "checked": checked, "wrong": wrong}))


if __name__ == "__main__":
    if sys.argv[1] == "redis-load":
        redis_load(int(sys.argv[2]), int(sys.argv[3]))
    elif sys.argv[1] == "memcached":
        memcached(sys.argv[2:])
    else:
        sys.exit("kv.py: redis-load or memcached")
