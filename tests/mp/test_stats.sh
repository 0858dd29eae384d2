#!/bin/bash
# Straggler telemetry (loom_comm_get_stats(3)) on 4 ranks over shared
# memory and TCP: one rank sleeps 20 ms before each of 20 allreduces;
# every rank that receives from it first thing in an operation must show
# it the latest peer (>= 15 ms on average, the others < 5 ms), and
# LOOM_DEBUG=info must name it (and no other rank) as the straggler.
# Then the mistakes (NULL count, a bad size, room for fewer peers than
# there are, reset) and LOOM_STATS=0.  Last, where root and network
# namespaces are at hand, one rank's link limited by tbf is named slow.
. "$(dirname "$0")/../lib.sh"
prog=$BUILDDIR/tests/mp/mp_stats
for tr in shm tcp; do
    for count in 16 1024; do
        out=$(LOOM_TRANSPORT=$tr LOOM_DEBUG=info timeout 120 "$LOOMRUN" -n 4 --timeout 100 \
            "$prog" slow 3 20 20 $count 2>&1)
        rc=$?
        saw=$(grep -c '^rank [012]: saw 3 late by' <<<"$out")
        named=$(grep -c 'straggler: rank 3 was the last' <<<"$out")
        wrong=$(grep 'straggler: rank [0-9]* was' <<<"$out" | grep -vc 'straggler: rank 3 ')
        # Over the slots (shm, small) every rank sees every other; over
        # messages, those that receive from rank 3 before anything else.
        want=1; [ $tr = shm ] && want=3
        check "$tr, $count floats, rank 3 sleeps 20 ms a call: $saw ranks saw it late" \
            [ $rc -eq 0 -a "$saw" -ge $want ]
        [ $rc -eq 0 ] || echo "$out" | grep -v INFO | tail -20
        check "... LOOM_DEBUG=info named it on $named ranks, another rank on $wrong" \
            [ "$named" -ge $want -a "$wrong" -eq 0 ]
        grep -m1 'straggler:' <<<"$out" | sed 's/^/     /'
        grep '^rank [012]: saw' <<<"$out" | sed 's/^/     /'
    done
done
for tr in shm tcp; do
    out=$(LOOM_TRANSPORT=$tr timeout 120 "$LOOMRUN" -n 4 --timeout 100 "$prog" api 2>&1)
    check "$tr: bad arguments refused, capacity, reset" [ $? -eq 0 ]
    [ $? -eq 0 ] || echo "$out" | tail -10
done
out=$(LOOM_STATS=0 timeout 120 "$LOOMRUN" -n 3 --timeout 100 "$prog" off 2>&1)
check "LOOM_STATS=0: loom_comm_get_stats says it is off" [ $? -eq 0 ]
[ $? -eq 0 ] || echo "$out" | tail -10
finish
