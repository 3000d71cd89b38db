#!/usr/bin/env python3
"""CPU lists for bench-apps --node-cpus.

  cpus.py split LIST   checks LIST (CPU numbers and ranges lo-hi, comma-separated: 1, 2-3,
                       0,4-5) against the CPUs this process may run on, and prints two lines:
                       LIST normalised (what taskset is given) and the CPUs this process may
                       run on that are not in it. Fails, saying why and what to give instead,
                       if LIST is not such a list, names a CPU this process may not use, or
                       leaves none for the rest.
"""
import os
import re
import sys

PART = re.compile(r"\s*([0-9]+)(?:\s*-\s*([0-9]+))?\s*")


def fmt(cpus):
    return ",".join(str(c) for c in sorted(cpus))


def parse(text, highest):
    """The CPUs of `text`; ValueError saying what is wrong. No range reaches past `highest`
    (so a typo like 0-99999999 is refused before any set is built)."""
    cpus = set()
    for part in text.split(","):
        m = PART.fullmatch(part)
        if not m:
            raise ValueError(f"{part!r} is not a CPU number or a range lo-hi "
                             "(taskset's strides such as 0-6:2 are not taken)")
        lo = int(m.group(1))
        hi = int(m.group(2) or lo)
        if hi < lo:
            raise ValueError(f"{part!r} is a range whose end is below its start")
        if hi > highest:
            raise ValueError(f"CPU {hi} ({part!r}) is past the highest this run may use, {highest}")
        cpus.update(range(lo, hi + 1))
    return cpus


def main(argv):
    if len(argv) != 3 or argv[1] != "split":
        print(__doc__.strip(), file=sys.stderr)
        return 2
    allowed = os.sched_getaffinity(0)
    where = f"this run may use CPUs {fmt(allowed)}"
    try:
        nodes = parse(argv[2], max(allowed))
    except ValueError as e:
        print(f"--node-cpus {argv[2]!r}: {e}; {where}: give a list of some of them, such as {max(allowed)}",
              file=sys.stderr)
        return 1
    if not nodes <= allowed:
        print(f"--node-cpus {argv[2]!r}: CPUs {fmt(nodes - allowed)} are not online or not allowed "
              f"to this run (cpuset, taskset); {where}: give some of them", file=sys.stderr)
        return 1
    rest = allowed - nodes
    if not rest:
        print(f"--node-cpus {argv[2]!r} leaves no CPU for the servers, clients and pagers; {where}: "
              "leave at least one of them out", file=sys.stderr)
        return 1
    print(fmt(nodes))
    print(fmt(rest))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
