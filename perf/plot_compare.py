#!/usr/bin/python3
"""plot_compare.py - the tables and the plot of perf/compare_all.sh, from
its medians.csv alone (so that either can be redrawn):

    python3 perf/plot_compare.py compare-DATE/medians.csv -o ratios.png

prints, per collective, the median out-of-place time of each peer and the
ratios peer time / Loom time (above 1: Loom faster), with a summary line
(the geometric mean of the ratios and the worst size); then one table of
those summaries, and draws ratio against size, a panel per collective, a
line per peer, a line at 1.0 (matplotlib; without it, no plot and a note).
--only COLL: that collective's table; --no-plot: no PNG; --summary: the
summary table instead of the collectives' tables.
"""
import argparse
import csv
import math
import sys

PEERS = ("loom", "mpi-tcp", "mpi-vader", "gloo")
ORDER = ("all_reduce", "reduce_scatter", "all_gather", "alltoall", "broadcast",
         "reduce", "gather", "scatter", "sendrecv")


def load(path):
    """{coll: {"nranks": n, "peers": [...], "rows": {size: {peer: (us or
    None for n/a, runs, wrong)}}}}"""
    data = {}
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            d = data.setdefault(r["collective"], {"nranks": r["nranks"], "peers": [], "rows": {}})
            if r["peer"] not in d["peers"]:
                d["peers"].append(r["peer"])
            us = None if r["median_us"] == "n/a" else float(r["median_us"])
            d["rows"].setdefault(int(r["size"]), {})[r["peer"]] = (us, int(r["runs"]),
                                                                  int(r["wrong"]))
    for d in data.values():  # Loom, Open MPI, Gloo, then others by name
        d["peers"].sort(key=lambda p: (PEERS.index(p) if p in PEERS else len(PEERS), p))
    return dict(sorted(data.items(), key=lambda kv: (
        ORDER.index(kv[0]) if kv[0] in ORDER else len(ORDER), kv[0])))


def human(b):
    for unit, m in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if b >= m and b % m == 0:
            return "%d%s" % (b // m, unit)
    return str(b)


def ratios(d, peer):
    """[(size, peer time / Loom time)] where both were measured."""
    out = []
    for size, row in sorted(d["rows"].items()):
        lo, pe = row.get("loom"), row.get(peer)
        if lo and pe and lo[0] and pe[0] is not None:
            out.append((size, pe[0] / lo[0]))
    return out


def summary(d, peer):
    """(geometric mean, worst ratio, its size) or None."""
    r = ratios(d, peer)
    if not r:
        return None
    g = math.exp(sum(math.log(x) for _, x in r) / len(r))
    size, worst = min(r, key=lambda sx: sx[1])
    return g, worst, size


def cell(v):
    us, _, wrong = v if v else (None, 0, 0)
    if v is None:
        return "-"
    if us is None:
        return "n/a"
    return ("%.1f" % us if us < 1e4 else "%.0f" % us) + ("!" if wrong else "")


def table(coll, d):
    peers = d["peers"]
    others = [p for p in peers if p != "loom"]
    print("# %s, %s ranks: median out-of-place time (us); ratio: peer / Loom (> 1: Loom faster)"
          % (coll, d["nranks"]))
    head = "#%9s" % "size" + "".join(" %12s" % (p + " us") for p in peers)
    if "loom" in peers:
        head += "".join(" %9s" % p for p in others)
    print(head)
    for size, row in sorted(d["rows"].items()):
        line = "%10s" % human(size) + "".join(" %12s" % cell(row.get(p)) for p in peers)
        if "loom" in peers:
            lo = row.get("loom")
            for p in others:
                pe = row.get(p)
                if pe and pe[0] is None:
                    r = "n/a"
                elif lo and pe and lo[0]:
                    r = "%.2f" % (pe[0] / lo[0])
                else:
                    r = "-"
                line += " %9s" % r
        print(line)
    parts = []
    for p in others:
        s = summary(d, p)
        parts.append("%s %s" % (p, "geomean %.2f, worst %.2f at %s" % (s[0], s[1], human(s[2]))
                                if s else "n/a"))
    if parts and "loom" in peers:
        print("# %s summary: %s" % (coll, "; ".join(parts)))
    if any(v[2] for row in d["rows"].values() for v in row.values()):
        print("# !: wrong results in a run")
    print()


def summary_table(data):
    peers = []
    for d in data.values():
        peers += [p for p in d["peers"] if p != "loom" and p not in peers]
    print("# peer time / Loom time, out of place, medians (> 1: Loom faster): geometric mean"
          " over the sizes (worst: ratio@size)")
    print("#%15s" % "collective" + "".join(" %24s" % p for p in peers))
    for coll, d in data.items():
        line = "%16s" % coll
        for p in peers:
            s = summary(d, p) if p in d["peers"] and "loom" in d["peers"] else None
            line += " %24s" % ("%.2f (worst %.2f@%s)" % (s[0], s[1], human(s[2])) if s else
                               "n/a" if p in d["peers"] else "-")
        print(line)


def plot(data, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("# no matplotlib: %s not drawn" % path)
        return 1
    n = len(data)
    cols = min(3, n)
    rows = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.6 * rows), squeeze=False)
    for ax, (coll, d) in zip(axes.flat, data.items()):
        for p in d["peers"]:
            if p == "loom":
                continue
            r = ratios(d, p)
            if r:
                line, = ax.plot([s for s, _ in r], [x for _, x in r], marker=".", label=p)
                bad = [(s, x) for s, x in r if d["rows"][s]["loom"][2] or d["rows"][s][p][2]]
                if bad:  # wrong results in a run, either side
                    ax.plot([s for s, _ in bad], [x for _, x in bad], "x", markersize=9,
                            color=line.get_color())
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title("%s, %s ranks" % (coll, d["nranks"]))
        ax.set_xlabel("size (B)")
        ax.set_ylabel("peer time / Loom time")
        ax.legend(fontsize="small")
        ax.grid(True, which="both", alpha=0.3)
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    fig.suptitle("Loom against its peers (above 1: Loom faster)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("csv")
    p.add_argument("-o", "--output", default="ratios.png")
    p.add_argument("--only", default=None)
    p.add_argument("--no-plot", action="store_true")
    p.add_argument("--summary", action="store_true")
    o = p.parse_args()
    data = load(o.csv)
    if o.only:
        data = {k: v for k, v in data.items() if k == o.only}
    if not data:
        print("# no medians%s in %s" % (" of " + o.only if o.only else "", o.csv))
        return 0
    if o.summary:
        summary_table(data)
    else:
        for coll, d in data.items():
            table(coll, d)
    return 0 if o.no_plot else plot(data, o.output)


if __name__ == "__main__":
    sys.exit(main())
