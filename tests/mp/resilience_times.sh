#!/bin/bash
# resilience_times.sh - the figures of the failure model, measured: time
# from a rank's SIGKILL or SIGSTOP to the error on every survivor, time to
# shrink, time to admit a joiner, and the state sync to a newcomer.  Not
# part of "make check" (it takes minutes); run from a build directory
# after "make check TESTS=" has built the test programs.
#
#   tests/mp/resilience_times.sh [TRIALS] [SYNC_MIB]
#
# TRIALS (default 20) runs per rank count (4 and 8) and mode (kill,
# stop); the victim is drawn at random among the ranks, rank 0 included.
# Each line gives the median and maximum over the trials of the slowest
# survivor's time (ms), and over every survivor of every trial.  The join
# rows come from mp_join (grow on 4 and 8 ranks, TRIALS/4 runs), the sync
# row from one joiner receiving SYNC_MIB (default 1024) from 4 donors,
# beside sendrecv_perf's rate for the same size on this host, measured in
# the same run.
#
# The ranks take LOOM_HEARTBEAT_MS from the environment (default 500).
# RT_RANKS (default "4 8"), RT_MODES ("kill stop") and RT_PARTS ("detect
# join sync") choose what runs.  The load of the host (uptime) is printed
# before and after, since on a shared machine it moves the figures.
set -u
trials=${1:-20} mib=${2:-1024}
ranks=${RT_RANKS:-4 8} modes=${RT_MODES:-kill stop} parts=${RT_PARTS:-detect join sync}
part() { [[ " $parts " == *" $1 "* ]]; }
echo "heartbeat ${LOOM_HEARTBEAT_MS:-500 (default)} ms; $trials trials; load: $(uptime | sed 's/.*load/load/')"
: "${BUILDDIR:=$(pwd)}"
: "${LOOMRUN:=$BUILDDIR/loomrun}"
export LOOM_DEBUG=${LOOM_DEBUG:-none}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
stats() { # stdin: numbers; prints "median M max X (n N)"
    sort -n | awk '{v[NR] = $1} END {
        if (!NR) { print "no samples"; exit }
        m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
        printf "median %.1f max %.1f (n %d)\n", m, v[NR], NR }'
}
part detect && for n in $ranks; do
    for mode in $modes; do
        : >"$tmp/det" && : >"$tmp/shr" && : >"$tmp/each"
        for _ in $(seq "$trials"); do
            v=$((RANDOM % n))
            rm -rf "$tmp/out" "$tmp/stamp"
            LOOM_TIMEOUT=60000 timeout 150 "$LOOMRUN" -n "$n" --keep-going --timeout 120 \
                --output "$tmp/out" "$BUILDDIR/tests/mp/mp_fault" "$mode" "$v" "$tmp/stamp" \
                >/dev/null 2>&1
            det=0 shr=0 good=1
            for r in $(seq 0 $((n - 1))); do
                [ "$r" = "$v" ] && continue
                line=$(cat "$tmp/out/rank.$r.out" 2>/dev/null)
                case "$line" in OK*) ;; *) good=0 ;; esac
                d=$(sed -n 's/.*detect_ms=\([0-9.]*\).*/\1/p' <<<"$line")
                s=$(sed -n 's/.*shrink_ms=\([0-9.]*\).*/\1/p' <<<"$line")
                [ -n "$d" ] && echo "$d" >>"$tmp/each"
                det=$(awk -v a="${d:-0}" -v b="$det" 'BEGIN {print (a > b) ? a : b}')
                shr=$(awk -v a="${s:-0}" -v b="$shr" 'BEGIN {print (a > b) ? a : b}')
            done
            if [ $good = 1 ]; then
                echo "$det" >>"$tmp/det"; echo "$shr" >>"$tmp/shr"
            else
                echo "  $mode on $n ranks, victim $v: a survivor did not report OK" >&2
            fi
        done
        echo "$n ranks, $mode -> error on every survivor: $(stats <"$tmp/det")"
        echo "$n ranks, $mode -> error on each survivor: $(stats <"$tmp/each")"
        echo "$n ranks, $mode -> shrink done on every survivor: $(stats <"$tmp/shr")"
    done
done
part join && for n in $ranks; do
    : >"$tmp/grow" && : >"$tmp/join"
    for _ in $(seq $(((trials + 3) / 4))); do
        rm -rf "$tmp/out" "$tmp/j"
        timeout 150 "$LOOMRUN" -n "$n" --keep-going --timeout 120 --output "$tmp/out" \
            "$BUILDDIR/tests/mp/mp_join" grow "$tmp/j" 4 >/dev/null 2>&1
        cat "$tmp"/out/rank.*.out 2>/dev/null | sed -n 's/.*grow_ms=\([0-9.]*\).*/\1/p' |
            sort -n | tail -1 >>"$tmp/grow"
        sed -n 's/^OK joiner join_ms=\([0-9.]*\).*/\1/p' "$tmp/j" 2>/dev/null >>"$tmp/join"
    done
    echo "$n ranks, loom_comm_grow admitting one joiner (slowest member): $(stats <"$tmp/grow")"
    echo "$n ranks, joiner from connect to admitted: $(stats <"$tmp/join")"
done
if ! part sync; then
    echo "load: $(uptime | sed 's/.*load/load/')"
    exit 0
fi
: >"$tmp/sync"
for _ in 1 2 3; do
    rm -rf "$tmp/out" "$tmp/j"
    timeout 300 "$LOOMRUN" -n 4 --keep-going --timeout 280 --output "$tmp/out" \
        "$BUILDDIR/tests/mp/mp_join" grow "$tmp/j" "$mib" >/dev/null 2>&1
    sed -n 's/^OK joiner .*sync_ms=\([0-9.]*\).*/\1/p' "$tmp/j" 2>/dev/null >>"$tmp/sync"
done
echo "state sync of $mib MiB to one newcomer from 4 donors, ms: $(stats <"$tmp/sync")"
ms=$(sort -n "$tmp/sync" | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}')
[ -n "$ms" ] && awk -v b=$((mib << 20)) -v t="$ms" \
    'BEGIN {printf "  = %.2f GB/s of state received\n", b / t / 1e6}'
"$LOOMRUN" -n 2 "$BUILDDIR/sendrecv_perf" -b "${mib}M" -e "${mib}M" -n 3 -w 1 -c 0 2>/dev/null |
    awk '!/^#/ && NF >= 8 {printf "  sendrecv_perf %s B on this host, same run: %s GB/s\n", $1, $7}'
echo "load: $(uptime | sed 's/.*load/load/')"
