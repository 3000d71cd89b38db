"""The failover runs of scripts/bench-apps --failover: a table and a PNG per workload.

  failover.py DIR KILL_AT WORKLOAD...

Reads DIR/failover-WORKLOAD-BACKEND.json (requests completed in each second, errors), .victim
(the node killed), .verdict (the run's data check) and, for the mount backends,
.regen.csv (the client's regenerations in progress and started, each second). Per run: the
rate before the kill (seconds 2 .. KILL_AT, the first ones warm up), after it (from KILL_AT to
the end), the seconds from the kill until a second reaches 80% of the rate before (never:
"-"), when the lost node's slabs were rebuilt (the last second with a regeneration in
progress, and how many were started), and whether the application failed or read a wrong
value. Writes DIR/failover-WORKLOAD.png (matplotlib).
"""
import glob
import json
import os
import statistics
import sys

from plotting import pyplot


def load(path):
    with open(path) as f:
        return json.load(f)


def text(path, default):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return default


def rebuilt(path, kill_at):
    """When the regenerations after the kill ended: "s N (M started)", or "" without data."""
    try:
        with open(path) as f:
            rows = [line.strip().split(",") for line in f.readlines()[1:] if line.strip()]
    except OSError:
        return ""
    rows = [(float(t), int(p), int(n)) for t, p, n in rows]
    after = [r for r in rows if r[0] >= kill_at]
    if not after:
        return ""
    base = next((r[2] for r in reversed(rows) if r[0] < kill_at), 0)
    started = after[-1][2] - base
    busy = [r[0] for r in after if r[1] > 0]
    if not started:
        return "no regeneration"
    # Done between two samples: the first sample that shows it started (and ended).
    seen = next(r[0] for r in after if r[2] > base)
    end = f"s {max(busy[-1] if busy else 0, seen):.0f}"
    still = " (still running at the end)" if after[-1][1] > 0 else ""
    return f"rebuilt by {end}{still}, {started} regenerations"


def row(series, kill_at):
    before = series[2:kill_at] or series[:kill_at]
    pre = statistics.mean(before) if before else 0
    # The last second is partial.
    after = series[kill_at:-1] or series[kill_at:]
    post = statistics.mean(after) if after else 0
    back = next((i for i, n in enumerate(series[kill_at:-1]) if pre and n >= 0.8 * pre), None)
    return pre, post, back


def main():
    out, kill_at, workloads = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    print(f"node killed at {kill_at} s (the one holding the most slabs); requests per second")
    print(f"{'workload':<14} {'backend':<18} {'before':>8} {'after':>8} {'x before':>8} "
          f"{'back to 80%':>12}  data / application")
    for w in workloads:
        runs = {}
        for path in sorted(glob.glob(os.path.join(out, f"failover-{w}-*.json"))):
            b = path[len(os.path.join(out, f"failover-{w}-")):-len(".json")]
            runs[b] = load(path)
            pre, post, back = row(runs[b]["ops_per_second"], kill_at)
            verdict = text(path[:-5] + ".verdict", "FAIL no verdict")
            victim = text(path[:-5] + ".victim", "none")
            ratio = f"{post / pre:.2f}" if pre else "-"
            backs = "-" if back is None else f"{back} s"
            regen = rebuilt(path[:-5] + ".regen.csv", kill_at)
            print(f"{w:<14} {b:<18} {pre:>8.0f} {post:>8.0f} {ratio:>8} {backs:>12}  "
                  f"{verdict} (node {victim} killed){'; ' + regen if regen else ''}")
        if not runs:
            continue
        plt = pyplot("failover.py")
        if plt is None:
            continue
        fig, ax = plt.subplots(figsize=(8, 4))
        for b, r in runs.items():
            s = r["ops_per_second"][:-1]
            ax.plot(range(len(s)), [n / 1000 for n in s], label=b, marker=".")
        ax.axvline(kill_at, color="black", linestyle="--", linewidth=1)
        ax.text(kill_at + 0.3, ax.get_ylim()[1] * 0.95, "node killed", va="top")
        ax.set_xlabel("seconds")
        ax.set_ylabel("thousand requests / s")
        ax.set_title(f"{w} at 50% local memory, a memory node SIGKILLed")
        ax.legend()
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(os.path.join(out, f"failover-{w}.png"), dpi=110)


if __name__ == "__main__":
    main()
