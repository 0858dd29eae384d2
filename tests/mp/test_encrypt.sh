#!/bin/bash
# LOOM_ENCRYPT=1 (transports/seal.c, tcp_data.c): allreduces over TCP alone,
# sealed, every element checked; a rank that seals against one that does
# not is refused naming LOOM_ENCRYPT; and a byte changed on the wire
# (flip_byte.c, a man in the middle in the sender's process) fails the
# job with the authentication error instead of delivering wrong data,
# on a data stream and on the control plane.
. "$(dirname "$0")/../lib.sh"
prog=$BUILDDIR/tests/mp/mp_allreduce
for n in 2 3; do
    out=$(LOOM_ENCRYPT=1 LOOM_TRANSPORT=tcp timeout 300 "$LOOMRUN" -n $n --timeout 280 \
        "$prog" quick 2>&1)
    rc=$?
    check "sealed allreduce over tcp on $n ranks: every element checked" [ $rc -eq 0 ]
    [ $rc -eq 0 ] || echo "$out" | tail -20
done
# Pieces of one message over 4 sealed streams, in any order, and chunks
# that are not a whole number of records.
out=$(LOOM_ENCRYPT=1 LOOM_TRANSPORT=tcp LOOM_TCP_STREAMS=4 LOOM_CHUNK_SIZE=72K timeout 300 \
    "$LOOMRUN" -n 3 --timeout 280 "$prog" quick 2>&1)
rc=$?
check "sealed allreduce on 3 ranks, 4 streams, 72K chunks" [ $rc -eq 0 ]
[ $rc -eq 0 ] || echo "$out" | tail -20

# Rank 1 seals, rank 0 does not: refused at the rendezvous, named.
wrap=$(mktemp)
printf '#!/bin/sh\n[ "$LOOM_RANK" = 1 ] && export LOOM_ENCRYPT=1\nexec "$@"\n' >"$wrap"
chmod +x "$wrap"
out=$(LOOM_TRANSPORT=tcp LOOM_TIMEOUT=20000 timeout 60 "$LOOMRUN" -n 2 --timeout 50 \
    "$wrap" "$prog" quick 2>&1)
rc=$?
rm -f "$wrap"
check "LOOM_ENCRYPT differing between ranks: refused (exit $rc)" [ $rc -ne 0 ]
check "... naming LOOM_ENCRYPT" grep -q "LOOM_ENCRYPT differs between ranks" <<<"$out"
[ $? -eq 0 ] || echo "$out" | tail -5

# A byte of rank 1's third bulk write changed on its way (LOOM_PROBE=0:
# the first bulk writes are then the allreduces' own): sealed, rank 0
# fails the job with the authentication error, and no element is taken
# as it came; in the clear, the same change is a wrong element that only
# mp_allreduce's own check finds (which shows the change lands in data).
flip=$BUILDDIR/tests/mp/.libs/flip_byte.so
tamper() { # ENCRYPT
    LOOM_PROBE=0 LOOM_DEBUG=warn LOOM_ENCRYPT=$1 LOOM_TRANSPORT=tcp LOOM_TIMEOUT=20000 \
        LD_PRELOAD="$flip${LD_PRELOAD:+:$LD_PRELOAD}" FLIP_RANK=1 FLIP_AFTER=3 \
        timeout 120 "$LOOMRUN" -n 2 --timeout 100 "$prog" quick 2>&1
}
if [ -f "$flip" ]; then
    t0=$(date +%s)
    out=$(tamper 1)
    rc=$?
    secs=$(($(date +%s) - t0))
    check "a byte changed on the wire, sealed: the job fails (exit $rc, ${secs}s)" \
        [ $rc -ne 0 -a $rc -ne 124 ]
    check "... with the authentication error naming the sender" \
        grep -q "from rank 1 on stream [0-9]* failed authentication: tampered or replayed" <<<"$out"
    [ $? -eq 0 ] || echo "$out" | tail -20
    check "... and no wrong element delivered" bash -c '! grep -q " wrong, first at" <<<"$1"' _ "$out"
    out=$(tamper 0)
    check "the same change in the clear: a wrong element, found only by the test's check" \
        grep -q " wrong, first at" <<<"$out"
    # The control plane's frames are sealed too: a sealed heartbeat is
    # 48 bytes (32 and its tag), sent every 20 ms; the tenth 48-byte
    # write of rank 1 changed.
    out=$(LOOM_HEARTBEAT_MS=20 FLIP_MIN=48 FLIP_MAX=48 FLIP_AFTER=10 FLIP_AT=10 tamper 1)
    rc=$?
    check "a control frame changed on the wire: the job fails (exit $rc)" [ $rc -ne 0 -a $rc -ne 124 ]
    check "... rank 0 names rank 1 and the authentication error" \
        grep -q "rank 1 failed: a record on its control connection failed authentication: tampered or replayed" <<<"$out"
    [ $? -eq 0 ] || echo "$out" | tail -20
else
    echo "skip - bytes changed on the wire: no $flip (sanitizers or no shared libraries)"
fi
finish
