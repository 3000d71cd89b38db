"""The CDFs of 4 KiB swap-in and page-write latency per backend, from bench-apps's pagein runs.

  pagein_cdf.py DIR

Reads DIR/pagein-BACKEND-FRACTION-rROUND.json (hydramem-fault-probe's reports) and writes
DIR/pagein-cdf.png: on the left the page-ins (reads of pages not resident before: the swap-in
latency, paper Fig. 9a, or the pager's page-in under `hydramem run`; a probe report without
them gives its major faults), on
the right the first writes of pages (each with a page-out once memory is full, the
page-out cost as the writer sees it); one line per backend and fraction (the first
round's), latency on a log scale.
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
            j = json.load(f)
        page_ins = j.get("absent_reads") or j["major_faults"]
        cdfs = (page_ins["cdf"], j["page_writes"]["cdf"])
        if cdfs[0] and label not in runs:
            runs[label] = cdfs
    if not runs:
        return
    plt = pyplot("pagein_cdf.py")
    if plt is None:
        return
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    titles = ("Page-in: reads of 4 KiB pages not resident", "Page-out: first writes of pages (memory full)")
    for i, (ax, title) in enumerate(zip(axes, titles)):
        for label, cdfs in runs.items():
            ax.plot([c[0] for c in cdfs[i]], [c[1] for c in cdfs[i]], label=label)
        ax.set_xscale("log")
        ax.set_xlabel("latency seen by the program (µs)")
        ax.set_title(title)
        ax.grid(alpha=0.3, which="both")
    axes[0].set_ylabel("fraction")
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "pagein-cdf.png"), dpi=110)
    print(f"pagein: CDFs of swap-in and page-write latency in {os.path.join(out, 'pagein-cdf.png')}")


if __name__ == "__main__":
    main()
