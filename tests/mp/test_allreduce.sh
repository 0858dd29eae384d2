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
# Ranks that forced different algorithms with loom_comm_set_algo fail,
# and say so: messages of another size are refused at once with a hint
# at the call, and a schedule that waits for messages that never come
# times out naming its collective and algorithm.  (LOOM_TIMEOUT 2 s;
# a hang would meet the launcher's 60.)
out=$(timeout 90 "$LOOMRUN" -n 2 --timeout 60 "$prog" forced allreduce:ring \
    allreduce:recursive_doubling 1024 2>&1)
check "set_algo differing (ring, recursive doubling): both ranks fail" \
    [ "$(grep -c '^rank [01] (allreduce:[a-z_]*): peers disagree' <<<"$out")" = 2 ]
check "... the one refusing the message names loom_comm_set_algo" \
    grep -q 'where this rank expects .*loom_comm_set_algo' <<<"$out"
[ $? -eq 0 ] || echo "$out" | tail -5
out=$(LOOM_TIMEOUT=2000 timeout 90 "$LOOMRUN" -n 2 --timeout 60 "$prog" forced allreduce:ring \
    allreduce:halving_doubling 1024 2>&1)
check "set_algo differing (ring, halving-doubling): both ranks fail" \
    [ "$(grep -c '^rank [01] (allreduce:[a-z_]*): timed out' <<<"$out")" = 2 ]
check "... a timed-out rank names the operation's algorithm" \
    grep -qE '^rank 0 \(allreduce:ring\).*operation [0-9]+ \(allreduce, ring\) had|^rank 1 \(allreduce:halving_doubling\).*operation [0-9]+ \(allreduce, halving_doubling\) had' <<<"$out"
[ $? -eq 0 ] || echo "$out" | tail -5
finish
