#!/bin/bash
# Allreduce across 1, 2, 3, 4, 5 and 8 real processes: every datatype and
# op, counts 0, 1, 7, n-1, n+1, 4099 and about a million (odd), in place
# and out of place, each element compared with a reference.
. "$(dirname "$0")/../lib.sh"
prog=$BUILDDIR/tests/mp/mp_allreduce
for n in 1 2 3 4 5 8; do
    # 8 ranks on 2 cores: keep the largest count but fewer op combinations.
    mode=full; [ "$n" -ge 5 ] && mode=quick; [ -n "${LOOM_TEST_QUICK:-}" ] && mode=quick
    out=$(timeout 600 "$LOOMRUN" -n "$n" --timeout 580 "$prog" $mode 2>&1)
    rc=$?
    if [ $rc -eq 0 ]; then ok "allreduce on $n ranks ($mode): $(echo "$out" | grep 'rank 0 of')"
    else bad "allreduce on $n ranks ($mode) exit $rc"; echo "$out" | tail -20; fi
done
# Several streams per peer and small chunks: the pieces of one message
# arrive over different sockets in any order.
out=$(LOOM_TCP_STREAMS=4 LOOM_CHUNK_SIZE=8K timeout 300 "$LOOMRUN" -n 3 --timeout 280 "$prog" quick 2>&1)
check "allreduce on 3 ranks, 4 streams, 8K chunks" [ $? -eq 0 ]
[ $? -eq 0 ] || echo "$out" | tail -20
# Small counts through the engine, not the arenas' slots (small.c).
out=$(LOOM_SHM_SMALL=0 timeout 300 "$LOOMRUN" -n 4 --timeout 280 "$prog" quick 2>&1)
check "allreduce on 4 ranks, LOOM_SHM_SMALL=0" [ $? -eq 0 ]
[ $? -eq 0 ] || echo "$out" | tail -20
# The shared allreduce streaming its results (LOOM_SHM_STREAM) from a
# few KiB, with arenas of several rounds: every count and op checked.
out=$(LOOM_ALGO=allreduce:shared LOOM_SHM_STREAM=4K LOOM_SHM_SIZE=256K timeout 300 \
    "$LOOMRUN" -n 3 --timeout 280 "$prog" quick 2>&1)
check "allreduce on 3 ranks, shared, streamed results" [ $? -eq 0 ]
[ $? -eq 0 ] || echo "$out" | tail -20
out=$(LOOM_TCP_STREAMS=1 timeout 300 "$LOOMRUN" -n 4 --timeout 280 "$prog" quick 2>&1)
check "allreduce on 4 ranks, 1 stream" [ $? -eq 0 ]
# Ranks that forced different algorithms with loom_comm_set_algo fail at
# once, and say so: messages of the same operation from another schedule
# (its collective and algorithm ride in the tags) are refused naming
# both, over shared memory and TCP, with messages early or late, and the
# rank that refuses tells the other.  LOOM_TIMEOUT is 30 s and each case
# must end within 15, so a timeout fails them (before the tags carried
# the schedule, ring against halving-doubling timed out, and ring
# against recursive doubling failed on the sizes alone).
for tr in shm tcp; do
    for count in 1024 1048576; do
        # Recursive doubling sends messages of another size than the
        # ring's; halving-doubling's on 2 ranks have the ring's sizes.
        other=halving_doubling
        [ $count = 1024 ] && other=recursive_doubling
        t0=$(date +%s)
        out=$(LOOM_TRANSPORT=$tr LOOM_TIMEOUT=30000 timeout 90 "$LOOMRUN" -n 2 --timeout 60 \
            "$prog" forced allreduce:ring allreduce:$other $count 2>&1)
        secs=$(($(date +%s) - t0))
        check "set_algo differing (ring, $other), $tr, $count floats: both fail in ${secs}s" \
            [ "$(grep -c '^rank [01] (allreduce:[a-z_]*): peers disagree' <<<"$out")" = 2 -a \
            "$secs" -lt 15 ]
        check "... naming both schedules" \
            grep -qE "as \(allreduce, (ring|$other)\) where this rank runs \(allreduce, (ring|$other)\): .*loom_comm_set_algo" <<<"$out"
        [ $? -eq 0 ] || echo "$out" | tail -5
    done
done
# One algorithm, different counts: the calls' checks differ (before the
# messages' sizes are compared), and both ranks name both calls
# (test_mismatch.sh tries every path).
out=$(LOOM_TIMEOUT=30000 timeout 90 "$LOOMRUN" -n 2 --timeout 60 "$prog" forced allreduce:ring \
    allreduce:ring 1024 2048 2>&1)
check "counts differing (2048, 1024): both ranks fail" \
    [ "$(grep -c '^rank [01] (allreduce:ring): peers disagree' <<<"$out")" = 2 ]
check "... naming both calls" \
    [ "$(grep -c 'rank 0 called loom_allreduce(count=2048, float32, sum), rank 1 called loom_allreduce(count=1024, float32, sum)' <<<"$out")" = 2 ]
[ $? -eq 0 ] || echo "$out" | tail -5
# A rank that never calls: the other times out (LOOM_TIMEOUT 2 s) naming
# the operation's collective and algorithm.
out=$(LOOM_TIMEOUT=2000 timeout 90 "$LOOMRUN" -n 2 --timeout 60 "$prog" forced allreduce:ring \
    skip 1024 2>&1)
check "a rank that skips the call: the other times out naming (allreduce, ring)" \
    grep -qE '^rank 0 \(allreduce:ring\): timed out.*operation [0-9]+ \(allreduce, ring\) had' <<<"$out"
[ $? -eq 0 ] || echo "$out" | tail -5
finish
