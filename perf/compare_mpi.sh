#!/bin/bash
# compare_mpi.sh - one collective, Loom against Open MPI, with the same
# benchmark harness on both sides (X_perf.c + perf_common.c, linked with
# backend_loom.c or with perf/peers/backend_mpi.c).  The two are run in
# turn, REPEATS times each, so that drift on a shared machine hits both
# alike; the table gives, per size, the median time and busbw of each and
# the ratio of the busbw (above 1: Loom is faster).
#
#   perf/compare_mpi.sh [-c COLL] [-n RANKS] [-b MIN] [-e MAX] [-f FACTOR]
#                       [-r REPEATS] [-m "MPIRUN OPTIONS"] [-B] [-- PERF FLAGS]
#
#   COLL      all_reduce (default), reduce_scatter, all_gather, alltoall,
#             broadcast, reduce, gather, scatter or sendrecv (NCCL's and
#             MPI's spellings work too: allreduce, allgather, bcast, ...)
#   RANKS     4;  MIN, MAX: 8 and 16M;  FACTOR: 4;  REPEATS: 5
#   MPIRUN OPTIONS   "--mca btl tcp,self": Open MPI over TCP only, as Loom
#   -B               bind both alike: rank i to CPU i mod (CPUs), with
#                    loomrun --bind core and mpirun --bind-to
#                    core:overload-allowed --map-by core
#   -M               both sides' glibc keeps what is freed
#                    (MALLOC_MMAP_THRESHOLD_ and MALLOC_TRIM_THRESHOLD_ at
#                    4 GiB): Open MPI allocates temporaries of the
#                    message's size in each call, and above 32 MiB glibc
#                    maps fresh pages for them every time.  Where page
#                    faults are slow (a VM: 64 MiB took 176 ms to fault in
#                    on one), that, not the transport, is then Open MPI's
#                    time.  Quote both.
#   PERF FLAGS       passed to both binaries after -n 10 -w 3 -c 1 (which
#                    they override), e.g. -- -d double -r 1 -n 50
#
# Run it from a build directory (it uses ./loomrun and ./COLL_perf), or
# set BUILDDIR.  The MPI twin is built with mpicc into MPI_PERF_DIR
# (default: a per-user directory under ${TMPDIR:-/tmp}) when missing or
# older than its sources.  Rows whose results were wrong in any run are
# marked "!"; a run that fails is reported and left out.
set -u
src=$(cd "$(dirname "$0")/.." && pwd)
. "$src/perf/compare_lib.sh"
coll=all_reduce ranks=4 minb=8 maxb=16M factor=4 reps=5
mopts="--mca btl tcp,self"
usage() { sed -n '2,/^set -u/{/^#/s/^# \{0,1\}//p}' "$0"; exit 0; }
die() { echo "compare_mpi.sh: $*; try -h" >&2; exit 2; }
lbind=() mbind="" menv=() mx=()
while getopts "c:n:b:e:f:r:m:BMh" o; do
    case $o in
    c) coll=$OPTARG ;; n) ranks=$OPTARG ;; b) minb=$OPTARG ;; e) maxb=$OPTARG ;;
    f) factor=$OPTARG ;; r) reps=$OPTARG ;; m) mopts=$OPTARG ;; h) usage ;;
    B) lbind=(--bind core) mbind="--bind-to core:overload-allowed --map-by core" ;;
    M) compare_keep_freed ;;
    *) die "bad option" ;;
    esac
done
shift $((OPTIND - 1))
[ "${1:-}" = -- ] && shift
extra=(-n 10 -w 3 -c 1 "$@") # later flags win
c=$(compare_coll "$coll") || die "unknown collective '$coll'"
coll=$c
case "$ranks$reps" in *[!0-9]*) die "-n and -r take numbers" ;; esac

bld=${BUILDDIR:-.}
loom=$bld/${coll}_perf
for f in "$bld/loomrun" "$loom"; do
    [ -x "$f" ] || die "no $f: run from a build directory or set BUILDDIR"
done
mpi=$(compare_mpi_twin "$coll") || { echo "compare_mpi.sh: no MPI benchmark" >&2; exit 1; }

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
out=$(mktemp -d) || exit 1
trap 'rm -rf "$out"' EXIT
flags=(-b "$minb" -e "$maxb" -f "$factor" "${extra[@]}")
echo "# $coll, $ranks ranks, ${flags[*]}; $reps runs each, alternating"
echo "# Loom: $loom via loomrun ${lbind[*]}${LOOM_ALGO:+, LOOM_ALGO=$LOOM_ALGO}"
echo "# Open MPI: $mpi via mpirun $mopts $mbind"
[ ${#menv[@]} -gt 0 ] && echo "# both: ${menv[*]}"
for k in $(seq "$reps"); do
    line="# run $k:"
    line+=$(compare_run loom "$out/loom.$k" env "${menv[@]}" "$bld/loomrun" -n "$ranks" "${lbind[@]}" "$loom" "${flags[@]}" -J "$out/loom.$k")
    rc=$?
    # shellcheck disable=SC2086 # mopts is a list of options
    line+=,$(compare_run "open mpi" "$out/mpi.$k" env "${menv[@]}" mpirun $mopts $mbind "${mx[@]}" --oversubscribe -np "$ranks" "$mpi" "${flags[@]}" -J "$out/mpi.$k")
    rc2=$?
    echo "$line"
    [ $rc -eq 0 ] || compare_errs loom "$out/loom.$k"
    [ $rc2 -eq 0 ] || compare_errs mpi "$out/mpi.$k"
    [ $k -eq 1 ] && grep -h '^# Skipping' "$out/loom.$k.out" "$out/mpi.$k.out"
done

# The -J records: one JSON object a line, a row of the table each, with
# more precision than the table.
awk "$COMPARE_AWK"'
function tm(t) { return t == "" ? "-" : t < 1e4 ? sprintf("%.1f", t) : sprintf("%.0f", t) }
function bw(b) { return b == "" ? "-" : sprintf("%.4f", b) }
FNR == 1 { side = FILENAME ~ /\/loom\.[0-9]+$/ ? "L" : "M" }
/^\{/ {
    key = get("size") SUBSEP get("type") SUBSEP get("redop") SUBSEP get("root")
    if (!(key in seen)) { seen[key] = ++nkeys; keys[nkeys] = key }
    series[get("type") " " get("redop") " " get("root")] = 1
    for (m = 0; m < 2; m++) {
        p = m ? "ip_" : "oop_"
        T[side, m, key] = T[side, m, key] " " get(p "time_us")
        B[side, m, key] = B[side, m, key] " " get(p "busbw")
        w = get(p "wrong")
        if (w != "0" && w != "null") bad[side, m, key] = 1
    }
}
END {
    ns = 0; for (s in series) ns++
    pad = ns > 1 ? sprintf(" %-17s", "") : ""
    printf "#%9s%s  %-38s    %s\n", "", pad, "--------------- out of place ---------------", "----------------- in place -----------------"
    pad = ns > 1 ? sprintf(" %-17s", "type redop root") : ""
    printf "#%9s%s %10s %8s %10s %8s %5s   %10s %8s %10s %8s %5s\n", "size", pad, "loom us", "busbw", "ompi us", "busbw", "ratio", "loom us", "busbw", "ompi us", "busbw", "ratio"
    for (i = 1; i <= nkeys; i++) {
        k = keys[i]; split(k, q, SUBSEP)
        line = sprintf("%10s", q[1])
        if (ns > 1) line = line sprintf(" %-17s", q[2] " " q[3] " " q[4])
        for (m = 0; m < 2; m++) {
            lt = median(T["L", m, k]); lb = median(B["L", m, k])
            mt = median(T["M", m, k]); mb = median(B["M", m, k])
            # The ratio of the times is that of the busbw, and exact at
            # sizes where the busbw rounds to 0 (or is 0: one rank).
            r = (lt != "" && mt != "" && lt > 0) ? sprintf("%.2f", mt / lt) : "-"
            lm = bad["L", m, k] ? "!" : " "
            mm = bad["M", m, k] ? "!" : " "
            line = line sprintf(" %10s%s%8s %10s%s%8s %5s", tm(lt), lm, bw(lb), tm(mt), mm, bw(mb), r)
            if (m == 0) line = line " "
        }
        print line
    }
    if (nkeys == 0) print "# no rows: every run failed"
    print "# us: median time; busbw: median, GB/s; ratio: Open MPI time / Loom time (> 1: Loom faster); !: wrong results in a run"
}' $(for k in $(seq "$reps"); do for s in loom mpi; do [ -s "$out/$s.$k" ] && echo "$out/$s.$k"; done; done) </dev/null
