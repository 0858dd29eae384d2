# shellcheck shell=bash
# compare_lib.sh - what compare_mpi.sh and compare_all.sh share; sourced
# by them, not run.  The caller sets src (the source tree) first.

# compare_coll NAME: the benchmark's name for a collective (NCCL's and
# MPI's spellings work too); status 1 when it is none.
compare_coll() {
    case $1 in
    allreduce | all_reduce) echo all_reduce ;;
    reducescatter | reduce_scatter | reduce_scatter_block) echo reduce_scatter ;;
    allgather | all_gather) echo all_gather ;;
    alltoall | all_to_all) echo alltoall ;;
    bcast | broadcast) echo broadcast ;;
    reduce | gather | scatter | sendrecv) echo "$1" ;;
    *) return 1 ;;
    esac
}

# compare_bytes SIZE: SIZE (K, M, G suffixes, powers of 1024, as the
# perf binaries read them) in bytes; status 1 when it is no size.
compare_bytes() {
    local n=${1%[kKmMgG]} m=1
    case $1 in *[kK]) m=1024 ;; *[mM]) m=1048576 ;; *[gG]) m=1073741824 ;; esac
    case $n in '' | *[!0-9]*) return 1 ;; esac
    echo $((n * m))
}

# compare_keep_freed: -M, glibc keeps what is freed (see compare_mpi.sh):
# the settings in menv (for env) and mx (for mpirun).
# shellcheck disable=SC2034 # for the caller
compare_keep_freed() {
    menv=(MALLOC_MMAP_THRESHOLD_=4294967296 MALLOC_TRIM_THRESHOLD_=4294967296)
    mx=(-x MALLOC_MMAP_THRESHOLD_ -x MALLOC_TRIM_THRESHOLD_)
}

# compare_mpi_twin COLL: the path of the MPI build of COLL_perf (the same
# harness with perf/peers/backend_mpi.c), built with mpicc into
# MPI_PERF_DIR (default: a per-user directory under ${TMPDIR:-/tmp})
# when missing or older than its sources; status 1 when that fails.
compare_mpi_twin() {
    local dir=${MPI_PERF_DIR:-${TMPDIR:-/tmp}/loom-mpi-perf.$(id -u)}
    local mpi=$dir/mpi_$1_perf stale=0 f
    local srcs=("$src/perf/$1_perf.c" "$src/perf/perf_common.c" "$src/perf/peers/backend_mpi.c")
    [ -x "$mpi" ] || stale=1
    for f in "${srcs[@]}" "$src/perf/perf_common.h" "$src/perf/bench_util.h"; do
        [ "$f" -nt "$mpi" ] && stale=1
    done
    if [ $stale = 1 ]; then
        mkdir -p "$dir" &&
            mpicc -std=c11 -O2 -D_GNU_SOURCE -o "$mpi" "${srcs[@]}" -lm -pthread >&2 || {
            echo "building $mpi with mpicc failed" >&2; return 1; }
    fi
    echo "$mpi"
}

# compare_run NAME BASE COMMAND...: runs COMMAND, its output in BASE.out
# and BASE.err; prints " NAME ok 1.2 s" or " NAME FAILED (exit 1) 1.2 s"
# and returns COMMAND's status.
compare_run() {
    local name=$1 base=$2 t0 t1 rc
    shift 2
    t0=$(date +%s.%N)
    "$@" >"$base.out" 2>"$base.err"
    rc=$?
    t1=$(date +%s.%N)
    awk -v a="$t0" -v b="$t1" -v rc=$rc -v n="$name" 'BEGIN {
        printf " %s %s %.1f s", n, rc ? "FAILED (exit " rc ")" : "ok", b - a }'
    return $rc
}

# compare_errs NAME BASE: the first lines of a failed run's errors, less
# the launchers' chatter, as comment lines.
compare_errs() {
    grep -v '^loom\[\|^-\|^ *$' "$2.err" | head -3 | sed "s/^/#   $1: /"
}

# awk functions for the -J records (one JSON object a line, a row of the
# table each): median(" a b c") of a list of numbers, and get(name), a
# field of the current record, quotes removed ("" when it has none).
# shellcheck disable=SC2034 # used by the scripts that source this file
COMPARE_AWK='
function median(list,    n, v, i, j, t) {
    n = split(list, v, " ")
    if (n == 0) return ""
    for (i = 2; i <= n; i++) { t = v[i] + 0; for (j = i - 1; j >= 1 && v[j] + 0 > t; j--) v[j + 1] = v[j]; v[j + 1] = t }
    return n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
}
function get(name,    v) {
    if (!match($0, "\"" name "\":[^,}]*")) return ""
    v = substr($0, RSTART + length(name) + 3, RLENGTH - length(name) - 3)
    gsub(/"/, "", v)
    return v
}
'
