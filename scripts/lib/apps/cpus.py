#!/usr/bin/env python3
"""CPU lists for bench-apps --node-cpus.

  cpus.py rest LIST   prints, as a taskset list, the online CPUs not in LIST (a taskset list:
                      1, 2-3, 0,4-5); fails with the reason if LIST names a CPU that is not
                      online, or leaves none for the rest.
"""
import os
import sys


def parse(text):
    """The CPUs of a list such as 0-2,5 (ValueError if it is not one)."""
    cpus = set()
    for part in text.strip().split(","):
        lo, _, hi = part.partition("-")
        a, b = int(lo), int(hi or lo)
        if a < 0 or b < a:
            raise ValueError(f"{part!r} is not a CPU or a range lo-hi")
        cpus.update(range(a, b + 1))
    return cpus


def fmt(cpus):
    return ",".join(str(c) for c in sorted(cpus))


def main(argv):
    if len(argv) != 3 or argv[1] != "rest":
        print(__doc__.strip(), file=sys.stderr)
        return 2
    try:
        nodes = parse(argv[2])
        online = parse(open("/sys/devices/system/cpu/online").read())
    except (ValueError, OSError) as e:
        print(f"cpus.py: {argv[2]!r} is not a CPU list such as 1 or 2-3,5 ({e})", file=sys.stderr)
        return 1
    if not nodes <= online:
        print(f"cpus.py: CPUs {fmt(nodes - online)} are not online (online: {fmt(online)})", file=sys.stderr)
        return 1
    rest = online - nodes
    if not rest:
        print(f"cpus.py: {argv[2]} leaves no CPU for the servers and clients (online: {fmt(online)})", file=sys.stderr)
        return 1
    print(fmt(rest))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
