#!/bin/bash
# perf/compare_all.sh in its quick mode (-q: all_reduce and alltoall, 8 B
# to 64 KiB, 1 repeat, 2 ranks) with every peer installed here: the
# tables, medians.csv (parsed: every peer and size, numbers, no wrong
# rows) and ratios.png (a PNG's signature and header).  Then the ways it
# must not fail: a peer that is not installed (torch made unimportable) is
# left out with a note; a run that fails (an unknown LOOM_ALGO) is
# reported and left out; and one job per size (-S).  Skipped without
# python3 and matplotlib, which draw the tables and the plot.
. "$(dirname "$0")/../lib.sh"
py=${PYTHON:-/usr/bin/python3}
[ -x "$py" ] || py=$(command -v python3) || { echo "python3 not found: skipping"; exit 77; }
"$py" -c 'import matplotlib' 2>/dev/null || { echo "no matplotlib for $py: skipping"; exit 77; }
export PYTHON=$py
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmp_all() { # cmp_all OUTDIR OPTIONS...: compare_all.sh from the build dir
    out=$(cd "$BUILDDIR" && timeout 120 bash "$SRCDIR/perf/compare_all.sh" -o "$1" "${@:2}" 2>&1)
    rc=$?
}

# The peers that should take part.
peers=loom
command -v mpirun >/dev/null && command -v mpicc >/dev/null && peers+=,mpi-tcp,mpi-vader
"$py" -c 'import torch.distributed as d; assert d.is_gloo_available()' 2>/dev/null && peers+=,gloo
progress "quick comparison of $peers"
cmp_all "$tmp/q" -q
check "compare_all.sh -q exits 0" [ "$rc" -eq 0 ]
for p in $(tr ',' ' ' <<<"$peers"); do
    check "$p ran" grep -q "^# all_reduce run 1:.* $p ok" <<<"$out"
done
# Every size from 8 B to 64 KiB (2 ranks: alltoall's 8 B is one float a
# rank), every peer, one run each, times above 0, no wrong results.
csv_ok() { # csv_ok CSV COLLS PEERS MIN MAX
    "$py" - "$@" <<'EOF'
import csv, sys
path, colls, peers, lo, hi = sys.argv[1], sys.argv[2].split(","), sys.argv[3].split(","), int(sys.argv[4]), int(sys.argv[5])
with open(path, newline="") as f:
    r = csv.reader(f)
    assert next(r) == ["collective", "nranks", "size", "peer", "median_us", "runs", "wrong"], "header"
    rows = list(r)
sizes = [s for s in (lo << k for k in range(40)) if s <= hi]
got = {(c, int(s), p): (n, m, k, w) for c, n, s, p, m, k, w in rows}
assert len(got) == len(rows), "a row twice"
for c in colls:
    for p in peers:
        for s in sizes:
            n, m, k, w = got.pop((c, s, p))
            assert n == "2" and k == "1" and w == "0", (c, s, p, n, k, w)
            assert float(m) > 0, (c, s, p, m)
assert not got, "rows not asked for: %s" % sorted(got)[:3]
EOF
}
check "medians.csv: every collective, size and peer, well-formed" \
    csv_ok "$tmp/q/medians.csv" all_reduce,alltoall "$peers" 8 65536
# The tables: 14 rows each, a summary line each, the summary table.
for c in all_reduce alltoall; do
    n=$(awk -v c="$c" '/^# [a-z_]+, / { on = index($0, "# " c ",") == 1 } /^$/ { on = 0 }
        on && /^ +[0-9]+K? +[0-9.]+ /' "$tmp/q/table.txt" | wc -l)
    check "table.txt: $c has 14 rows ($n)" [ "$n" -eq 14 ]
    if [ "$peers" != loom ]; then
        check "table.txt: $c summary line" grep -q "^# $c summary: .*geomean [0-9.]*, worst [0-9.]* at " "$tmp/q/table.txt"
    fi
done
check "stdout holds the tables too" grep -q "^# alltoall summary\|^# alltoall, 2 ranks" <<<"$out"
png_ok() { # the PNG signature, then an IHDR chunk of a non-empty image
    "$py" -c '
import struct, sys
b = open(sys.argv[1], "rb").read(24)
assert b[:8] == b"\x89PNG\r\n\x1a\n" and b[12:16] == b"IHDR", b[:16]
w, h = struct.unpack(">II", b[16:24])
assert w > 100 and h > 100, (w, h)' "$1"
}
check "ratios.png is a PNG" png_ok "$tmp/q/ratios.png"
# plot_compare.py redraws from the CSV alone.
check "plot_compare.py redraws the PNG" "$py" "$SRCDIR/perf/plot_compare.py" \
    "$tmp/q/medians.csv" -o "$tmp/again.png"
check "the redrawn PNG is a PNG" png_ok "$tmp/again.png"

# No torch: gloo left out with a note, the others still compared.
mkdir -p "$tmp/notorch/torch"
echo 'raise ImportError("hidden by test_compare_all.sh")' >"$tmp/notorch/torch/__init__.py"
PYTHONPATH=$tmp/notorch cmp_all "$tmp/nt" -q -c all_reduce -e 64 -p loom,gloo
check "no torch: exit 0" [ "$rc" -eq 0 ]
check "no torch: gloo left out with a note" grep -q "^# gloo left out: no torch" <<<"$out"
check "no torch: loom still measured" csv_ok "$tmp/nt/medians.csv" all_reduce loom 8 64

# A failed run: reported, left out, no failure of the script.
LOOM_ALGO=allreduce:no_such_algorithm cmp_all "$tmp/f" -q -c all_reduce -e 64 -p loom
check "failed run: exit 0" [ "$rc" -eq 0 ]
check "failed run: reported" grep -q "^# all_reduce run 1: loom FAILED (exit [0-9]*)" <<<"$out"
check "failed run: its error shown" grep -q "^#   loom\.1: .*no_such_algorithm" <<<"$out"
check "failed run: no medians" [ "$(wc -l <"$tmp/f/medians.csv")" -eq 1 ]

# A job per size.
cmp_all "$tmp/s" -q -S -c all_reduce -e 64 -p loom
check "-S: exit 0, 4 of 4 jobs" grep -q "^# all_reduce run 1: loom 4/4 ok" <<<"$out"
check "-S: every size in the CSV" csv_ok "$tmp/s/medians.csv" all_reduce loom 8 64
# Bad options are refused.
cmp_all "$tmp/b" -c no_such_collective
check "unknown collective refused (exit 2)" [ "$rc" -eq 2 ]
check "unknown collective named" grep -q "unknown collective 'no_such_collective'" <<<"$out"
finish
