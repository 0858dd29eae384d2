#!/bin/bash
# compare_all.sh - the whole comparison: every collective, 8 B to 64 MiB,
# Loom against Open MPI over TCP (--mca btl tcp,self), Open MPI over shared
# memory (--mca btl vader,self) and Gloo (torch.distributed), each with
# nccl-tests' defaults.  Loom and Open MPI run the same benchmark harness
# (X_perf.c, see perf/peers/README), Gloo perf/peers/gloo_perf.py, which
# steps, times and checks alike.  The peers take turns within each repeat
# (round robin), so that drift on a shared machine hits all alike; per
# size the median out-of-place time of the repeats is taken.
#
#   perf/compare_all.sh [-c LIST] [-n RANKS] [-b MIN] [-e MAX] [-f FACTOR]
#                       [-r REPEATS] [-p PEERS] [-o DIR] [-t SECONDS] [-S]
#                       [-M] [-q] [-- PERF FLAGS]
#
#   LIST      collectives, comma-separated (default: all nine: all_reduce,
#             reduce_scatter, all_gather, alltoall, broadcast, reduce,
#             gather, scatter, sendrecv)
#   RANKS     4;  MIN, MAX: 8 and 64M;  FACTOR: 2;  REPEATS: 5
#   PEERS     of loom, mpi-tcp, mpi-vader, gloo (default: all four)
#   DIR       where the results go (default: compare-DATE-TIME here):
#             table.txt (the tables, as printed), medians.csv (the
#             medians: collective, nranks, size, peer, median_us, runs,
#             wrong; median_us "n/a" where the peer lacks the
#             collective), ratios.png (ratio against size, a panel per
#             collective) and runs/ (each run's records and output)
#   SECONDS   a run's limit (600); one that overruns counts as failed
#   -S        one job per size (as a user running the binaries size by
#             size: every size pays for its own start and warm-up), not
#             one job per collective and peer
#   -M        glibc keeps what is freed, for every peer (see compare_mpi.sh)
#   -q        quick: all_reduce and alltoall, 8 B to 64 KiB, 1 repeat,
#             2 ranks (options given take precedence)
#   PERF FLAGS  passed to every peer after -w 5 -n 20 -c 1 (nccl-tests'
#             iterations; the harness's warm-up), e.g. -- -w 1
#
# Loom's settings come from the environment, e.g. LOOM_TRANSPORT=tcp to
# weigh Loom over TCP against mpi-tcp (the table's header says so).
# Run it from a build directory (it uses ./loomrun and ./COLL_perf), or set
# BUILDDIR.  A peer that is not installed (no mpirun or mpicc; no torch for
# /usr/bin/python3, or PYTHON) is left out with a note; a run that fails
# is reported and left out; "!" marks a median whose rows were wrong in a
# run.  The tables and the plot come from perf/plot_compare.py, which
# redraws them from medians.csv alone.
set -u
src=$(cd "$(dirname "$0")/.." && pwd)
. "$src/perf/compare_lib.sh"
usage() { sed -n '2,/^set -u/{/^#/s/^# \{0,1\}//p}' "$0"; exit 0; }
die() { echo "compare_all.sh: $*; try -h" >&2; exit 2; }
all=all_reduce,reduce_scatter,all_gather,alltoall,broadcast,reduce,gather,scatter,sendrecv
peers=loom,mpi-tcp,mpi-vader,gloo
outdir=compare-$(date +%Y%m%d-%H%M%S) limit=600 per_size=0 quick=0 menv=() mx=()
declare -A given=() d
while getopts "c:n:b:e:f:r:p:o:t:SMqh" o; do
    case $o in
    c | n | b | e | f | r) given[$o]=$OPTARG ;;
    p) peers=$OPTARG ;; o) outdir=$OPTARG ;; t) limit=$OPTARG ;;
    S) per_size=1 ;; q) quick=1 ;; h) usage ;;
    M) compare_keep_freed ;;
    *) die "bad option" ;;
    esac
done
shift $((OPTIND - 1))
[ "${1:-}" = -- ] && shift
if [ $quick = 1 ]; then
    d=([c]="all_reduce,alltoall" [n]=2 [b]=8 [e]=64K [f]=2 [r]=1)
else
    d=([c]=$all [n]=4 [b]=8 [e]=64M [f]=2 [r]=5)
fi
opt() { echo "${given[$1]:-${d[$1]}}"; }
colls=() ranks=$(opt n) reps=$(opt r) factor=$(opt f)
for c in $(tr ',' ' ' <<<"$(opt c)"); do
    name=$(compare_coll "$c") || die "unknown collective '$c'"
    colls+=("$name")
done
minb=$(compare_bytes "$(opt b)") || die "bad size '$(opt b)'"
maxb=$(compare_bytes "$(opt e)") || die "bad size '$(opt e)'"
case "$ranks$reps$factor$limit" in *[!0-9]*) die "-n, -r, -f and -t take numbers" ;; esac
if [ "$factor" -lt 2 ] || [ "$minb" -lt 1 ] || [ "$minb" -gt "$maxb" ]; then
    die "need -f >= 2 and 1 <= MIN <= MAX"
fi
flags=(-w 5 -n 20 -c 1 "$@") # later flags win

bld=${BUILDDIR:-.}
for f in loomrun "${colls[@]/%/_perf}"; do
    [ -x "$bld/$f" ] || die "no $bld/$f: run from a build directory or set BUILDDIR"
done
py=${PYTHON:-/usr/bin/python3}
[ -x "$py" ] || py=$(command -v python3) || py=""

# The peers that can run here, each with a note when left out.
use=()
for p in $(tr ',' ' ' <<<"$peers"); do
    case $p in
    loom) use+=(loom) ;;
    mpi-tcp | mpi-vader)
        if command -v mpirun >/dev/null && command -v mpicc >/dev/null; then use+=("$p")
        else echo "# $p left out: no mpirun or mpicc (Open MPI) on PATH"; fi ;;
    gloo)
        if [ -n "$py" ] && "$py" -c 'import torch.distributed as d; assert d.is_available() and d.is_gloo_available()' 2>/dev/null
        then use+=(gloo)
        else echo "# gloo left out: no torch.distributed with gloo for ${py:-python3}"; fi ;;
    *) die "unknown peer '$p'" ;;
    esac
done
[ ${#use[@]} -gt 0 ] || die "no peer to run"

sizes=() s=$minb
while [ "$s" -le "$maxb" ]; do sizes+=("$s"); s=$((s * factor)); done
mkdir -p "$outdir/runs" || exit 1
csv=$outdir/medians.csv table=$outdir/table.txt
echo "collective,nranks,size,peer,median_us,runs,wrong" >"$csv"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
{
    echo "# compare_all.sh: ${colls[*]}; $ranks ranks; $minb to $maxb B, factor $factor;" \
        "${flags[*]}; $reps repeats, peers in turn; $([ $per_size = 1 ] && echo "a job per size" || echo "a job per collective")"
    echo "# peers: ${use[*]}${LOOM_ALGO:+; LOOM_ALGO=$LOOM_ALGO}${LOOM_TRANSPORT:+; LOOM_TRANSPORT=$LOOM_TRANSPORT}${menv[*]:+; ${menv[*]}}"
} | tee "$table"

run_peer() { # run_peer PEER COLL BASE SIZE-FLAGS...: one job; its status line
    local p=$1 c=$2 base=$3
    shift 3
    local lim=(timeout -k 10 "$limit") mpi
    case $p in
    loom) compare_run "$p" "$base" "${lim[@]}" env "${menv[@]}" "$bld/loomrun" -n "$ranks" \
        "$bld/${c}_perf" "$@" "${flags[@]}" -J "$base.json" ;;
    mpi-*)
        mpi=$(compare_mpi_twin "$c" 2>"$base.err") || { echo " $p FAILED (no MPI build)"; return 1; }
        compare_run "$p" "$base" "${lim[@]}" env "${menv[@]}" mpirun --mca btl "${p#mpi-},self" \
            "${mx[@]}" --oversubscribe -np "$ranks" "$mpi" "$@" "${flags[@]}" -J "$base.json" ;;
    gloo) compare_run "$p" "$base" "${lim[@]}" env "${menv[@]}" "$py" "$src/perf/peers/gloo_perf.py" \
        "$c" -N "$ranks" "$@" "${flags[@]}" -J "$base.json" ;;
    esac
}

for c in "${colls[@]}"; do
    dir=$outdir/runs/$c
    mkdir -p "$dir"
    for k in $(seq "$reps"); do
        line="# $c run $k:" failed=()
        for p in "${use[@]}"; do
            if [ $per_size = 1 ]; then
                nok=0
                for s in "${sizes[@]}"; do
                    run_peer "$p" "$c" "$dir/$p.$k.$s" -b "$s" -e "$s" >/dev/null &&
                        nok=$((nok + 1)) || failed+=("$dir/$p.$k.$s")
                done
                line+=" $p $nok/${#sizes[@]} ok,"
            else
                line+=$(run_peer "$p" "$c" "$dir/$p.$k" -b "$minb" -e "$maxb" -f "$factor") ||
                    failed+=("$dir/$p.$k")
                line+=,
            fi
        done
        echo "${line%,}"
        for f in "${failed[@]}"; do # left out, also the rows it did finish
            compare_errs "${f##*/}" "$f"
            [ -f "$f.json" ] && mv -f "$f.json" "$f.json-failed"
        done
    done
    jsons=()
    for f in "$dir"/*.json; do [ -s "$f" ] && jsons+=("$f"); done
    # The medians of the repeats, a CSV row per peer and size: out of
    # place; "n/a" where the peer lacks the collective.
    awk "$COMPARE_AWK"'
    FNR == 1 { p = FILENAME; sub(/.*\//, "", p); sub(/\..*/, "", p) }
    /^\{/ {
        key = p SUBSEP get("size")
        if (!(key in seen)) { seen[key] = ++nkeys; keys[nkeys] = key }
        t = get("oop_time_us")
        if (t == "null") na[key] = 1; else { T[key] = T[key] " " t; runs[key]++ }
        w = get("oop_wrong")
        if (w != "0" && w != "null") bad[key] = 1
    }
    END {
        for (i = 1; i <= nkeys; i++) {
            split(keys[i], q, SUBSEP)
            m = runs[keys[i]] ? sprintf("%.3f", median(T[keys[i]])) : na[keys[i]] ? "n/a" : ""
            if (m != "") printf "%s,%s,%s,%s,%s,%d,%d\n", c, n, q[2], q[1], m, runs[keys[i]], bad[keys[i]]
        }
    }' c="$c" n="$ranks" "${jsons[@]}" </dev/null >>"$csv"
    grep -h '^# Skipping' "$dir"/*.1*.out 2>/dev/null | sort -u
    [ -n "$py" ] && "$py" "$src/perf/plot_compare.py" "$csv" --only "$c" --no-plot | tee -a "$table"
done

if [ -z "$py" ]; then
    echo "# no python3: the tables and the plot are left out; the medians are in $csv"
    exit 0
fi
"$py" "$src/perf/plot_compare.py" "$csv" --summary -o "$outdir/ratios.png" | tee -a "$table"
echo "# files: $table $csv $outdir/ratios.png $outdir/runs/"
