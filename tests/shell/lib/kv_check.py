"""Loads and verifies key-value data in a real server, for `hydramem run` tests.

    kv_check.py redis|memcached HOST:PORT load|verify N SIZE

load: sets N keys, each with a SIZE-byte value derived from its number (SHA-256 chains, so
the values do not compress and differ everywhere); verify: reads every key back and exits 1,
naming the first wrong key, unless all N values are exact. Plain sockets, pipelined in
batches: no client library needed."""
import hashlib
import socket
import sys

kind, addr, action, n, size = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
host, port = addr.rsplit(":", 1)
s = socket.create_connection((host, int(port)))
f = s.makefile("rb")
BATCH = 200


def value(i):
    out = b""
    h = hashlib.sha256(str(i).encode()).digest()
    while len(out) < size:
        out += h
        h = hashlib.sha256(h).digest()
    return out[:size]


def key(i):
    return b"key:%d" % i


def redis_cmd(*parts):
    return b"*%d\r\n" % len(parts) + b"".join(b"$%d\r\n%s\r\n" % (len(p), p) for p in parts)


def redis_reply():
    line = f.readline()
    if line[:1] == b"$":
        length = int(line[1:])
        if length < 0:
            return None
        data = f.read(length + 2)
        return data[:-2]
    if line[:1] in (b"+", b":"):
        return line[1:].strip()
    raise SystemExit("redis error: %r" % line)


def memcached_reply_get():
    line = f.readline()
    if line == b"END\r\n":
        return None
    _, _k, _flags, length = line.split()
    data = f.read(int(length) + 2)[:-2]
    assert f.readline() == b"END\r\n"
    return data


for start in range(0, n, BATCH):
    ids = range(start, min(n, start + BATCH))
    if action == "load":
        if kind == "redis":
            s.sendall(b"".join(redis_cmd(b"SET", key(i), value(i)) for i in ids))
            for _ in ids:
                redis_reply()
        else:
            s.sendall(b"".join(b"set %s 0 0 %d\r\n%s\r\n" % (key(i), size, value(i)) for i in ids))
            for _ in ids:
                line = f.readline()
                if line != b"STORED\r\n":
                    raise SystemExit("memcached: %r" % line)
    else:
        if kind == "redis":
            s.sendall(b"".join(redis_cmd(b"GET", key(i)) for i in ids))
            got = [redis_reply() for _ in ids]
        else:
            s.sendall(b"".join(b"get %s\r\n" % key(i) for i in ids))
            got = [memcached_reply_get() for _ in ids]
        for i, g in zip(ids, got):
            if g != value(i):
                print("wrong value for %s (%s)" % (key(i).decode(), "missing" if g is None else "%d bytes" % len(g)))
                sys.exit(1)
print("%s %d keys of %d bytes: ok" % (action, n, size))
