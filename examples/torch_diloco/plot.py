#!/usr/bin/python3
"""plot.py OUT.png RUN.csv... - the table of the runs diloco.py wrote, and
(with matplotlib) the eval loss against wall clock and against bytes sent.

The table: final eval loss, bytes this worker sent, wall clock, and the
wall clock and bytes at which each run first reached the common loss: the
highest final loss of the runs (so every run reached it).
"""
import csv
import os
import sys


def load(path):
    rows = list(csv.DictReader(open(path)))
    pts = [(int(r["step"]), float(r["wall_s"]), float(r["eval_loss"]), int(r["bytes_sent"]))
           for r in rows]
    label = "%s %s" % (rows[-1]["mode"], rows[-1]["codec"]) if rows else os.path.basename(path)
    return label, pts


def first_at(pts, target):
    """Wall clock and bytes where the eval loss first reached target
    (linear between evaluations)."""
    prev = None
    for p in pts:
        if p[2] <= target:
            if prev is None or prev[2] == p[2]:
                return p[1], p[3]
            f = (prev[2] - target) / (prev[2] - p[2])
            return prev[1] + f * (p[1] - prev[1]), prev[3] + f * (p[3] - prev[3])
        prev = p
    return None, None


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    png, paths = sys.argv[1], sys.argv[2:]
    runs = [load(p) for p in paths if os.path.getsize(p)]
    target = max(p[-1][2] for _, p in runs)
    print("%-16s %10s %14s %9s   to loss %.3f: %8s %14s" % (
        "run", "final_loss", "bytes_sent", "wall_s", target, "wall_s", "bytes_sent"))
    for label, p in runs:
        t, b = first_at(p, target)
        print("%-16s %10.4f %14d %9.1f   %17s %8.1f %14d" % (
            label, p[-1][2], p[-1][3], p[-1][1], "", t, b))
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not found: no plot (Debian: python3-matplotlib)")
        return
    fig, ax = plt.subplots(1, 2, figsize=(12, 4.5))
    for label, p in runs:
        ax[0].plot([q[1] for q in p], [q[2] for q in p], marker=".", label=label)
        ax[1].plot([max(q[3], 1) for q in p], [q[2] for q in p], marker=".", label=label)
    ax[0].set_xlabel("wall clock (s)")
    ax[1].set_xlabel("bytes sent by a worker")
    ax[1].set_xscale("log")
    for a in ax:
        a.set_ylabel("eval loss (nats per byte)")
        a.axhline(target, color="grey", linewidth=0.5, linestyle="--")
        a.grid(alpha=0.3)
        a.legend()
    fig.suptitle(os.path.basename(os.path.dirname(os.path.abspath(png))))
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    print("plot: %s" % png)


if __name__ == "__main__":
    main()
