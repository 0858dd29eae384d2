#!/bin/bash
# A rank SIGKILLed in the middle of a large allreduce: every other rank
# must return an error well within the deadline (here LOOM_TIMEOUT=20 s;
# we require < 5 s, since a dead process's sockets close at once).
. "$(dirname "$0")/../lib.sh"
prog=$BUILDDIR/tests/mp/mp_kill
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# Read every survivor's report: sets good (all said OK) and worst (the
# slowest time from the kill to its error, ms).
survivors() { # survivors N VICTIM
    good=1 worst=0
    for r in $(seq 0 $(($1 - 1))); do
        [ "$r" -eq "$2" ] && continue
        line=$(cat "$tmp/out/rank.$r.out" 2>/dev/null)
        case "$line" in
        *": OK after "*) ;;
        *) good=0; echo "  rank $r: ${line:-no output}"
           # What the rank said, without the sanitizer's stack traces.
           grep -v -E '^ +#|Sanitizer|^$|leak of|^Direct|^Indirect' "$tmp/out/rank.$r.err" 2>/dev/null | head -4
           # A sanitizer's report: its summary and Loom's frames.
           grep -E 'SUMMARY|libloom|/src/|/transports/' "$tmp/out/rank.$r.err" 2>/dev/null | head -12 ;;
        esac
        ms=$(echo "$line" | sed -n 's/.*after \([0-9.]*\) ms.*/\1/p')
        [ -n "$ms" ] && worst=$(echo "$ms $worst" | awk '{print ($1>$2)?$1:$2}')
    done
}
for n in 2 4 5; do
    for victim in 1 $((n - 1)); do
        rm -f "$tmp"/stamp*; rm -rf "$tmp/out"
        LOOM_TIMEOUT=20000 timeout 120 "$LOOMRUN" -n "$n" --keep-going --timeout 100 \
            --output "$tmp/out" "$prog" "$victim" "$tmp/stamp" >/dev/null 2>&1
        survivors "$n" "$victim"
        if [ $good -eq 1 ] && awk "BEGIN{exit !($worst < 5000)}"; then
            ok "kill rank $victim of $n mid-allreduce: all survivors failed cleanly, slowest after $worst ms"
        else
            bad "kill rank $victim of $n mid-allreduce (slowest $worst ms)"
        fi
    done
done
# Killed late in a 256 MiB in-place allreduce (shared memory, rounds of
# half an arena): the survivors have written many rounds' results into
# their buffers, and must put back exactly those ranges (saves_input),
# from saves written with cached stores and with streaming ones
# (LOOM_SHM_STREAM_SAVES; the default measures, and this non-blocking
# call would take cached).
# With the buffers in loom_mem_alloc windows, the survivors' reductions
# and copy-outs saved what they overwrote as they went.
for ss in 0 1; do
    for win in "" window; do
        what="a 256 MiB in-place allreduce${win:+ in windows} (streamed saves: $ss)"
        for n in 2 4; do
            rm -f "$tmp"/stamp*; rm -rf "$tmp/out"
            # shellcheck disable=SC2086 # $win: the word, or nothing
            LOOM_SHM_STREAM_SAVES=$ss LOOM_TIMEOUT=20000 timeout 120 "$LOOMRUN" -n "$n" \
                --keep-going --timeout 100 --output "$tmp/out" "$prog" 1 "$tmp/stamp" \
                $((64 << 20)) kill allreduce 25 $win >/dev/null 2>&1
            survivors "$n" 1
            if [ $good -eq 1 ] && awk "BEGIN{exit !($worst < 5000)}"; then
                ok "kill rank 1 of $n late in $what: buffers restored, slowest after $worst ms"
            else
                bad "kill rank 1 of $n late in $what (slowest $worst ms)"
            fi
        done
    done
done
# Out of place from windows, on one host the reducers write their slices
# straight into the peers' output windows: once a survivor's call has
# failed, nothing may write into its output any more (it checks for
# 300 ms after the error).
for n in 3 4; do
    rm -f "$tmp"/stamp*; rm -rf "$tmp/out"
    LOOM_TIMEOUT=20000 timeout 120 "$LOOMRUN" -n "$n" --keep-going --timeout 100 \
        --output "$tmp/out" "$prog" $((n - 1)) "$tmp/stamp" $((64 << 20)) kill allreduce 5 \
        window-oop >/dev/null 2>&1
    survivors "$n" $((n - 1))
    if [ $good -eq 1 ] && awk "BEGIN{exit !($worst < 5000)}"; then
        ok "kill rank $((n - 1)) of $n in a 256 MiB allreduce between windows: every survivor failed, and its output stayed as it left it, slowest after $worst ms"
    else
        bad "kill rank $((n - 1)) of $n in an allreduce between windows (slowest $worst ms)"
    fi
done
# An in-place all-to-all killed mid-way: its input is restored from the
# staged copy in scratch.
for n in 3 4; do
    rm -f "$tmp"/stamp*; rm -rf "$tmp/out"
    LOOM_TIMEOUT=20000 timeout 120 "$LOOMRUN" -n "$n" --keep-going --timeout 100 \
        --output "$tmp/out" "$prog" 1 "$tmp/stamp" $((16 << 20)) kill alltoall >/dev/null 2>&1
    survivors "$n" 1
    if [ $good -eq 1 ] && awk "BEGIN{exit !($worst < 5000)}"; then
        ok "kill rank 1 of $n mid-alltoall (in place): each survivor failed with its buffer restored or had finished its exchanges, slowest after $worst ms"
    else
        bad "kill rank 1 of $n mid-alltoall (slowest $worst ms)"
    fi
done
# A silent rank (SIGSTOPped: alive, sockets open, says nothing): every
# other rank must fail once LOOM_TIMEOUT (3 s here) passes, never hang.
for n in 2 4; do
    rm -f "$tmp"/stamp*; rm -rf "$tmp/out"
    LOOM_TIMEOUT=3000 timeout 120 "$LOOMRUN" -n "$n" --keep-going --timeout 100 \
        --output "$tmp/out" "$prog" 1 "$tmp/stamp" $((4 << 20)) stop >/dev/null 2>&1
    survivors "$n" 1
    if [ $good -eq 1 ] && awk "BEGIN{exit !($worst < 6000)}"; then
        ok "SIGSTOP rank 1 of $n mid-allreduce: all survivors failed by the 3 s deadline, slowest after $worst ms"
    else
        bad "SIGSTOP rank 1 of $n mid-allreduce (slowest $worst ms)"
    fi
done
# Small allreduces on one host go through the arenas' slots, where a
# survivor waits on the victim's slot: killed, or stopped (3 s deadline).
for n in 2 4; do
    for how in kill stop; do
        rm -f "$tmp"/stamp*; rm -rf "$tmp/out"
        to=20000 limit=5000
        [ $how = stop ] && to=3000 limit=6000
        LOOM_TIMEOUT=$to timeout 120 "$LOOMRUN" -n "$n" --keep-going --timeout 100 \
            --output "$tmp/out" "$prog" $((n - 1)) "$tmp/stamp" 2 $how small >/dev/null 2>&1
        survivors "$n" $((n - 1))
        if [ $good -eq 1 ] && awk "BEGIN{exit !($worst < $limit)}"; then
            ok "$how rank $((n - 1)) of $n between small allreduces: all survivors failed with their buffers untouched, slowest after $worst ms"
        else
            bad "$how rank $((n - 1)) of $n between small allreduces (slowest $worst ms)"
        fi
    done
done
finish
