#!/bin/bash
# Background collectives (mp_progress.c): several non-blocking allreduces
# in flight completed in any order, loom_wait_any / loom_wait_all, with
# and without the progress thread (LOOM_PROGRESS_THREAD); with it,
# operations complete while the caller sleeps, an idle communicator costs
# no CPU, and a rank killed during a background operation makes loom_wait
# fail on the others.
. "$(dirname "$0")/../lib.sh"
prog=$BUILDDIR/tests/mp/mp_progress
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for n in 2 4; do
    for pt in 0 1; do
        out=$(LOOM_PROGRESS_THREAD=$pt timeout 300 "$LOOMRUN" -n "$n" --timeout 280 "$prog" order 2>&1)
        rc=$?
        if [ $rc -eq 0 ]; then ok "$n ranks, progress thread $pt: ops completed in reverse order, by wait_any, shuffled test, wait_all"
        else bad "$n ranks, progress thread $pt: order (exit $rc)"; echo "$out" | tail -10; fi
    done
    # Over TCP only too (the thread sleeps on the transport's descriptor).
    out=$(LOOM_TRANSPORT=tcp LOOM_PROGRESS_THREAD=1 timeout 300 "$LOOMRUN" -n "$n" --timeout 280 "$prog" order 2>&1)
    check "$n ranks, TCP only, progress thread: order" [ $? -eq 0 ]
    [ $? -eq 0 ] || echo "$out" | tail -10
    for tr in "" tcp; do
        out=$(LOOM_TRANSPORT=$tr LOOM_PROGRESS_THREAD=1 timeout 300 "$LOOMRUN" -n "$n" --timeout 280 "$prog" sleep 2>&1)
        rc=$?
        if [ $rc -eq 0 ]; then ok "$n ranks${tr:+, $tr only}, progress thread: ops complete while the caller sleeps; $(echo "$out" | grep -o 'idle CPU.*' | head -1 | tr -d ")")"
        else bad "$n ranks${tr:+, $tr only}, progress thread: sleep (exit $rc)"; echo "$out" | tail -10; fi
    done
done
out=$(timeout 60 "$LOOMRUN" -n 1 --timeout 50 "$prog" args 2>&1)
check "loom_wait_any / loom_wait_all reject bad arguments, naming them" [ $? -eq 0 ]
[ $? -eq 0 ] || echo "$out" | tail -5
# A rank killed while a background allreduce is in flight.
for n in 2 4; do
    for pt in 1 0; do
        rm -rf "$tmp/out"
        LOOM_TIMEOUT=20000 LOOM_PROGRESS_THREAD=$pt timeout 120 "$LOOMRUN" -n "$n" --keep-going \
            --timeout 100 --output "$tmp/out" "$prog" kill 1 >/dev/null 2>&1
        good=1
        for r in $(seq 0 $((n - 1))); do
            [ "$r" -eq 1 ] && continue
            grep -q "OK kill" "$tmp/out/rank.$r.out" 2>/dev/null || {
                good=0; echo "  rank $r:"; tail -3 "$tmp/out/rank.$r.err" 2>/dev/null; }
        done
        if [ $good -eq 1 ]; then ok "kill rank 1 of $n during a background allreduce (thread $pt): loom_wait failed on every survivor"
        else bad "kill rank 1 of $n during a background allreduce (thread $pt)"; fi
    done
done
finish
