"""The CDF of 4 KiB major-fault latency per backend, from bench-apps's pagein runs.

  pagein_cdf.py DIR

Reads DIR/pagein-BACKEND-FRACTION-rROUND.json (hydramem-fault-probe's reports) and writes
DIR/pagein-cdf.png: one line per backend and fraction (the first round's), latency on a log
scale (paper Fig. 9a).
"""
import glob
import json
import os
import re
import sys

from plotting import pyplot


def main():
    out = sys.argv[1]
    runs = {}
    for path in sorted(glob.glob(os.path.join(out, "pagein-*-r*.json"))):
        m = re.match(r"pagein-(.+)-(\d+)-r(\d+)\.json$", os.path.basename(path))
        if not m:
            continue
        label = f"{m.group(1)} at {m.group(2)}%"
        with open(path) as f:
            cdf = json.load(f)["major_faults"]["cdf"]
        if cdf and label not in runs:
            runs[label] = cdf
    if not runs:
        return
    plt = pyplot("pagein_cdf.py")
    if plt is None:
        return
    fig, ax = plt.subplots(figsize=(7, 4))
    for label, cdf in runs.items():
        ax.plot([c[0] for c in cdf], [c[1] for c in cdf], label=label)
    ax.set_xscale("log")
    ax.set_xlabel("4 KiB major fault latency (µs)")
    ax.set_ylabel("fraction of faults")
    ax.set_title("Swap-in latency seen by the program (hydramem-fault-probe)")
    ax.grid(alpha=0.3, which="both")
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(out, "pagein-cdf.png"), dpi=110)
    print(f"pagein: CDF of major-fault latency in {os.path.join(out, 'pagein-cdf.png')}")


if __name__ == "__main__":
    main()
