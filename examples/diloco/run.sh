#!/bin/bash
# run.sh - compare DiLoCo (uncompressed, int8, int4, fp4, and int8
# overlapped) with synchronous data-parallel training on the same compute
# budget and seed; print a table and, where gnuplot is installed, plot.
#
#   run.sh [-n RANKS] [--netns RATE] [--out DIR] [--runs LIST] [-- DILOCO_ARGS...]
#
#   -n RANKS      ranks (workers), default 4
#   --netns RATE  one rank per network namespace ("host"), each host's
#                 egress limited to RATE with tbf (e.g. 100mbit), through
#                 perf/netns_hosts.sh (needs root and iproute2); without it
#                 the ranks run on this host under loomrun
#   --out DIR     where the CSVs, logs and plot go (default diloco-out)
#   --runs LIST   comma-separated runs, each MODE[:CODEC][+ef][+overlap];
#                 default ddp,diloco,diloco:int8,diloco:int4,diloco:fp4,diloco:int8+overlap
#   DILOCO_ARGS   passed to every run (e.g. --steps 1200 --inner 100)
#
# The binaries are found through BUILDDIR (default: the build tree this
# script is run from, or the current directory), or DILOCO and LOOMRUN.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../.." && pwd)
n=4 rate= out=diloco-out
runs=ddp,diloco,diloco:int8,diloco:int4,diloco:fp4,diloco:int8+overlap
while [ $# -gt 0 ]; do
    case $1 in
    -n) n=$2; shift 2 ;;
    --netns) rate=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    --) shift; break ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "run.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done
if [ -z "${BUILDDIR:-}" ]; then
    for b in "$PWD" "$src"; do [ -x "$b/examples/diloco/diloco" ] && { BUILDDIR=$b; break; }; done
fi
DILOCO=${DILOCO:-${BUILDDIR:-.}/examples/diloco/diloco}
LOOMRUN=${LOOMRUN:-${BUILDDIR:-.}/loomrun}
[ -x "$DILOCO" ] || { echo "run.sh: $DILOCO not built (set BUILDDIR or DILOCO)" >&2; exit 2; }
mkdir -p "$out"
out=$(cd "$out" && pwd)
DILOCO=$(cd "$(dirname "$DILOCO")" && pwd)/$(basename "$DILOCO")

netns=$src/perf/netns_hosts.sh
if [ -n "$rate" ]; then
    [ "$(id -u)" -eq 0 ] || { echo "run.sh: --netns needs root" >&2; exit 2; }
    "$netns" up "$n" "$rate"
    trap '"$netns" down' EXIT
fi

launch() { # launch ARGS...: rank 0's output on stdout
    if [ -n "$rate" ]; then
        "$netns" run 1 "$DILOCO" "$@"
    else
        "$LOOMRUN" -n "$n" "$DILOCO" "$@"
    fi
}

csvs=()
printf '# %d ranks%s, diloco args: %s\n' "$n" "${rate:+, one per host, ${rate} links}" "${*:-(defaults)}"
for r in ${runs//,/ }; do
    spec=${r%%+*} flags=
    case $r in *+ef*) flags+=" --ef" ;; esac
    case $r in *+overlap*) flags+=" --overlap" ;; esac
    mode=${spec%%:*} codec=none
    [ "$spec" != "$mode" ] && codec=${spec#*:}
    name=$(printf '%s' "$r" | tr ':+' '_-')
    csv=$out/$name.csv
    echo "## $r: $mode, codec $codec$flags" >&2
    # shellcheck disable=SC2086
    if ! launch --mode "$mode" --codec "$codec" $flags --csv "$csv" --quiet "$@" >"$out/$name.log" 2>&1; then
        echo "run.sh: run $r failed:" >&2
        tail -5 "$out/$name.log" >&2
        exit 1
    fi
    csvs+=("$csv")
done

# The table: final eval loss, relative to uncompressed DiLoCo, bytes, time.
printf '%-22s %10s %9s %14s %9s %9s\n' run final_loss vs_diloco bytes_sent wall_s comm_s
base=
[ -f "$out/diloco.log" ] && base=$(sed -n 's/.*final_eval_loss=\([0-9.e+-]*\).*/\1/p' "$out/diloco.log" | tail -1)
for r in ${runs//,/ }; do
    name=$(printf '%s' "$r" | tr ':+' '_-')
    line=$(grep '^diloco: ' "$out/$name.log" | tail -1)
    get() { sed -n "s/.* $1=\([^ ]*\).*/\1/p" <<<"$line"; }
    loss=$(get final_eval_loss)
    rel=-
    [ -n "$base" ] && rel=$(awk -v a="$loss" -v b="$base" 'BEGIN { printf "%+.2f%%", 100 * (a - b) / b }')
    printf '%-22s %10s %9s %14s %9s %9s\n' "$r" "$loss" "$rel" "$(get bytes_sent)" "$(get wall_s)" "$(get comm_wait_s)"
done | tee "$out/table.txt"

if command -v gnuplot >/dev/null; then
    "$here/plot.sh" "$out/diloco.png" "${csvs[@]}" && echo "plot: $out/diloco.png"
else
    echo "gnuplot not found: no plot (the CSVs are in $out)"
fi
