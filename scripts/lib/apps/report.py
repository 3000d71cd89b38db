"""The tables of scripts/bench-apps: one per workload, a row per backend and fraction of the
peak memory, medians over the rounds of throughput and latency per operation, and the ratio of
each throughput to all-local's.

  report.py RESULTS.csv
"""
import csv
import statistics
import sys

# The paper (Hydra, FAST'22, §7.4, Tables 2–3): with 50% of the working set in local memory,
# Hydra keeps 0.82–0.97× of all-local throughput across its applications.
PAPER = "paper (Hydra, FAST'22): at 50% local memory, Hydra keeps 0.82-0.97x of all-local throughput"


def med(values):
    values = [float(v) for v in values if v != ""]
    return statistics.median(values) if values else None


def fmt(v, digits=0):
    if v is None:
        return "-"
    return f"{v:,.{digits}f}" if abs(v) >= 10 or digits == 0 else f"{v:.{max(digits, 2)}f}"


rows = list(csv.DictReader(open(sys.argv[1])))
for w in dict.fromkeys(r["workload"] for r in rows):
    wr = [r for r in rows if r["workload"] == w]
    ops = [op for op in dict.fromkeys(r["op"] for r in wr) if op != "failed"]
    units = {r["op"]: r["unit"] for r in wr}
    keys = list(dict.fromkeys((r["backend"], int(r["fraction"])) for r in wr))
    keys.sort(key=lambda k: (k[0] != "local", -k[1]))
    local = {op: med(r["throughput"] for r in wr if r["backend"] == "local" and r["op"] == op) for op in ops}
    head = ["backend", "local mem"]
    for op in ops:
        head.append(f"{op} {units[op]}")
        head.append("x local")
        if any(r["p50_ms"] for r in wr if r["op"] == op):
            head += [f"{op} p50 ms", "p99 ms"]
    head += ["swapped MiB", "pages in", "faults", "pages out", "rounds", "data"]
    table = [head]
    for b, f in keys:
        sel = [r for r in wr if r["backend"] == b and int(r["fraction"]) == f]
        line = [b, "all (no limit)" if b == "local" else f"{f}%"]
        for op in ops:
            o = [r for r in sel if r["op"] == op]
            t = med(r["throughput"] for r in o)
            line.append(fmt(t, 0 if t is None or t >= 100 else 2))
            line.append(f"{t / local[op]:.2f}" if t is not None and local[op] else "-")
            if any(r["p50_ms"] for r in wr if r["op"] == op):
                line += [fmt(med(r["p50_ms"] for r in o), 3), fmt(med(r["p99_ms"] for r in o), 3)]
        line.append(fmt(med(r["swapped_mib"] for r in sel)))
        for k in ("pages_in", "faults", "pages_out"):
            line.append(fmt(med(r.get(k) or "" for r in sel)))
        line.append(str(len({r["round"] for r in sel})))
        bad = {(r["round"], r["data"]) for r in sel if r["data"] != "ok"}
        line.append(" ".join(f"{v} in {sum(d == v for _, d in bad)}" for v in sorted({d for _, d in bad})) or "ok")
        table.append(line)
    widths = [max(len(row[i]) for row in table) for i in range(len(head))]
    peak = med(r["peak_mib"] for r in wr if r["backend"] == "local")
    print(f"\n{w} (peak {fmt(peak)} MiB with no limit; medians over rounds)")
    for i, row in enumerate(table):
        print("  ".join(c.ljust(widths[j]) if j < 2 else c.rjust(widths[j]) for j, c in enumerate(row)))
        if i == 0:
            print("  ".join("-" * n for n in widths))
    print(PAPER)
