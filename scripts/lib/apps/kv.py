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
  kv.py redis --port P --keys N --value B --seconds S
      the same against a redis loaded by redis-load (95% GET, 5% SET of B-byte values, uniform
      keys), without loading.
  Both take --timeline FILE (also write the requests completed in each second of the run,
  as JSON, and go on when the server fails, counting the error instead: a failure mid-run)
  and --started FILE (created when the timed phase starts). memcached also takes --loaded
  FILE --go FILE: once loaded it creates the first and waits (up to ten minutes) for the
  second before the timed phase (the harness puts the memory limit in place between them).

Values are a function of (key, version): "k<key> v<version> " then bytes of a fixed random
buffer at an offset of their own, so any value read back can be checked on its own.
"""
import bisect
import itertools
import json
import math
import multiprocessing
import os
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
        name = redis_key(k)
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


class Memcached:
    """memcached's text protocol, for the driver."""
    get_share = None

    @staticmethod
    def get(c, k):
        c.send(b"get %s\r\n" % mc_key(k))

    @staticmethod
    def get_reply(c):
        return c.get_reply()

    @staticmethod
    def set(c, k, v):
        c.send(set_cmd(k, v))

    @staticmethod
    def set_ok(c):
        return c.line() == b"STORED\r\n"


def redis_key(k):
    return b"key:%012d" % k


class Redis:
    """The redis protocol (RESP2), for the driver: GET and SET of redis-load's keys."""

    @staticmethod
    def get(c, k):
        name = redis_key(k)
        c.send(b"*2\r\n$3\r\nGET\r\n$%d\r\n%s\r\n" % (len(name), name))

    @staticmethod
    def get_reply(c):
        line = c.line()
        if not line.startswith(b"$"):
            raise ConnectionError(f"unexpected GET reply {line[:40]!r}")
        n = int(line[1:])
        return None if n < 0 else c.f.read(n + 2)[:-2]

    @staticmethod
    def set(c, k, v):
        name = redis_key(k)
        c.send(b"*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n" % (len(name), name, len(v), v))

    @staticmethod
    def set_ok(c):
        return c.line() == b"+OK\r\n"


def check(k, data, lo, hi):
    """Whether data is a value this benchmark set for key k (any version)."""
    if data is None or not data.startswith(b"k%d v" % k):
        return False
    version = int(data.split(b" ", 2)[1][1:])
    return data == value(k, version, lo, hi)


def worker(proto, port, wid, nproc, keys, mix, popularity, seconds, start, out):
    try:
        out.put(run_mix(proto, port, wid, nproc, keys, mix, popularity, seconds, start))
    except Exception as e:  # the server gone (its cgroup's OOM killer), a wrong reply
        out.put(e)


def picker(rng, keys, popularity):
    if popularity == "zipf":
        cum = list(itertools.accumulate(1 / (r + 1) ** 0.99 for r in range(keys)))
        total = cum[-1]
        # Popular keys spread over the key space (and so over the server's memory), not together.
        stride = 1000003  # a prime
        while math.gcd(stride, keys) != 1:
            stride += 2
        return lambda: (bisect.bisect_left(cum, rng.random() * total) * stride) % keys
    return lambda: rng.randrange(keys)


def run_mix(proto, port, wid, nproc, keys, mix, popularity, seconds, start):
    """The timed phase of one process: 8 connections, one request in flight on each. With a
    timeline (start: the run's epoch second), a failure of the server ends the phase and is
    returned instead of raised."""
    get_share, lo, hi = mix
    rng = random.Random(100 + wid)
    conns = [Conn(port) for _ in range(8)]
    pick = picker(rng, keys, popularity)
    versions = {}
    lat = []
    wrong = 0
    per_second = {}
    error = None
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        batch = []
        try:
            for c in conns:
                k = pick()
                if rng.random() < get_share:
                    proto.get(c, k)
                    batch.append((c, k, None, time.perf_counter()))
                else:
                    # Each process sets only its own keys: the last version set is then known.
                    k = k - k % nproc + wid
                    if k >= keys:
                        k -= nproc
                    v = versions.get(k, 0) + 1
                    proto.set(c, k, value(k, v, lo, hi))
                    batch.append((c, k, v, time.perf_counter()))
            for c, k, v, t in batch:
                if v is None:
                    ok = check(k, proto.get_reply(c), lo, hi)
                else:
                    ok = proto.set_ok(c)
                    versions[k] = v
                now = time.perf_counter()
                lat.append(now - t)
                wrong += not ok
                if start is not None:
                    b = int(time.time() - start)
                    per_second[b] = per_second.get(b, 0) + 1
        except Exception as e:  # the server gone mid-reply: a short read, a cut line
            if start is None:
                raise
            error = f"{type(e).__name__}: {e} at {time.time() - start:.1f} s"
            break
    return wid, versions, lat, wrong, per_second, error


def drive(proto, port, keys, mix, popularity, seconds, opts):
    """Runs the timed phase from 2 processes; returns (versions, sorted latencies, wrong,
    seconds, timeline or None, errors)."""
    nproc = 2
    timeline_file, started_file = opts.get("--timeline"), opts.get("--started")
    start = time.time() if timeline_file else None
    q = multiprocessing.Queue()
    procs = [multiprocessing.Process(target=worker,
                                     args=(proto, port, w, nproc, keys, mix, popularity, seconds, start, q))
             for w in range(nproc)]
    if started_file:
        open(started_file, "w").close()
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
    versions, lat, wrong, per_second, errors = {}, [], 0, {}, []
    for _, v, la, w, ps, err in results:
        versions.update(v)
        lat += la
        wrong += w
        for b, n in ps.items():
            per_second[b] = per_second.get(b, 0) + n
        if err:
            errors.append(err)
    lat.sort()
    timeline = None
    if timeline_file:
        timeline = [per_second.get(b, 0) for b in range(int(seconds) + 1)]
        with open(timeline_file, "w") as f:
            json.dump({"ops_per_second": timeline, "errors": errors}, f)
    return versions, lat, wrong, run_s, timeline, errors


def summary(load_s, lat, run_s, checked, wrong, errors):
    n = max(len(lat), 1)
    return json.dumps({
        "load_s": round(load_s, 3), "ops": len(lat), "ops_per_s": round(len(lat) / run_s, 1),
        "p50_ms": round(1000 * lat[len(lat) // 2], 3) if lat else None,
        "p99_ms": round(1000 * lat[n * 99 // 100], 3) if lat else None,
        "checked": checked, "wrong": wrong, "errors": errors})


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
    if "--loaded" in opts:
        open(opts["--loaded"], "w").close()
        deadline = time.time() + 600
        while not os.path.exists(opts["--go"]):
            if time.time() > deadline:
                sys.exit("kv.py: the harness never said go after the load")
            time.sleep(0.05)
    versions, lat, wrong, run_s, _, errors = drive(Memcached, port, keys, MIXES[mix], popularity, seconds, opts)
    checked = 0
    if not errors:
        # Every key re-read, 100 to a request, against the last version set.
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
    print(summary(load_s, lat, run_s, checked, wrong, errors))


def redis(args):
    opts = dict(zip(args[::2], args[1::2]))
    port, keys, size = int(opts["--port"]), int(opts["--keys"]), int(opts["--value"])
    seconds = float(opts["--seconds"])
    versions, lat, wrong, run_s, _, errors = drive(Redis, port, keys, (0.95, size, size), "uniform", seconds, opts)
    checked = 0
    if not errors:
        # Every key re-read, 100 GETs pipelined at a time, against the last version set.
        c = Conn(port)
        for base in range(0, keys, 100):
            ks = range(base, min(base + 100, keys))
            for k in ks:
                Redis.get(c, k)
            for k in ks:
                checked += 1
                wrong += Redis.get_reply(c) != value(k, versions.get(k, 0), size, size)
    print(summary(0.0, lat, run_s, checked, wrong, errors))


if __name__ == "__main__":
    if sys.argv[1] == "redis-load":
        redis_load(int(sys.argv[2]), int(sys.argv[3]))
    elif sys.argv[1] == "memcached":
        memcached(sys.argv[2:])
    elif sys.argv[1] == "redis":
        redis(sys.argv[2:])
    else:
        sys.exit("kv.py: redis-load, memcached or redis")
