#!/bin/bash
# compare_mpi.sh - Loom against Open MPI in the same run, with the same
# benchmark harness (perf/peers/backend_mpi.c), alternating the two so
# that drift on a shared machine hits both alike; prints each run's busbw
# and the medians.
#
#   perf/compare_mpi.sh [-n RANKS] [-r REPEATS] [-m "MPIRUN OPTIONS"] [-- PERF FLAGS]
#
# Run from a build directory (it uses ./loomrun and ./all_reduce_perf).
# Default: 4 ranks, 5 repeats, Open MPI over TCP only (--mca btl tcp,self),
# 64 MiB float sum, out of place and in place.
set -eu
ranks=4 reps=5 mopts="--mca btl tcp,self"
while getopts "n:r:m:" o; do
    case $o in n) ranks=$OPTARG ;; r) reps=$OPTARG ;; m) mopts=$OPTARG ;; *) exit 2 ;; esac
done
shift $((OPTIND - 1))
[ "${1:-}" = -- ] && shift
flags=("$@")
[ ${#flags[@]} -eq 0 ] && flags=(-b 64M -e 64M -c 1 -n 10 -w 3)
src=$(cd "$(dirname "$0")/.." && pwd)
mpi=${MPI_PERF:-$(mktemp -d)/mpi_all_reduce_perf}
if [ ! -x "$mpi" ]; then
    mpicc -std=c11 -O2 -D_GNU_SOURCE -o "$mpi" "$src/perf/all_reduce_perf.c" \
        "$src/perf/perf_common.c" "$src/perf/peers/backend_mpi.c" -lm -pthread
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Last data row: columns 8 and 12 are the out-of-place and in-place busbw.
row() { grep -v '^#' | awk 'NF >= 13 {o=$8; i=$12} END {print o, i}'; }
med() { sort -g | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
lo=() li=() mo=() mi=()
for r in $(seq "$reps"); do
    read -r a b < <(./loomrun -n "$ranks" ./all_reduce_perf "${flags[@]}" | row)
    read -r c d < <(mpirun $mopts --oversubscribe -np "$ranks" "$mpi" "${flags[@]}" 2>/dev/null | row)
    echo "run $r: loom busbw $a (out of place) $b (in place)   open mpi $c $d"
    lo+=("$a") li+=("$b") mo+=("$c") mi+=("$d")
done
LO=$(printf '%s\n' "${lo[@]}" | med) LI=$(printf '%s\n' "${li[@]}" | med)
MO=$(printf '%s\n' "${mo[@]}" | med) MI=$(printf '%s\n' "${mi[@]}" | med)
echo "median busbw GB/s: loom $LO / $LI, open mpi $MO / $MI (out of place / in place)"
awk -v a="$LO" -v b="$LI" -v c="$MO" -v d="$MI" \
    'BEGIN {printf "ratio loom/open mpi: %.2f out of place, %.2f in place\n", a/c, b/d}'
