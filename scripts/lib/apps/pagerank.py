"""PageRank with python3-igraph for scripts/bench-apps.

  pagerank.py NODES RUNS OUT [REFERENCE]

Generates a directed power-law graph (Barabási–Albert, 8 edges per new vertex, seeded: the same
graph every time), then computes its PageRank RUNS times (PRPACK), timing each. Writes the ranks
to OUT (doubles); with REFERENCE (the ranks of an earlier run), compares them. Prints one JSON
object: gen_s, job_s, iter_p50_ms, iter_p99_ms, runs, max_diff (against REFERENCE, or between
the runs).
"""
import array
import json
import random
import sys
import time

import igraph

nodes, runs, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
random.seed(1)
igraph.set_random_number_generator(random)
t0 = time.perf_counter()
g = igraph.Graph.Barabasi(nodes, 8, directed=True)
gen_s = time.perf_counter() - t0
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
if len(sys.argv) > 4:
    ref = array.array("d")
    with open(sys.argv[4], "rb") as f:
        ref.fromfile(f, nodes)
    diff = max(diff, max(abs(a - b) for a, b in zip(ref, ranks)))
times.sort()
print(json.dumps({"gen_s": round(gen_s, 3), "job_s": round(job_s, 3),
                  "iter_p50_ms": round(1000 * times[len(times) // 2], 2),
                  "iter_p99_ms": round(1000 * times[min(len(times) - 1, len(times) * 99 // 100)], 2),
                  "runs": runs, "max_diff": diff}))
