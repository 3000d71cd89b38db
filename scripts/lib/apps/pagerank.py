"""PageRank with python3-igraph for scripts/bench-apps.

  pagerank.py [--loaded FILE --go FILE] NODES RUNS OUT [REFERENCE]

Generates a directed power-law graph (Barabási–Albert, 8 edges per new vertex, seeded: the same
graph every time), then computes its PageRank RUNS times (PRPACK), timing each. Writes the ranks
to OUT (doubles); with REFERENCE (the ranks of an earlier run), compares them. Prints one JSON
object: gen_s, job_s, iter_p50_ms, iter_p99_ms, runs, max_diff (against REFERENCE, or between
the runs). With --loaded and --go: once the graph is generated, creates the file --loaded and
waits for the file --go before the PageRank runs (bench-apps puts the memory limit in place
in between, so that generation's burst of allocations is not what the limit is measured on).
"""
import argparse
import array
import json
import os
import random
import time

import igraph

ap = argparse.ArgumentParser()
ap.add_argument("--loaded")
ap.add_argument("--go")
ap.add_argument("nodes", type=int)
ap.add_argument("runs", type=int)
ap.add_argument("out")
ap.add_argument("reference", nargs="?")
args = ap.parse_args()
nodes, runs, out = args.nodes, args.runs, args.out
random.seed(1)
igraph.set_random_number_generator(random)
t0 = time.perf_counter()
g = igraph.Graph.Barabasi(nodes, 8, directed=True)
gen_s = time.perf_counter() - t0
if args.loaded and args.go:
    open(args.loaded, "w").close()
    deadline = time.monotonic() + 600
    while not os.path.exists(args.go):
        if time.monotonic() > deadline:
            raise SystemExit("pagerank.py: the limit was never put in place after generating")
        time.sleep(0.05)
times, first, diff = [], None, 0.0
t0 = time.perf_counter()
for _ in range(runs):
    t = time.perf_counter()
    ranks = g.pagerank()
    times.append(time.perf_counter() - t)
    if first is None:
        first = ranks
    else:
        diff = max(diff, max(abs(a - b) for a, b in zip(first, ranks)))
job_s = time.perf_counter() - t0
with open(out, "wb") as f:
    array.array("d", ranks).tofile(f)
if args.reference:
    ref = array.array("d")
    with open(args.reference, "rb") as f:
        ref.fromfile(f, nodes)
    diff = max(diff, max(abs(a - b) for a, b in zip(ref, ranks)))
times.sort()
print(json.dumps({"gen_s": round(gen_s, 3), "job_s": round(job_s, 3),
                  "iter_p50_ms": round(1000 * times[len(times) // 2], 2),
                  "iter_p99_ms": round(1000 * times[min(len(times) - 1, len(times) * 99 // 100)], 2),
                  "runs": runs, "max_diff": diff}))
